"""Finding and loading benchmarks: ``get_benchmark``, ``select_benchmarks`` (a suite's default
selection or names), ``load_tasks``. The entries are ``benchmarks.base.BENCHMARKS``, one
``Benchmark`` per benchmark, added by the suites with ``register(...)``.

A benchmark knows its suite, where it lives on the Hugging Face hub, which file(s) hold it under a
local data dir, how many rows it should have, and how one record becomes a `Task`. Loading prefers
the local data dir (`--data-dir` / `DRMAS_DATA_DIR`), then the hub (via `datasets`); with neither
available it raises one `UserError` that names the benchmark and both fixes.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from drmas_bench.benchmarks.base import (  # noqa: F401  (the definitions, re-exported: callers import them from here)
    BENCHMARKS,
    SPLITS,
    Benchmark,
    HubSource,
    answer_text,
    first_field,
    record_id,
    register,
)
from drmas_bench.suites.discovery import discover
from drmas_bench.suites.registry import get_suite, suite_names
from drmas_bench.types import Task, UserError

ENV_DATA_DIR = "DRMAS_DATA_DIR"


def _benchmarks() -> list[Benchmark]:
    """Every registered benchmark, suite by suite (in name order), each suite's in its registration order."""
    names = suite_names()
    return sorted(BENCHMARKS.values(), key=lambda b: names.index(b.suite))


def known_names() -> list[str]:
    return [b.name for b in _benchmarks()]


def get_benchmark(name: str) -> Benchmark:
    """The benchmark ``name``; an unknown name is one UserError listing the known ones."""
    discover()
    if name not in BENCHMARKS:
        raise UserError(f"unknown benchmark {name!r}; known: {', '.join(known_names())}")
    return BENCHMARKS.get(name)


def benchmarks_of_suite(suite: str, split: str = "test") -> list[Benchmark]:
    """The suite's evaluation benchmarks (``split="test"``) or its training sets (``"train"``)."""
    get_suite(suite)
    return [b for b in _benchmarks() if b.suite == suite and b.split == split]


def select_benchmarks(suite: str | None, names: str | list[str] | None) -> list[Benchmark]:
    """`--suite S [--benchmarks a,b]` -> the chosen benchmarks (never empty)."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
        if not names:
            raise UserError("the benchmark selection is empty (--benchmarks names nothing)")
    if names:
        chosen = [get_benchmark(n) for n in names]
        if suite:
            wrong = [b.name for b in chosen if b.suite != suite]
            if wrong:
                raise UserError(f"benchmarks {', '.join(wrong)} are not in suite {suite!r}")
    elif suite:
        chosen = benchmarks_of_suite(suite)
    else:
        raise UserError(f"choose a --suite ({', '.join(suite_names())}) or --benchmarks")
    if not chosen:
        raise UserError("the benchmark selection is empty")
    return chosen


# ----------------------------------------------------------------------------------------- loading


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """`--data-dir` if given, else `$DRMAS_DATA_DIR`, else None (hub only)."""
    d = data_dir or os.environ.get(ENV_DATA_DIR) or None
    if d is None:
        return None
    p = Path(d).expanduser()
    if not p.is_dir():
        raise UserError(f"data dir {p} does not exist (from {'--data-dir' if data_dir else ENV_DATA_DIR})")
    return p


def local_file(b: Benchmark, data_dir: Path | None) -> Path | None:
    if data_dir is None:
        return None
    for rel in b.files:
        p = data_dir / rel
        if p.is_file():
            return p
    return None


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each non-empty line; a malformed line names file and line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: malformed JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            yield lineno, rec


def iter_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number from 1, record) of a Parquet file (e.g. a hub dataset's ``train.parquet`` saved
    under the data dir), read in batches; nested columns become dicts and lists."""
    try:
        import pyarrow.parquet as pq  # lazy: comes with `datasets`
    except ImportError:
        raise UserError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), or convert it to .jsonl") from None
    try:
        f = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - any pyarrow failure means "not a readable parquet file"
        raise UserError(f"{path}: not a readable Parquet file ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    row = 0
    for batch in f.iter_batches(batch_size=4096):
        for rec in batch.to_pylist():
            row += 1
            yield row, rec


def iter_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line or row number, record) of a local benchmark file: ``.jsonl`` or ``.parquet``."""
    return iter_parquet(path) if path.suffix == ".parquet" else iter_jsonl(path)


def _dedupe_key(t: Task) -> tuple[str, tuple[str, ...]]:
    return t.question, tuple(t.answers)


def _to_tasks(b: Benchmark, records: Iterator[tuple[Any, dict[str, Any]]], where: Callable[[Any], str],
              limit: int | None, dedupe: bool = False) -> list[Task]:
    """Records -> Tasks (up to ``limit``; ``dedupe`` drops repeats); a bad record is one UserError
    naming ``where(position)``. So is a task id seen before (naming both places): an evaluation keeps
    results per (benchmark, task id) and the trainer groups a prompt's samples by task id (GRPO), so
    two questions under one id would be merged into one. (The reference's NQ + HotpotQA mix repeats
    ids across its two sources; ``benchmarks.loaders.qa_task`` prefixes them with the source.)"""
    tasks: list[Task] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    first_at: dict[str, Any] = {}
    for i, (pos, rec) in enumerate(records):
        if limit is not None and len(tasks) >= limit:
            break
        try:
            t = b.to_task(rec, i, b.name)
        except (KeyError, ValueError, TypeError, AttributeError, IndexError) as e:
            raise UserError(f"{where(pos)}: cannot read a {b.name} record: {e!r}") from None
        if dedupe:
            key = _dedupe_key(t)
            if key in seen:
                continue
            seen.add(key)
        if t.id in first_at:
            why = " (their samples would merge into one GRPO group)" if b.split == "train" else ""
            raise UserError(f"{where(pos)}: duplicate ids in {b.name}: {t.id!r} is already at {where(first_at[t.id])}; "
                            f"task ids must be unique within a {b.kind}{why}")
        first_at[t.id] = pos
        tasks.append(t)
    return tasks


def _tasks_from_file(b: Benchmark, path: Path, limit: int | None) -> list[Task]:
    sep = " row " if path.suffix == ".parquet" else ":"
    return _to_tasks(b, iter_records(path), lambda pos: f"{path}{sep}{pos}", limit)


def _hub_offline() -> bool:
    return any(os.environ.get(v, "0") not in ("", "0", "false", "False") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


HUB_PROBE_TIMEOUT_S = 3.0


@lru_cache(maxsize=None)
def hub_unreachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the Hugging Face hub cannot be reached (None when it answers), from one HEAD request of
    ``$HF_ENDPOINT`` with a short timeout and no retries. `datasets` alone retries for ~25 s on a
    machine without network before it gives up; this probe makes that case a prompt error. Any HTTP
    answer counts as reachable (proxies from the environment are honoured); asked once per process."""
    import httpx

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    try:
        httpx.head(endpoint, timeout=timeout_s)
    except httpx.HTTPError as e:
        return f"{endpoint} is unreachable ({type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else 'no answer'})"
    return None


