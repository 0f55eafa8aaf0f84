"""A leaderboard's tables as CSV files: the wide CSV (``tables_csv``: one line per (metric, row)), the
long CSV (``tables_long_csv``: one line per (run, benchmark, metric)), and their paths, checked
before anything is written (``suite_csv_paths``, ``data_file_name``, ``long_csv_path``).
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Sequence

from drmas_bench.report.runs import Run
from drmas_bench.report.tables import Table
from drmas_bench.types import UserError


def tables_csv(tables: Sequence[Table], ci: bool = False) -> str:
    """Tables of one suite as CSV: one line per (metric, row); values in % (6 decimals), empty = none."""
    cols: list[str] = []
    for t in tables:
        cols += [c for c in t.columns if c not in cols]
    head = ["suite", "metric", "source", "run", "path", "model", "team", "estimator", "step", "n", "sampling"]
    for c in cols:
        head += [c] + ([f"{c} ci_lo", f"{c} ci_hi"] if ci else [])
    head.append("notes")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for t in tables:
        for r in t.rows:
            line = [t.suite, t.metric, r.source, r.label, r.path, r.model, r.team, r.estimator, r.step, r.n, r.sampling]
            for c in cols:
                cell = r.cells.get(c)
                line.append(_pct6(cell.value) if cell else "")
                if ci:
                    line += [_pct6(cell.ci[0]), _pct6(cell.ci[1])] if cell and cell.ci else ["", ""]
            line.append("; ".join(r.notes))
            w.writerow(line)
    return buf.getvalue()


LONG_COLUMNS = ("run", "benchmark", "metric", "value", "ci_lo", "ci_hi")


def _pct6(v: float | None) -> str:
    """A fraction as a percentage with 6 decimals (the CSVs' number format); "" for none / NaN."""
    return "" if v is None or v != v else f"{100 * v:.6f}"


def tables_long_csv(tables: Sequence[Table]) -> str:
    """Tables as a long (tidy) CSV: one line per (run, benchmark, metric) that has a value, with the
    columns of `LONG_COLUMNS`; benchmark is a benchmark, MICRO or MACRO; values in % as in the wide
    CSV (`tables_csv`, the same cells); ci_lo / ci_hi empty without --ci. Paper rows keep their
    `[paper] ` label."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(LONG_COLUMNS)
    for t in tables:
        for r in t.rows:
            for c in t.columns:
                cell = r.cells.get(c)
                if cell is None or cell.value is None or cell.value != cell.value:
                    continue
                lo, hi = cell.ci if cell.ci else (None, None)
                w.writerow([r.label, c, t.metric, _pct6(cell.value), _pct6(lo), _pct6(hi)])
    return buf.getvalue()


_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def data_file_name(out: str | Path, name: str, suffix: str, where: str) -> Path:
    """``out/<name><suffix>`` for a ``name`` read from a run's files (data, not a flag): it must be
    ``[A-Za-z0-9_.-]+`` without ``..``, and the path must stay directly inside ``out``; otherwise a
    UserError naming ``where`` (e.g. "suite of run X") and the value."""
    ok = bool(_SAFE_NAME.fullmatch(name)) and ".." not in name
    path = Path(out) / f"{name}{suffix}"
    if not ok or path.resolve().parent != Path(out).resolve():
        raise UserError(f"{where} is {name!r}, which cannot name an output file (allowed: letters, digits, "
                        f"'_', '.', '-', no '..'); fix the run's config.yaml")
    return path


def suite_csv_paths(out: str | Path, tables: Sequence[Table], runs: Sequence[Run] = ()) -> dict[str, Path]:
    """``{suite: out/<suite>.csv}`` for every suite of ``tables``, all checked before anything is
    written (a suite comes from a run's config.yaml; see `data_file_name`)."""
    paths: dict[str, Path] = {}
    for suite in dict.fromkeys(t.suite for t in tables):
        owners = [r.name for r in runs if r.suite == suite]
        where = f"the suite of run {owners[0]}" if owners else "a suite"
        paths[suite] = data_file_name(out, suite, ".csv", where)
    return paths


def long_csv_path(wide: Path) -> Path:
    """The long CSV beside a suite's wide one: ``out/<suite>_long.csv``."""
    return wide.with_name(f"{wide.stem}_long.csv")
