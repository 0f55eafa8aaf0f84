"""The viewer's reading of a run directory: one record in memory at a time.

The run's records are read a record at a time, never held together (`read`, then `details`):

1. Every selected record once, in file order, as the list needs it: from
   RUN/records.compact.jsonl (no prompts, no passages) while it is in step with samples.jsonl
   (`compact.current_records`' test), each compact line paired with its RUN/samples.index entry,
   which gives the byte range of the full record in samples.jsonl; else from samples.jsonl itself,
   line by line (`scan`). Kept per trajectory: its list row as a tuple (`ROW_KEYS`), the byte range
   of its full record and its place in the file, the last copy of a repeated (benchmark, question,
   sample) winning, as every reader of samples.jsonl does.
2. The records the summary counts, the last copy of each, as it reads them (the views
   `RunDir.compact_views` makes: no messages, passages, run stamp or requests), handed one at a
   time to `metrics.summarize`. From the compact records this is the same read as 1 (the earlier
   copies of a repeated sample are found in the index first); from samples.jsonl, a second read
   (`summary_records`).
3. The full records, a chunk of rows at a time in the page's order, each read at its byte range:
   the turns the page shows when a trajectory is opened (`view.trajectory_detail`).

An unreadable samples.jsonl line stops with the store's one-line error and its repair hint; a line
cut off by a kill (the last, without its newline) is left out, as `run_samples.read_samples` does.
"""

from __future__ import annotations

import contextlib
import json
import re
from array import array
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from drmas_bench import compact, metrics
from drmas_bench.compact import COMPACT
from drmas_bench.records import RecordView, view
from drmas_bench.report.runs import Run
from drmas_bench.run_index import INDEX
from drmas_bench.run_samples import SAMPLES, parse_sample_line, repair_hint, sample_key, selection_test
from drmas_bench.types import UserError
from drmas_bench.workflows import find_workflow

ROW_KEYS = ("b", "id", "s", "q", "c", "r", "nv", "n", "route", "k", "a")
SHORT = 200  # characters of a question / answer kept in the list row


def short(s: Any, n: int = SHORT) -> str:
    s = "" if s is None else str(s)
    return s if len(s) <= n else s[: n - 1] + "…"


def row_values(rec: RecordView, kinds_of: Callable[[RecordView], list[str]] | None) -> tuple:
    """One trajectory's list row (the values of `ROW_KEYS`): what the filters and the search box need.
    ``kinds_of``: the workflow's env step kinds of a record (`WorkflowSpec.env_step_kinds`), if any."""
    route = "→".join(t.agent for t in rec.turns)
    kinds = kinds_of(rec) if kinds_of is not None else None
    return (rec.benchmark, rec.task_id, rec.sample_idx, short(rec.question), rec.correct, rec.reward,
            sum(not t.valid for t in rec.turns), len(rec.turns), route, kinds.count("search") if kinds is not None else None,
            short(rec.final_answer, 80))


class Rows:
    """The list rows of one run, compactly: a tuple of `ROW_KEYS` values per trajectory (repeated
    strings, benchmarks and routes, stored once) and where its full record is (``start``, ``end``: a
    byte range of samples.jsonl, or with ``end`` -1 an index into the run's in-memory records), and
    its record's place among the records `records` gives (``line``: the summary's pass reads those).
    Iterating gives each row as the page's dict."""

    def __init__(self) -> None:
        self.data: list[tuple] = []
        self.start = array("q")
        self.end = array("q")
        self.line = array("q")
        self._shared: dict[str, str] = {}

    def put(self, slot: int, row: tuple, start: int, end: int, line: int) -> None:
        """Set row ``slot`` (== len(self): a new one)."""
        row = (self._shared.setdefault(row[0], row[0]),) + row[1:8] + (self._shared.setdefault(row[8], row[8]),) + row[9:]
        if slot == len(self.data):
            self.data.append(row)
            self.start.append(start)
            self.end.append(end)
            self.line.append(line)
        else:
            self.data[slot], self.start[slot], self.end[slot], self.line[slot] = row, start, end, line

    def in_page_order(self) -> None:
        """Sort the rows as the page lists them: benchmark, then question id (its numbers compared as
        numbers), then sample."""
        d = self.data
        self.reorder(sorted(range(len(d)), key=lambda i: (d[i][0], natural(d[i][1]), d[i][2] or 0)))

    def reorder(self, order: list[int]) -> None:
        self.data = [self.data[i] for i in order]
        for name in ("start", "end", "line"):
            old = getattr(self, name)
            setattr(self, name, array("q", (old[i] for i in order)))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return dict(zip(ROW_KEYS, self.data[i]))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (dict(zip(ROW_KEYS, t)) for t in self.data)

    def json_parts(self) -> Iterator[str]:
        """The rows as one JSON array (compact separators), a row at a time."""
        yield "["
        for i, t in enumerate(self.data):
            yield ("," if i else "") + json.dumps(dict(zip(ROW_KEYS, t)), ensure_ascii=False, separators=(",", ":"))
        yield "]"


