"""Reading a run's ``samples.jsonl`` and choosing what it reports (the store that writes it:
``run_dir.RunDir``; the format: docs/eval.md).

- ``read_samples`` (the one reader: the last copy of a (benchmark, task id, sample index) wins, a
  line cut off by a kill is skipped, any other unreadable line is one error naming
  ``drmas-bench runs repair``), ``parse_sample_line`` (the one test of "readable"), ``sample_key``;
- ``select_records`` / ``selection_test``: the samples of the latest command's selection (its
  benchmarks, its first ``limit`` questions, sample indices below its ``n``), the one selection of
  the summary, the leaderboard and the cost tables; ``selection_of``, what it depends on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable

from drmas_bench.types import UserError

SAMPLES = "samples.jsonl"
QUARANTINE = "samples.jsonl.quarantine"  # unreadable lines moved aside by `drmas-bench runs repair`


def sample_key(rec: dict[str, Any]) -> tuple[str, str, int]:
    """A record's (benchmark, task id, sample index): what a resumed run skips and a repeat replaces."""
    return str(rec["task"]["benchmark"]), str(rec["task"]["id"]), int(rec["sample_idx"])


def repair_hint(run: str | os.PathLike) -> str:
    """What every error about an unreadable samples.jsonl line offers: the command that keeps the good lines."""
    return f"run `drmas-bench runs repair {run}` to move unreadable lines aside (every good line is kept)"


def parse_sample_line(raw: bytes) -> dict[str, Any] | None:
    """One samples.jsonl line as a trajectory record, or None when it is not one (the single test of
    "readable" shared by the readers and ``repair_samples``)."""
    try:
        rec = json.loads(raw.decode("utf-8"))
        sample_key(rec)
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError):
        return None
    turns = rec.get("turns")
    if not isinstance(turns, list) or not all(isinstance(t, dict) and isinstance(t.get("completion"), dict) for t in turns):
        return None  # the readers walk every turn's completion (tokens, cost, latency)
    return rec


def numbered_samples(path: str | os.PathLike) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every line of a samples.jsonl, in file order. A cut-off last line
    (no newline after it: a run killed while appending) is skipped; any other unreadable line is a
    UserError naming file, line and the repair command."""
    p = Path(path)
    data = p.read_bytes()
    lines = data.split(b"\n")
    out = []
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        rec = parse_sample_line(raw)
        if rec is None:
            if lineno == len(lines):  # no newline after it: cut off by a kill mid-append
                continue
            raise UserError(f"{p}:{lineno}: not a trajectory record (corrupt line); {repair_hint(p.parent)}")
        out.append((lineno, rec))
    return out


def read_samples(path: str | os.PathLike, missing_ok: bool = False) -> list[dict[str, Any]]:
    """Every trajectory record of a samples.jsonl, the one reader (run store, reports, summaries).

    The last copy of a repeated (benchmark, task id, sample index) wins, as appends replace. A cut-off
    last line (a run killed while appending) is ignored; any other bad line is a UserError naming
    file, line and ``drmas-bench runs repair``. A missing file: [] with `missing_ok`, else a UserError."""
    p = Path(path)
    if not p.is_file():
        if missing_ok:
            return []
        raise UserError(f"{p} not found: not a finished or started run directory")
    by_key: dict[tuple, dict[str, Any]] = {}
    for _, rec in numbered_samples(p):
        by_key[sample_key(rec)] = rec
    return list(by_key.values())


def selection_test(config: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
    """Whether a record is in ``config``'s selection (``select_records``), as a function of the record."""
    benches = {str(b) for b in config.get("benchmarks") or []}
    n = int(config.get("n") or 0)
    chosen = config.get("question_ids")
    ids = {str(b): {str(i) for i in v} for b, v in chosen.items()} if isinstance(chosen, dict) else {}

    def selected(r: dict[str, Any]) -> bool:
        b = str(r["task"]["benchmark"])
        if benches and b not in benches:
            return False
        if n > 0 and int(r["sample_idx"]) >= n:
            return False
        return not (b in ids and str(r["task"]["id"]) not in ids[b])

    return selected


def select_records(records: Iterable[dict[str, Any]], config: dict[str, Any]) -> list[dict[str, Any]]:
    """The records a run directory reports: those of ``config``'s selection (its ``benchmarks``, its
    ``question_ids`` where a ``limit`` chose some, sample indices below its ``n``). The one
    selection of the summary, the leaderboard and the cost tables, so all three say the same."""
    return list(filter(selection_test(config), records))


def selection_of(config: dict[str, Any]) -> tuple:
    """What ``select_records`` depends on, comparable between two configurations."""
    chosen = config.get("question_ids")
    ids = sorted((str(b), sorted(map(str, v))) for b, v in chosen.items()) if isinstance(chosen, dict) else None
    return sorted(map(str, config.get("benchmarks") or [])), config.get("n"), config.get("limit"), ids
