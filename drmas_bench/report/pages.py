"""The leaderboard as one self-contained HTML page (`leaderboard_html`), written by
`drmas-bench leaderboard --out DIR` beside leaderboard.md and the CSVs.

One section per (suite, metric) table of `report.leaderboard.build_leaderboard` (the same rows and
cells as the Markdown and CSVs): a run per row, its benchmarks, micro and macro in %, the CI under
the value with ``--ci``; a row whose n, sampling, grader, prompts, protocol options or question set
differ from the table's setting carries the ⚠ mark, its notes in the tooltip and in the notes
column. Column heads sort the rows (a few lines of inline script; a row without a value goes last).
Each suite gets a Pareto plot (inline SVG, `report.charts.scatter`): micro score of its first table
against tokens per question from the runs' recorded calls, the front of runs that no other run
beats on both. No network, no library: the page opens from disk.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Sequence

from drmas_bench.files import atomic_write
from drmas_bench.metrics import MACRO, MICRO
from drmas_bench.report import charts
from drmas_bench.report.cost import pareto_front
from drmas_bench.report.labels import label
from drmas_bench.report.leaderboard import digest
from drmas_bench.report.runs import Run
from drmas_bench.report.tables import Row, Table

TEMPLATE = "leaderboard.html.jinja"


def tokens_per_question(run: Run) -> float | None:
    """Prompt + completion tokens of every call of the run / its questions; None when a call's usage
    is unknown (an unknown count is never drawn as 0). A run holding no records: its leaderboard
    `digest`'s figure."""
    if not run.views:
        return digest(run).tokens_per_question
    tokens, qs = 0, set()
    for r in run.views:
        qs.add((r.benchmark, r.task_id))
        for t in r.turns:
            if not t.call.usage_known:
                return None
            tokens += t.call.prompt_tokens + t.call.completion_tokens
    return tokens / len(qs) if qs else None


def _column_label(c: str) -> str:
    return {MICRO: label("micro"), MACRO: label("macro")}.get(c, c)


def _cell_html(row: Row, col: str, ci: bool) -> str:
    cell = row.cells.get(col)
    if cell is None or cell.value is None or cell.value != cell.value:
        return f'<td class="num" data-v="" data-label="{escape(_column_label(col))}">–</td>'
    text = f"{100 * cell.value:.1f}"
    sub = ""
    if ci and cell.ci is not None and all(v == v for v in cell.ci):
        sub = f'<br><small>[{100 * cell.ci[0]:.1f}, {100 * cell.ci[1]:.1f}]</small>'
    return (f'<td class="num" data-v="{cell.value:.9f}" data-label="{escape(_column_label(col))}">'
            f"{text}{sub}</td>")


def table_html(t: Table, ci: bool, index: int) -> str:
    """One leaderboard table: the run cell (label, ⚠ when flagged, its setting under it), a column per
    benchmark plus micro and macro, the agents' effect and the notes."""
    head = ["run"] + [_column_label(c) for c in t.columns] + ["agents' effect", "notes"]
    ths = "".join(f'<th data-col="{i}" title="click to sort">{escape(h)}</th>' for i, h in enumerate(head))
    body = []
    for r in t.rows:
        flagged = r.source == "reproduced" and bool(r.notes)
        mark = ('<span class="flag" title="not comparable as is: ' + escape("; ".join(r.notes)) + '">⚠</span> '
                if flagged else "")
        setting = " · ".join(x for x in (r.model, r.team, f"n={r.n}", r.sampling,
                                          r.estimator, "" if r.step == "–" else f"step {r.step}") if x and x != "–")
        cls = ' class="paper"' if r.source == "reported" else (' class="flagged"' if flagged else "")
        cells = [f'<th data-v="{escape(r.label)}" data-label="run">{mark}{escape(r.label)}'
                 f'<br><small>{escape(setting)}</small></th>']
        cells += [_cell_html(r, c, ci) for c in t.columns]
        cells.append(f'<td data-v="{escape(r.effect)}" data-label="agents\' effect"><small>{escape(r.effect)}</small></td>')
        cells.append(f'<td data-v="{escape("; ".join(r.notes))}" data-label="notes"><small>'
                     f'{escape("; ".join(r.notes) or "–")}</small></td>')
        body.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    return (f'<h2>{escape(t.suite)}: {escape(t.metric)}</h2><p class="meta">{escape(t.caption)}.</p>'
            f'<table class="report sortable" data-table="{index}"><thead><tr>{ths}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def pareto_html(t: Table, runs: Sequence[Run]) -> str:
    """The suite's Pareto plot: each reproduced row's micro score in ``t`` against its run's tokens
    per question; "" when fewer than two runs have both."""
    by_path = {str(r.path): r for r in runs}
    pts = []
    for row in t.rows:
        run = by_path.get(row.path)
        cell = row.cells.get(MICRO)
        if row.source != "reproduced" or run is None or cell is None or cell.value is None or "[maj@" in row.label:
            continue
        tpq = tokens_per_question(run)
        if tpq is not None:
            pts.append((row.label, tpq, cell.value))
    if len(pts) < 2:
        return ""
    front = set(pareto_front([(x, y) for _, x, y in pts]))
    points = [(lab, x, y, i in front) for i, (lab, x, y) in enumerate(pts)]
    return ('<div class="charts">' + charts.scatter(f"pareto-{t.suite}", f"{t.suite}: {t.metric} over all questions against "
                                               "tokens per question (the Pareto front joined: no other run is both "
                                               "cheaper and better)", points, "tokens per question",
                                               f"{t.metric} (%)", x_fmt=lambda v: f"{v:.0f}")
            + "</div>")


def leaderboard_html(tables: Sequence[Table], runs: Sequence[Run], ci: bool = False, notes: Sequence[str] = ()) -> str:
    """The whole page as one HTML string."""
    import jinja2

    parts, seen = [], set()
    for i, t in enumerate(tables):
        parts.append(f'<section class="board">{table_html(t, ci, i)}')
        if t.suite not in seen:  # one plot per suite, from its first metric
            seen.add(t.suite)
            parts.append(pareto_html(t, runs))
        parts.append("</section>")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True)
    return env.get_template(TEMPLATE).render(body="".join(parts), notes=list(notes),
                                             title=", ".join(dict.fromkeys(t.suite for t in tables)))


def write_leaderboard_html(path: str | Path, tables: Sequence[Table], runs: Sequence[Run], ci: bool = False,
                           notes: Sequence[str] = ()) -> Path:
    path = Path(path)
    atomic_write(path, leaderboard_html(tables, runs, ci, notes))
    return path