def _slim(rec: dict[str, Any]) -> RecordView:
    """The summary's view of a compact record, as `RunDir.compact_views` makes it: no run stamp, no
    request (sampling, messages) on its turns, the workflow's stored figures as ``raw``."""
    v = view(rec)
    turns = tuple(replace(t, sampling={}, messages=()) for t in v.turns)
    return replace(v, run={}, turns=turns, raw={"figures": rec["figures"]} if "figures" in rec else {})


def _in_step(p: Path) -> bool:
    """Whether RUN/records.compact.jsonl and RUN/samples.index are in step with samples.jsonl (the
    test of `compact.current_records`)."""
    try:
        with open(p / INDEX, "rb") as f:
            lines = sum(1 for _ in f)
            f.seek(max(0, f.tell() - (1 << 16)))
            last = json.loads(f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1])
        return (lines > 0 and (p / SAMPLES).stat().st_size == int(last[5])
                and compact.lines_in(p / COMPACT) == lines)
    except (OSError, ValueError, IndexError, TypeError):
        return False


def _from_compact(p: Path) -> Iterator[tuple[dict[str, Any], int, int, bool]]:
    """(compact record, start, end of its samples.jsonl line, True) of each line, with the index's ranges."""
    with open(p / COMPACT, "rb") as f, open(p / INDEX, "rb") as idx:
        f.readline()
        for raw, entry in zip(f, idx):
            e = json.loads(entry)
            rec = json.loads(raw)
            if sample_key(rec) != (e[0], e[1], e[2]):
                raise UserError(f"{p / INDEX}:{e[3]}: out of step with {COMPACT}; delete both to have them rebuilt "
                                "by the next `drmas-bench eval` of this run")
            yield rec, int(e[4]), int(e[5]), True


def _from_samples(p: Path) -> Iterator[tuple[dict[str, Any], int, int, bool]]:
    """(record, start, end, False) of each samples.jsonl line (see the module docstring for bad lines)."""
    path = p / SAMPLES
    if not path.is_file():
        return
    pos = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            start, pos = pos, pos + len(raw)
            if not raw.strip():
                continue
            rec = parse_sample_line(raw.rstrip(b"\n"))
            if rec is None:
                if not raw.endswith(b"\n"):  # cut off by a kill mid-append
                    continue
                raise UserError(f"{path}:{lineno}: not a trajectory record (corrupt line); {repair_hint(p)}")
            yield rec, start, pos, False


def records(run: Run) -> Iterator[tuple[Any, int, int, bool]]:
    """(record, start, end, compact?) of each selected record of ``run``, repeats included (see `scan`);
    a `Run` holding its records in memory gives them with their index as ``start`` and ``end`` -1."""
    if run.records:
        for i, v in enumerate(run.views):
            yield v, i, -1, False
        return
    selected = selection_test(run.config)
    for rec, start, end, is_compact in (_from_compact if _in_step(run.path) else _from_samples)(run.path):
        if selected(rec):
            yield rec, start, end, is_compact


def workflow_of(run: Run) -> str | None:
    """The workflow whose rules read the run's turns: the configured one, else the one its agents name."""
    if metrics.role_rules(run.workflow):
        return run.workflow
    if run.records:
        return metrics.infer_workflow(run.views)
    return metrics.infer_workflow(view(r) for r, _, _, _ in records(run))


