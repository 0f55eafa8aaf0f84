"""The paper's reported rows (``leaderboards/reference/paper.yaml``): read (``load_paper``), checked
(``validate_paper``: one line per problem) and turned into a leaderboard's reported rows
(``paper_rows``), marked as reported, not reproduced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drmas_bench.metrics import MACRO
from drmas_bench.report.runs import fmt_num
from drmas_bench.report.tables import Cell, Metric, Row, parse_metrics
from drmas_bench.types import UserError
from drmas_bench.yamlfile import read_yaml

# the evaluation protocol of the paper (REFERENCE.md §3), quoted in table captions
PAPER_PROTOCOL = {"n": 16, "temperature": 0.6, "top_p": 0.95}
PAPER_FILE = Path("leaderboards") / "reference" / "paper.yaml"
PAPER_STATUS = "reported in paper, not reproduced"


def load_paper(path: str | Path | None = None, required: bool = False) -> dict[str, Any] | None:
    """The reported rows (leaderboards/reference/paper.yaml). Without a path: the repository's copy
    (beside the installed package in a checkout), else ./leaderboards/reference/paper.yaml; None
    when neither exists and `required` is False."""
    if path is None:
        cands = [Path(__file__).resolve().parents[2] / PAPER_FILE, Path.cwd() / PAPER_FILE]
        found = next((c for c in cands if c.is_file()), None)
        if found is None:
            if required:
                raise UserError(f"{PAPER_FILE} not found; pass --paper FILE")
            return None
        path = found
    return validate_paper(read_yaml(path, "paper reference file"), str(path))


_PAPER_TOP = {"source", "status", "protocol", "rows", "cost_studies", "claims", "note"}
_PAPER_ROW = {"suite", "label", "model", "team", "estimator", "n", "where", "values", "note"}


def validate_paper(data: Any, where: str = "paper.yaml") -> dict[str, Any]:
    """Check the reference file's shape; every problem is a one-line UserError naming the key."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise UserError(f"{where}: expected a mapping with a `rows:` list")
    for k in data:
        if k not in _PAPER_TOP:
            raise UserError(f"{where}: unknown key {k!r} (known: {', '.join(sorted(_PAPER_TOP))})")
    for i, row in enumerate(data["rows"]):
        w = f"{where}: rows[{i}]"
        if not isinstance(row, dict):
            raise UserError(f"{w}: expected a mapping")
        for k in row:
            if k not in _PAPER_ROW:
                raise UserError(f"{w}: unknown key {k!r} (known: {', '.join(sorted(_PAPER_ROW))})")
        for k in ("suite", "label", "where", "values"):
            if k not in row:
                raise UserError(f"{w}: missing `{k}`")
        if not isinstance(row["values"], dict):
            raise UserError(f"{w}.values: expected metric -> {{benchmark: number}}")
        for metric, cols in row["values"].items():
            parse_metrics(metric)
            if not isinstance(cols, dict):
                raise UserError(f"{w}.values.{metric}: expected benchmark -> number (percent)")
            for col, v in cols.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 100:
                    raise UserError(f"{w}.values.{metric}.{col}: expected a percentage in [0, 100], got {v!r}")
    return data


def paper_rows(paper: dict[str, Any], suite: str, metric: Metric) -> list[Row]:
    """The reported rows of one suite that state a number for `metric`.

    A table of `avg@n` / `pass@n` takes the paper's avg@N / pass@N at the row's stated n. The paper's
    `average` (over its benchmarks) goes into the macro column."""
    out = []
    for r in paper.get("rows", []):
        if r["suite"] != suite:
            continue
        n = r.get("n")
        vals = None
        for name, cols in r["values"].items():
            m = parse_metrics(name)[0]
            if m == metric or (metric.k is None and m.kind == metric.kind and m.k == n):
                vals = cols
                break
        if not vals:
            continue
        row = Row(label=f"[paper] {r['label']}", source="reported", model=str(r.get("model", "–")),
                  team=str(r.get("team", "–")), estimator=str(r.get("estimator", "–")), step="–",
                  n="–" if n is None else str(n),
                  sampling=f"T={fmt_num(paper.get('protocol', {}).get('temperature', '?'))} "
                           f"top_p={fmt_num(paper.get('protocol', {}).get('top_p', '?'))}" if paper.get("protocol") else "–")
        for col, v in vals.items():
            key = MACRO if col == "average" else col
            row.cells[key] = Cell(float(v) / 100.0)
        row.notes.append(f"{paper.get('status', PAPER_STATUS)} ({r['where']})")
        if "average" in vals:
            row.notes.append("the paper's average over its benchmarks, shown as macro")
        if r.get("note"):
            row.notes.append(str(r["note"]))
        out.append(row)
    return out
