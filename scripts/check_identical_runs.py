"""Compare two run folders: samples.jsonl, summary.json and summary.md identical except clock fields.

    python scripts/check_identical_runs.py RUN_A RUN_B [RUN_A2 RUN_B2 ...]

Clock fields are the ones a rerun of the same code on the same machine changes: every JSON key
ending in ``_s`` (latency_s, wall_s, load_s, queue_s, duration_s, ...) or ``_at`` (started_at,
finished_at), peak memory (``peak_*_bytes``), the run folder's own path, the code's own identity
(provenance ``git`` and the workflow's ``code_sha256``: that is what a refactor changes), and in
summary.md the cells of columns whose header names seconds and the lines that print a duration or a
time stamp. Exit status 0 when every pair matches, 1 otherwise (the first
differences are printed).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

CLOCK_KEY = re.compile(r"(_s|_at)$|^peak_\w+_bytes$")
CODE_KEYS = ("git", "code_sha256")  # provenance of the code itself: what a refactor changes
CLOCK_HEADER = re.compile(r"\(s\)|latency|seconds|wall|/ s\b|per s\b", re.IGNORECASE)
CLOCK_LINE = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d)?( UTC|Z)?|\b\d+(\.\d+)? ?s\b")


def scrub(value: Any) -> Any:
    """``value`` with every clock key's value, and the code's own identity, replaced by a marker."""
    if isinstance(value, dict):
        return {k: ("<clock>" if CLOCK_KEY.search(str(k)) or k in CODE_KEYS else scrub(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def scrub_markdown(text: str, run_dir: Path) -> list[str]:
    """summary.md's lines with clock cells, clock lines and the run folder's path masked."""
    text = text.replace(str(run_dir), "<run>")
    out: list[str] = []
    clock_cols: set[int] = set()
    for line in text.splitlines():
        if line.startswith("|"):
            cells = line.split("|")
            if not re.fullmatch(r"[\s|:-]+", line) and not clock_cols and any(CLOCK_HEADER.search(c) for c in cells):
                clock_cols = {i for i, c in enumerate(cells) if CLOCK_HEADER.search(c)}
                out.append(line)
                continue
            out.append("|".join("<clock>" if i in clock_cols else c for i, c in enumerate(cells)))
        else:
            clock_cols = set()
            out.append(CLOCK_LINE.sub("<clock>", line))
    return out


def compare_runs(a: Path, b: Path) -> list[str]:
    """Differences between run folders ``a`` and ``b`` (empty when identical but for clocks)."""
    diffs: list[str] = []
    rows_a = [scrub(json.loads(x)) for x in (a / "samples.jsonl").read_text().splitlines() if x.strip()]
    rows_b = [scrub(json.loads(x)) for x in (b / "samples.jsonl").read_text().splitlines() if x.strip()]
    if len(rows_a) != len(rows_b):
        diffs.append(f"samples.jsonl: {len(rows_a)} vs {len(rows_b)} records")
    for i, (x, y) in enumerate(zip(rows_a, rows_b)):
        if x != y:
            diffs.append(f"samples.jsonl record {i} differs: {first_difference(x, y)}")
    sa = scrub(json.loads((a / "summary.json").read_text().replace(json.dumps(str(a))[1:-1], "<run>")))
    sb = scrub(json.loads((b / "summary.json").read_text().replace(json.dumps(str(b))[1:-1], "<run>")))
    if sa != sb:
        diffs.append(f"summary.json differs: {first_difference(sa, sb)}")
    ma = scrub_markdown((a / "summary.md").read_text(), a)
    mb = scrub_markdown((b / "summary.md").read_text(), b)
    for i, (x, y) in enumerate(zip(ma, mb)):
        if x != y:
            diffs.append(f"summary.md line {i + 1}: {x!r} vs {y!r}")
    if len(ma) != len(mb):
        diffs.append(f"summary.md: {len(ma)} vs {len(mb)} lines")
    return diffs


def first_difference(x: Any, y: Any, path: str = "") -> str:
    """The path of the first place ``x`` and ``y`` differ, with both values."""
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y), key=str):
            if x.get(k, "<missing>") != y.get(k, "<missing>"):
                return first_difference(x.get(k, "<missing>"), y.get(k, "<missing>"), f"{path}.{k}")
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y)):
            if u != v:
                return first_difference(u, v, f"{path}[{i}]")
    return f"{path or '.'}: {str(x)[:120]!r} vs {str(y)[:120]!r}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: python scripts/check_identical_runs.py before/toy after/toy")
    ap.add_argument("runs", nargs="+", type=Path, help="pairs of run folders: A B [A2 B2 ...]")
    args = ap.parse_args(argv)
    if len(args.runs) % 2:
        ap.error("give run folders in pairs")
    bad = 0
    for a, b in zip(args.runs[::2], args.runs[1::2]):
        diffs = compare_runs(a, b)
        print(f"{a} vs {b}: {'identical except clock fields' if not diffs else f'{len(diffs)} difference(s)'}")
        for d in diffs[:10]:
            print("  " + d)
        bad += bool(diffs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