def natural(s: str) -> tuple:
    """A sort key that puts q2 before q10."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", s) if p)


def scan(run: Run, wf: str | None, rows: Rows) -> None:
    """Pass 1 (see the module docstring): fill ``rows`` with the run's rows in the page's order."""
    kinds_of = _kinds_of(wf)
    slot_of: dict[tuple, int] = {}
    for line, (rec, start, end, _) in enumerate(records(run)):
        v = view(rec)
        slot = slot_of.setdefault(v.key, len(rows))
        rows.put(slot, row_values(v, kinds_of), start, end, line)
    del slot_of
    rows.in_page_order()


def _kinds_of(wf: str | None) -> Callable[[RecordView], list[str]] | None:
    spec = find_workflow(wf)  # the kind of each env step, as the workflow reads its records
    return spec.env_step_kinds if spec is not None else None


def read(run: Run, wf: str | None, rows: Rows) -> Iterator[RecordView]:
    """The records the run's summary counts, one at a time (`summary_records`' views), ``rows`` filled
    with the run's rows on the way, in the page's order once the iterator is spent. Where the compact
    records are in step, passes 1 and 2 are one: each compact line is read once, its row kept and its
    view handed on (the earlier copies of a repeated sample, found in the index first, are skipped)."""
    if run.records or not _in_step(run.path):
        scan(run, wf, rows)
        yield from summary_records(run, rows)
        return
    kinds_of, selected, skip = _kinds_of(wf), selection_test(run.config), _superseded(run.path)
    for line, (rec, start, end, _) in enumerate(_from_compact(run.path)):
        if line not in skip and selected(rec):
            v = _slim(rec)
            rows.put(len(rows), row_values(v, kinds_of), start, end, line)
            yield v
    rows.in_page_order()


def _superseded(p: Path) -> set[int]:
    """The lines (from 0) of RUN/samples.index whose sample appears again further on: the copies a
    later one replaces (every reader keeps the last). Keys are compared by hash first; the few that
    repeat are compared in full."""
    hashes = array("q")
    with open(p / INDEX, "rb") as f:
        for raw in f:
            e = json.loads(raw)
            hashes.append(hash((str(e[0]), str(e[1]), int(e[2]))))
    if len(set(hashes)) == len(hashes):
        return set()
    seen: set[int] = set()
    repeated: set[int] = set()
    for h in hashes:
        (repeated if h in seen else seen).add(h)
    last: dict[tuple, int] = {}
    out = set()
    with open(p / INDEX, "rb") as f:
        for i, raw in enumerate(f):
            if hashes[i] in repeated:
                e = json.loads(raw)
                key = (str(e[0]), str(e[1]), int(e[2]))
                if key in last:
                    out.add(last[key])
                last[key] = i
    return out


def summary_records(run: Run, rows: Rows) -> Iterator[RecordView]:
    """The records the run's summary counts, read again one at a time in file order (the last copy of a
    repeated sample only), as the summary reads them: views of compact records without run stamps
    and requests (`RunDir.compact_views`' views). A run holding its records in memory: its views."""
    if run.records:
        yield from run.views
        return
    wanted = sorted(rows.line)
    wf_config = run.config.get("workflow")
    at = 0
    for line, (rec, _, _, is_compact) in enumerate(records(run)):
        if at < len(wanted) and line == wanted[at]:
            at += 1
            yield _slim(rec if is_compact else compact.compact(rec, wf_config))


def details(run: Run, rows: Rows, size: int, detail: Callable[[Any], dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Pass 2: ``detail`` of each row's full record, ``size`` rows at a time, in the rows' order; each
    record read at its byte range of samples.jsonl (a run in memory: taken from it)."""
    path = run.path / SAMPLES
    with (open(path, "rb") if not run.records else contextlib.nullcontext(None)) as f:
        for lo in range(0, len(rows), size):
            out = []
            for i in range(lo, min(lo + size, len(rows))):
                start, end = rows.start[i], rows.end[i]
                out.append(detail(run.views[start] if end < 0 else _read_record(f, path, start, end)))
            yield out


def _read_record(f: Any, path: Path, start: int, end: int) -> dict[str, Any]:
    f.seek(start)
    raw = f.read(end - start)
    rec = parse_sample_line(raw.rstrip(b"\n"))
    if rec is None:
        raise UserError(f"{path}: the line at byte {start} is no longer a trajectory record (the file changed "
                        f"while the page was built?); {repair_hint(path.parent)}")
    return rec

