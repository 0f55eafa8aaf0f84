"""The leaderboard's tables as data: a ``Metric`` (``avg@K`` / ``pass@K`` / ``pass^K``, parsed by
``parse_metrics``), a ``Cell`` (a fraction, with its interval), a ``Row`` (a run or a paper row) and a
``Table`` (one suite, one metric). Built by ``leaderboard.build_leaderboard`` and ``paper.paper_rows``;
written by ``markdown``, ``pages`` and ``tables_csv``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from drmas_bench.types import UserError


@dataclass(frozen=True)
class Metric:
    """`avg@K` / `pass@K` / `pass^K`; K = None means the run's own n (`avg@n`, `pass@n`, `pass^n`)."""

    kind: str  # "avg" | "pass" | "pass^"
    k: int | None = None

    @property
    def name(self) -> str:
        head = self.kind if self.kind.endswith("^") else f"{self.kind}@"
        return f"{head}{'n' if self.k is None else self.k}"


def parse_metrics(text: str) -> list[Metric]:
    """`avg@16,pass@16,pass^4` -> metrics; K is a positive integer or `n`. Bad names are UserErrors."""
    out: list[Metric] = []
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        m = re.fullmatch(r"(avg@|pass@|pass\^)(n|\d+)", part.lower())
        if not m or (m.group(2) != "n" and int(m.group(2)) == 0):
            raise UserError(f"--metric: {part!r} is not a metric; use avg@K, pass@K or pass^K with K a positive "
                            "integer or n (e.g. avg@16,pass@16,pass^4)")
        metric = Metric(m.group(1).rstrip("@"), None if m.group(2) == "n" else int(m.group(2)))
        if metric not in out:
            out.append(metric)
    if not out:
        raise UserError("--metric: name at least one metric, e.g. avg@n,pass@n")
    return out


@dataclass
class Cell:
    value: float | None  # a fraction in [0, 1] (rendered in %)
    ci: tuple[float, float] | None = None


@dataclass
class Row:
    label: str
    source: str  # "reproduced" | "reported"
    model: str = "–"
    team: str = "–"
    estimator: str = "–"
    step: str = "–"
    n: str = "–"
    sampling: str = "–"
    cells: dict[str, Cell] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    path: str = ""
    effect: str = "–"  # the agents' effect in one phrase (`effect_label`); "–" for reported rows


@dataclass
class Table:
    suite: str
    metric: str
    columns: list[str]  # benchmarks, then MICRO, MACRO
    rows: list[Row]
    caption: str = ""
