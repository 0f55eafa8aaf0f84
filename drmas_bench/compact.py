"""``RUN/records.compact.jsonl``: each sample as the summary reads it, without the text it never reads.

A trajectory record is mostly prompt text (every call's chat messages) and, in a search run, the
passages the env showed (each step's observation). The summary (``metrics.summarize``, the protocol
and cache sections) reads neither: it reads outcomes, tokens, latencies, dollars, each response (the
format rules, actions and verdicts) and, for search, one figure of the observations, whether a gold
answer was among the passages (the search suite's ``evidence_at_answer``, the costly part of a summary).
So the store appends, beside each samples.jsonl line, its compact form (``compact``): the same record
with the messages and observations dropped and the figures its workflow computes from them
(``WorkflowSpec.record_figures``; search: ``{"evidence": [at answer, anywhere]}``) computed once, now,
under ``"figures"``, where the workflow's effects read them back.
Summaries read this file (``read_compact``; a run's own summary one line at a time, ``stream_views``)
and never parse the prompts.

The file starts with a header line naming its format version; a file of another version, or one
whose line count differs from the index's (a run killed between the appends, a repaired
samples.jsonl), is rebuilt from samples.jsonl, one line at a time.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from drmas_bench.records import RecordView, view
from drmas_bench.run_index import INDEX
from drmas_bench.workflows.base import find_workflow

COMPACT = "records.compact.jsonl"
VERSION = 1
HEADER = json.dumps({"compact_records": VERSION}) + "\n"


def compact(rec: dict[str, Any], workflow: str | None = None) -> dict[str, Any]:
    """``rec`` (a samples.jsonl record) without its chat messages and env observations, with the
    figures its workflow computes from them (``WorkflowSpec.record_figures``; ``workflow``: its name,
    else the record's run stamp's) under ``"figures"`` (see the module docstring)."""
    out = dict(rec)
    spec = find_workflow(workflow or (rec.get("run") or {}).get("workflow"))
    if spec is not None and spec.record_figures is not None:
        out["figures"] = spec.record_figures(rec)
    turns = []
    for t in rec.get("turns") or ():
        if isinstance(t, dict) and isinstance(t.get("request"), dict) and "messages" in t["request"]:
            t = {**t, "request": {k: v for k, v in t["request"].items() if k != "messages"}}
        turns.append(t)
    out["turns"] = turns
    extra = rec.get("extra")
    env = extra.get("env") if isinstance(extra, dict) else None
    if isinstance(extra, dict) and isinstance(env, dict) and isinstance(env.get("steps"), list):
        steps = [{k: v for k, v in s.items() if k != "observation"} if isinstance(s, dict) else s for s in env["steps"]]
        out["extra"] = {**extra, "env": {**env, "steps": steps}}
    return out


def line(rec: dict[str, Any], workflow: str | None = None) -> str:
    return json.dumps(compact(rec, workflow), ensure_ascii=False, separators=(",", ":")) + "\n"


def lines_in(path: Path) -> int | None:
    """Records in a compact file, None when it is missing or of another version."""
    try:
        with open(path, "rb") as f:
            if f.readline().decode("utf-8", "replace") != HEADER:
                return None
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return None


def rebuild(path: Path, records: Iterable[dict[str, Any]], workflow: str | None = None) -> None:
    """Write the compact file of ``records`` (read one at a time) in place of ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(HEADER)
        for rec in records:
            f.write(line(rec, workflow))
    tmp.replace(path)


def append(path: Path, recs: list[dict[str, Any]], workflow: str | None = None) -> None:
    new = not path.exists()
    with open(path, "a", encoding="utf-8") as f:
        f.write((HEADER if new else "") + "".join(line(r, workflow) for r in recs))


def read_compact(path: Path, key: Callable[[dict[str, Any]], Any]) -> list[dict[str, Any]]:
    """Every compact record, the last copy of a repeated ``key`` winning (as samples.jsonl's readers)."""
    by_key: dict[Any, dict[str, Any]] = {}
    with open(path, "rb") as f:
        f.readline()
        for raw in f:
            rec = json.loads(raw)
            by_key[key(rec)] = rec
    return list(by_key.values())


def current_records(run: str | Path, key: Callable[[dict[str, Any]], Any]) -> list[dict[str, Any]] | None:
    """Every record of RUN in compact form when RUN/records.compact.jsonl is in step with samples.jsonl
    (RUN/samples.index covers samples.jsonl to its last byte and the two hold as many lines), else
    None: the caller reads samples.jsonl. Reads, never writes (no lock is taken). ``key``: a record's
    (benchmark, task id, sample index), the last copy of a repeated one winning."""
    p = Path(run)
    try:
        with open(p / INDEX, "rb") as f:
            lines = f.read().split(b"\n")
        last = json.loads(lines[-2]) if len(lines) > 1 else None
        if last is None or (p / "samples.jsonl").stat().st_size != int(last[5]) or lines_in(p / COMPACT) != len(lines) - 1:
            return None
        return read_compact(p / COMPACT, key)
    except (OSError, ValueError, IndexError, TypeError):
        return None


def slim_view(rec: dict[str, Any]) -> RecordView:
    """A compact record as the summary reads it: a view without the run stamp and the calls' requests,
    keeping as ``raw`` only its ``figures``."""
    rec.pop("run", None)  # neither the stamp nor each call's request (sampling) is summarized
    for t in rec.get("turns") or ():
        if isinstance(t, dict):
            t.pop("request", None)
    return replace(view(rec), raw={"figures": rec["figures"]} if "figures" in rec else {})


def _index_key_hashes(run: Path) -> tuple[array, int] | None:
    """A hash of each RUN/samples.index line's (benchmark, task id, sample index), and the byte of
    samples.jsonl where its last line ends; None when the index is unreadable."""
    out, end = array("q"), 0
    try:
        with open(run / INDEX, "rb") as f:
            for raw in f:
                e = json.loads(raw)
                out.append(hash((str(e[0]), str(e[1]), int(e[2]))))
                end = int(e[5])
    except (OSError, ValueError, IndexError, TypeError):
        return None
    return out, end


def stream_views(run: str | Path, selected: Callable[[dict[str, Any]], bool]) -> Iterator[RecordView] | None:
    """The records of RUN's selection (``selected``) as `slim_view`s of RUN/records.compact.jsonl, read one
    line at a time, nothing kept: when the copy is in step with samples.jsonl (RUN/samples.index covers
    samples.jsonl to its last byte and the copy holds a line per index line) and no key repeats (so
    there is no earlier copy for a later one to replace). None otherwise: the caller reads the records
    whole (``RunDir.compact_views``, or samples.jsonl, the last copy of a key winning)."""
    p = Path(run)
    lines = lines_in(p / COMPACT)
    index = _index_key_hashes(p) if lines is not None else None
    if index is None or len(index[0]) != lines:
        return None
    try:
        if (p / "samples.jsonl").stat().st_size != index[1]:
            return None
    except OSError:
        return None
    if len(np.unique(np.asarray(index[0]))) != lines:
        return None
    return _read_views(p / COMPACT, selected)


def _read_views(path: Path, selected: Callable[[dict[str, Any]], bool]) -> Iterator[RecordView]:
    with open(path, "rb") as f:
        f.readline()
        for raw in f:
            rec = json.loads(raw)
            if selected(rec):
                yield slim_view(rec)