def _missing_error(b: Benchmark, data_dir: Path | None, why: str) -> UserError:
    where = f"{data_dir}/{b.files[0]}" if data_dir else f"<data dir>/{b.files[0]}"
    if b.sampled is not None:  # made here from other benchmarks' rows, never on the hub
        sources = ", ".join(src for src, _, _ in b.sampled.parts)
        return UserError(f"{b.kind} {b.name}: no local copy ({where} not found); build it from {sources} with "
                         f"`drmas-bench data prepare --sampled --data-dir DIR`, or put the reference's own "
                         f"test_sampled.parquet there")
    hub = b.hub.describe() if b.hub else "(no hub source)"
    return UserError(
        f"{b.kind} {b.name}: no local copy ({where} not found) and the hub is unavailable ({why}); "
        f"fix: pass --data-dir / set {ENV_DATA_DIR} to a folder holding {b.files[0]}, "
        f"or allow network access to load {hub}"
    )


def _tasks_from_hub(b: Benchmark, data_dir: Path | None, limit: int | None) -> list[Task]:
    if b.hub is None:
        raise _missing_error(b, data_dir, "no hub source")
    if _hub_offline():
        raise _missing_error(b, data_dir, "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set")
    unreachable = hub_unreachable()
    if unreachable:
        raise _missing_error(b, data_dir, unreachable)
    try:
        import datasets  # lazy: heavy
    except ImportError:
        raise _missing_error(b, data_dir, "the `datasets` package is not installed") from None
    try:
        ds = datasets.load_dataset(b.hub.path, b.hub.config, split=b.hub.split)
    except Exception as e:  # network, auth, missing split: all mean "not from the hub"
        raise _missing_error(b, data_dir, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}") from None
    h = b.hub
    rows = ((i, dict(r)) for i, r in enumerate(ds) if not h.filter_field or r.get(h.filter_field) == h.filter_value)
    return _to_tasks(b, rows, lambda pos: f"{h.describe()} row {pos}", limit, dedupe=h.dedupe)


def load_tasks(name: str | Benchmark, data_dir: str | os.PathLike | None = None, limit: int | None = None) -> list[Task]:
    """All (or the first `limit`) tasks of a benchmark: built-in, local file, or hub, in that order."""
    b = name if isinstance(name, Benchmark) else get_benchmark(name)
    if b.generate is not None:
        tasks = b.generate()
        return tasks[:limit] if limit is not None else tasks
    d = resolve_data_dir(data_dir)
    path = local_file(b, d)
    if path is not None:
        return _tasks_from_file(b, path, limit)
    return _tasks_from_hub(b, d, limit)


def source_of(b: Benchmark, data_dir: Path | None) -> tuple[str, str]:
    """(source description, partial note or '') for `data list` / summaries."""
    if b.generate is not None:
        return "built-in (seeded)", ""
    path = local_file(b, data_dir)
    if path is not None:
        rel = str(path.relative_to(data_dir)) if data_dir else str(path)
        return f"local: {rel}", b.partial_files.get(rel, "")
    return (f"hub: {b.hub.describe()}" if b.hub else "missing"), ""


# ------------------------------------------------------------------------------- record helpers
