"""`drmas-bench train-report RUN`: the training run's page, one self-contained HTML file.

    page = write_report("runs/tiny-drmas")        # -> runs/tiny-drmas/train_report.html

Five charts against the training step, inline SVG (no script library, nothing fetched: the page
opens from disk): the mean trajectory reward (``critic/score/mean``, with its 5-step mean), the
validation avg@n, each agent's gradient norm (``agent/<a>/actor/grad_norm``) and each agent's
validity (the share of its calls with a well-formed answer: ``agent/<a>/valid/mean`` on the
training rollouts, and the validation's own per-agent rate) and the seconds of each phase of the
step (``timing_s/gen``, ``old_log_prob``, ``update_actor``, ``sync_weights``, ``testing``,
``save_checkpoint``, and the whole ``step``). Under them a table of the validation
steps, and the line that names the best one.

The training numbers come from ``RUN/metrics.jsonl`` (`runlog.read_metrics`). The validation numbers
come from the validation run folders themselves, ``RUN/val/step_N/``, each an ordinary evaluation
run (`report.runs.open_run` checks it is one) whose ``summary.json`` is what `drmas-bench eval`
writes (`metrics.summarize`): avg@n and pass@n over all its questions (``micro``) and per
benchmark, and per agent ``compliance.agents.<a>.valid_rate``. So the page shows what `drmas-bench
view RUN/val/step_N` shows for that step, whatever names the trainer logs the same figures under.
Every validation point and table row links to its folder.

The best validation step is the one with the highest avg@n over all its questions; of equal ones,
the earliest (the fewest updates reaching that score). A validation folder without a readable
summary (a validation still running, or killed) is listed as unfinished and not plotted.

Every chart is a ``<figure class="chart" data-chart=NAME>`` (as in `drmas_bench.report.charts`)
holding one ``<svg>`` with its axis range in ``data-x0 data-x1 data-y0 data-y1 data-log``; each
point is a ``<circle class="pt">`` with ``data-step`` / ``data-value`` and a ``<title>`` tooltip.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import quote

import yaml

from drmas_bench.files import atomic_write
from drmas_bench.report import charts as report_charts
from drmas_bench.report.charts import PALETTE
from drmas_bench.report.runs import open_run
from drmas_bench.types import UserError
from drmas_trainer import metric_names
from drmas_trainer.reports.plot import moving_average
from drmas_trainer.runlog import CONFIG, METRICS, read_metrics

PAGE = "train_report.html"  # written inside the run folder unless --out says otherwise
VAL = "val"  # RUN/val/step_N/: one evaluation run folder per validation
STEP_DIR = re.compile(r"step_(\d+)")

# one chart's box (viewBox units; the SVG scales to its figure's width)
W, H = 520, 250
LEFT, RIGHT, TOP, BOTTOM = 54, 12, 10, 38


@dataclass
class ValPoint:
    """One validation run folder, as its summary.json tells it. ``avg`` / ``pass_n``: over all its
    questions (summary.json ``micro``); None with ``note`` saying why when the summary is unreadable."""

    step: int
    path: Path
    avg: float | None = None
    pass_n: float | None = None
    n: int | None = None
    questions: int | None = None
    benchmarks: dict[str, float | None] = field(default_factory=dict)  # avg@n per benchmark
    validity: dict[str, float | None] = field(default_factory=dict)  # agent -> share of valid calls
    note: str = ""


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def read_validation(folder: Path, step: int) -> ValPoint:
    """The validation numbers of one ``RUN/val/step_N/`` folder from its summary.json."""
    point = ValPoint(step, folder)
    try:
        open_run(folder)  # an evaluation run folder (its config.yaml), else a UserError saying what it is not
        doc = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except UserError as e:
        point.note = str(e)
        return point
    except FileNotFoundError:
        point.note = "no summary.json yet (the validation is running, or was stopped)"
        return point
    except (OSError, ValueError) as e:
        point.note = f"summary.json unreadable ({e})"
        return point
    micro = doc.get("micro") if isinstance(doc, dict) else None
    if not isinstance(micro, dict):
        point.note = "summary.json holds no `micro` block (not an evaluation summary)"
        return point
    point.avg, point.pass_n = _num(micro.get("avg@n")), _num(micro.get("pass@n"))
    point.n = micro.get("n") if isinstance(micro.get("n"), int) else None
    point.questions = micro.get("questions") if isinstance(micro.get("questions"), int) else None
    for b, blk in (doc.get("benchmarks") or {}).items():
        point.benchmarks[str(b)] = _num(blk.get("avg@n")) if isinstance(blk, dict) else None
    for a, c in ((doc.get("compliance") or {}).get("agents") or {}).items():
        point.validity[str(a)] = _num(c.get("valid_rate")) if isinstance(c, dict) else None
    return point


def validation_points(run: Path) -> list[ValPoint]:
    """Every ``RUN/val/step_N/`` folder, by step."""
    root = run / VAL
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), d) for d in root.iterdir() if d.is_dir() and (m := STEP_DIR.fullmatch(d.name))]
    return [read_validation(d, s) for s, d in sorted(found)]


def best_step(points: Sequence[ValPoint]) -> ValPoint | None:
    """The validation with the highest avg@n over all its questions; of equal ones the earliest."""
    best: ValPoint | None = None
    for p in sorted(points, key=lambda p: p.step):
        if p.avg is not None and (best is None or p.avg > (best.avg or 0.0)):
            best = p
    return best


def check_training_run(run: Path) -> None:
    """One clear line when ``run`` is not a training run folder."""
    if not run.is_dir():
        raise UserError(f"{run}: no such folder; give the --out folder of `drmas-bench train`")
    cfg = run / CONFIG
    if cfg.is_file():
        try:
            doc = yaml.safe_load(cfg.read_text(encoding="utf-8"))
        except yaml.YAMLError:
            doc = None
        if isinstance(doc, dict) and "identity" in doc:
            raise UserError(f"{run}: an evaluation run, not a training run; its page is `drmas-bench view {run}`")
    if not (run / METRICS).is_file():
        raise UserError(f"{run}: not a training run (no {METRICS}); give the --out folder of `drmas-bench train`")


# ------------------------------------------------------------------------------ the charts


@dataclass
class Series:
    """One line of a chart: points (step, value or None for a gap, link or None)."""

    label: str
    colour: str
    points: list[tuple[int, float | None, str | None]]
    dashed: bool = False
    width: float = 1.8
    best_step: int | None = None  # this series' point at that step is ringed


class Scale:
    """Steps to x and values to y of one chart (log10 when ``log``)."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, log: bool, tick: float = 0.0) -> None:
        self.x0, self.x1, self.y0, self.y1, self.log = x0, x1, y0, y1, log
        self.tick = tick or (y1 - y0) / 4  # linear: the distance between grid lines

    def x(self, step: float) -> float:
        return LEFT + (W - LEFT - RIGHT) * (step - self.x0) / (self.x1 - self.x0)

    def y(self, v: float) -> float:
        t = math.log10(v) if self.log else v
        return TOP + (H - TOP - BOTTOM) * (1 - (t - self.y0) / (self.y1 - self.y0))


def _scale(series: Sequence[Series], share: bool, log: bool, steps: Sequence[int] = ()) -> Scale:
    """The chart's ranges: ``steps`` (else the series' steps; one more on each side for a single
    step); shares on 0..1; a log axis from the decade under the smallest value to the one over the
    largest; else from 0 (or under the minimum when negative) to over the maximum, on round grid lines."""
    steps = list(steps) or [s for ser in series for s, _, _ in ser.points]
    x0, x1 = (min(steps), max(steps)) if steps else (0, 1)
    if x1 <= x0:
        x0, x1 = x0 - 1, x1 + 1
    vals = [v for ser in series for _, v, _ in ser.points if v is not None]
    if share:
        return Scale(x0, x1, 0.0, 1.0, False)
    if log:
        e0, e1 = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
        return Scale(x0, x1, e0, e1 if e1 > e0 else e0 + 1, True)
    lo, hi = min([0.0, *vals]), max([0.0, *vals])
    tick = nice_step((hi - lo) / 4 or 0.25)
    y0 = math.floor(lo / tick) * tick
    return Scale(x0, x1, y0, max(y0 + tick, math.ceil(hi / tick) * tick), False, tick)


def nice_step(raw: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x a power of ten that is >= ``raw`` (> 0): grid lines at round values."""
    e = 10.0 ** math.floor(math.log10(raw))
    return next(m * e for m in (1, 2, 2.5, 5, 10) if m * e >= raw * (1 - 1e-9))


def _fmt(v: float, share: bool) -> str:
    return f"{100 * v:.1f}%" if share else f"{v:.4g}"


def _axes(sc: Scale, share: bool, x_label: str, y_label: str) -> list[str]:
    """Grid lines, tick labels and axis titles."""
    out = []
    if sc.log:
        ticks = [10.0 ** e for e in range(int(sc.y0), int(sc.y1) + 1)]
    else:
        ticks = [sc.y0 + sc.tick * i for i in range(round((sc.y1 - sc.y0) / sc.tick) + 1)]
    for t in ticks:
        y = sc.y(t)
        out.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="axis" x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">'
                   f'{escape(f"{100 * t:.0f}%" if share else f"{t:.3g}")}</text>')
    span = sc.x1 - sc.x0
    step = max(1, math.ceil(span / 6))
    for s in range(math.ceil(sc.x0), math.floor(sc.x1) + 1):
        if (s - math.ceil(sc.x0)) % step == 0:
            out.append(f'<text class="axis" x="{sc.x(s):.1f}" y="{H - BOTTOM + 14}" text-anchor="middle">{s}</text>')
    out.append(f'<text class="axis" x="{(LEFT + W - RIGHT) / 2:.0f}" y="{H - 6}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text class="axis" transform="translate(11 {(TOP + H - BOTTOM) / 2:.0f}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    return out


def line_chart(name: str, title: str, series: Sequence[Series], y_label: str, share: bool = False,
               log: bool = False, steps: Sequence[int] = (), x_label: str = "training step") -> str:
    """A line chart of ``series`` against the step as a ``figure.chart``; a None value breaks its
    line; a point with a link is wrapped in ``<a class="val-link">``. ``share``: values are shares,
    drawn on 0..100 %. ``log``: a log10 axis (only when every value is > 0). ``steps``: the x range
    (the page gives every chart the same one)."""
    series = [s for s in series if any(v is not None for _, v, _ in s.points)]
    if not series or any(v is not None and v <= 0 for s in series for _, v, _ in s.points):
        log = False  # a zero gradient norm (no signal in the step) has no place on a log axis: draw it linear
    sc = _scale(series, share, log, steps)
    body = _axes(sc, share, x_label, y_label)
    for k, ser in enumerate(series):
        d, pen = [], "M"
        for s, v, _ in ser.points:
            if v is None:
                pen = "M"
                continue
            d.append(f"{pen}{sc.x(s):.2f},{sc.y(v):.2f}")
            pen = "L"
        dash = ' stroke-dasharray="5 3"' if ser.dashed else ""
        body.append(f'<path class="line" data-series="{escape(ser.label)}" d="{" ".join(d)}" fill="none" '
                    f'stroke="{ser.colour}" stroke-width="{ser.width}"{dash}/>')
        for s, v, href in ser.points:
            if v is None:
                continue
            best = ser.best_step == s
            tip = f"{ser.label}, step {s}: {_fmt(v, share)}" + (" (best validation step)" if best else "")
            if href:
                tip += " — click to open its validation run folder"
            dot = (f'<circle class="pt{" best" if best else ""}" data-series="{escape(ser.label)}" data-step="{s}" '
                   f'data-value="{v!r}" cx="{sc.x(s):.2f}" cy="{sc.y(v):.2f}" r="{5.5 if best else 3}" '
                   f'fill="{ser.colour}"><title>{escape(tip)}</title></circle>')
            body.append(f'<a class="val-link" href="{escape(href)}">{dot}</a>' if href else dot)
    legend = "".join(f'<span><i style="background:{s.colour}"></i>{escape(s.label)}{" (dashed)" if s.dashed else ""}</span>'
                     for s in series)
    empty = "" if series else f'<text class="axis" x="{W / 2}" y="{H / 2}" text-anchor="middle">nothing logged</text>'
    return (f'<figure class="chart" data-chart="{escape(name)}"><figcaption>{escape(title)}</figcaption>'
            f'<div class="legend">{legend}</div>'
            f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}" preserveAspectRatio="xMinYMin meet" '
            f'data-x0="{sc.x0!r}" data-x1="{sc.x1!r}" data-y0="{sc.y0!r}" data-y1="{sc.y1!r}" '
            f'data-log="{int(sc.log)}">{"".join(body)}{empty}</svg></figure>')


# ------------------------------------------------------------------------------ the page


def metric_points(records: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float | None, str | None]]:
    """(step, value, no link) of ``key`` in every step record; a missing or null value is a gap."""
    return [(int(r["step"]), _num(r.get(key)), None) for r in records if isinstance(r.get("step"), int)]


def link(folder: Path, page_dir: Path) -> str:
    """The relative URL of ``folder`` from the page's folder (ends in /)."""
    rel = os.path.relpath(folder.resolve(), page_dir.resolve())
    return quote(Path(rel).as_posix()) + "/"


def page_charts(records: Sequence[dict[str, Any]], points: Sequence[ValPoint], page_dir: Path) -> list[str]:
    """The five charts of the page."""
    keys = {k for r in records for k in r}
    best = best_step(points)
    best_at = best.step if best else None
    ok = [p for p in points if p.avg is not None]
    steps = [int(r["step"]) for r in records] + [p.step for p in ok]  # one x range for the five charts
    reward = metric_points(records, metric_names.SCORE)
    mean5 = moving_average([float("nan") if v is None else v for _, v, _ in reward])
    out = [line_chart("reward", "Mean trajectory reward per training step (critic/score/mean)", [
        Series("reward", PALETTE[0], reward, width=1.0),
        Series("5-step mean", PALETTE[1], [(s, m if math.isfinite(m) else None, None) for (s, _, _), m in zip(reward, mean5)]),
    ], "reward", steps=steps)]
    n = {p.n for p in ok}
    at = f"avg@{n.pop()}" if len(n) == 1 else "avg@n"
    val = [Series(f"{at}, all questions", PALETTE[2], [(p.step, p.avg, link(p.path, page_dir)) for p in ok],
                  width=2.4, best_step=best_at)]
    benches = sorted({b for p in ok for b in p.benchmarks})
    if len(benches) > 1:
        val += [Series(b, PALETTE[(3 + i) % len(PALETTE)], [(p.step, p.benchmarks.get(b), link(p.path, page_dir)) for p in ok],
                       width=1.0) for i, b in enumerate(benches)]
    val.append(Series("training accuracy (critic/acc/mean)", "#98a2b0", metric_points(records, metric_names.ACC), width=1.0))
    out.append(line_chart("validation", f"Validation {at} per step (each point opens its run folder)", val,
                          f"{at} (%)", share=True, steps=steps))
    agents = metric_names.agents_with(keys, metric_names.GRAD_NORM)
    out.append(line_chart("grad-norm", "Gradient norm per agent (pre-clip; agent/<agent>/actor/grad_norm)", [
        Series(a, PALETTE[i % len(PALETTE)], metric_points(records, metric_names.agent(a, metric_names.GRAD_NORM)))
        for i, a in enumerate(agents)], "gradient norm", log=True, steps=steps))
    agents = sorted(set(metric_names.agents_with(keys, metric_names.VALID)) | {a for p in ok for a in p.validity})
    valid = []
    for i, a in enumerate(agents):
        c = PALETTE[i % len(PALETTE)]
        valid.append(Series(f"{a}, training", c, metric_points(records, metric_names.agent(a, metric_names.VALID))))
        valid.append(Series(f"{a}, validation", c, [(p.step, p.validity.get(a), link(p.path, page_dir)) for p in ok],
                            dashed=True))
    out.append(line_chart("validity", "Valid calls per agent: training rollouts and validation", valid,
                          "valid calls (%)", share=True, steps=steps))
    out.append(phase_chart(records, steps))
    return out


def phase_chart(records: Sequence[dict[str, Any]], steps: Sequence[int]) -> str:
    """Seconds per step of each phase (metric_names.PHASES, verl's timer names) and of the whole step;
    a step that did not validate draws its validation at 0, a run that did not log a phase a gap."""
    rs = [r for r in records if isinstance(r.get("step"), int)]

    def points(key: str) -> list[tuple[int, float | None, str | None]]:
        return [(s, 0.0 if v is None and key == metric_names.TIME_TESTING and metric_names.TIME_STEP in r else v, h)
                for r, (s, v, h) in zip(rs, metric_points(rs, key))]
    series = [Series(k.removeprefix("timing_s/"), PALETTE[i % len(PALETTE)], points(k))
              for i, k in enumerate(metric_names.PHASES)]
    series.append(Series("step (all of it)", "#98a2b0", points(metric_names.TIME_STEP), dashed=True))
    return line_chart("phases", "Seconds per training step, by phase (timing_s/*)", series, "seconds", steps=steps)


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def validation_table(points: Sequence[ValPoint], page_dir: Path) -> str:
    """One row per validation folder: avg@n and pass@n (%), per benchmark avg@n when several, each
    agent's valid calls (%), questions x samples, and the link; the best row marked ★."""
    ok = [p for p in points if p.avg is not None]
    benches = sorted({b for p in ok for b in p.benchmarks}) if len({b for p in ok for b in p.benchmarks}) > 1 else []
    agents = sorted({a for p in ok for a in p.validity})
    best = best_step(points)
    head = (["step", "avg@n (%)", "pass@n (%)"] + [f"{b} avg@n (%)" for b in benches]
            + [f"{a} valid (%)" for a in agents] + ["questions × samples", "run folder"])
    rows = []
    for p in points:
        href = escape(link(p.path, page_dir))
        folder = f'<a class="val-row-link" href="{href}">{escape(VAL)}/{escape(p.path.name)}/</a>'
        mark = " ★" if best is not None and p is best else ""
        if p.avg is None:
            rows.append(f'<tr class="unfinished"><th data-label="step">{p.step}</th>'
                        f'<td colspan="{len(head) - 2}">not plotted: {escape(p.note or "no avg@n in its summary")}</td>'
                        f'<td data-label="run folder">{folder}</td></tr>')
            continue
        cells = [_pct(p.avg), _pct(p.pass_n)] + [_pct(p.benchmarks.get(b)) for b in benches] + [_pct(p.validity.get(a)) for a in agents]
        tds = "".join(f'<td class="num" data-label="{escape(h)}">{c}</td>' for h, c in zip(head[1:], cells))
        qn = f"{p.questions if p.questions is not None else '?'} × {p.n if p.n is not None else '?'}"
        rows.append(f'<tr{" class=best" if mark else ""} data-step="{p.step}"><th data-label="step">{p.step}{mark}</th>{tds}'
                    f'<td class="num" data-label="questions × samples">{qn}</td><td data-label="run folder">{folder}</td></tr>')
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f'<table class="report" id="val-table"><thead><tr>{ths}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def best_line(points: Sequence[ValPoint], run: Path, page_dir: Path) -> str:
    """The sentence naming the best validation step (or saying there is none), as HTML."""
    if not points:
        return (f'<p id="best" data-step="">This run has no validation folders ({escape(VAL)}/step_N/ in {escape(str(run))}): '
                "nothing was validated, so no validation step can be named. The charts show the training curves only.</p>")
    best = best_step(points)
    if best is None:
        return '<p id="best" data-step="">No validation folder holds a finished summary yet, so no best step can be named.</p>'
    n = f"avg@{best.n}" if best.n is not None else "avg@n"
    return (f'<p id="best" data-step="{best.step}">Best validation step: <b>{best.step}</b>, {n} '
            f'{_pct(best.avg)} % over {best.questions if best.questions is not None else "?"} questions '
            f'(<a href="{escape(link(best.path, page_dir))}">{escape(VAL)}/{escape(best.path.name)}/</a>); '
            "the highest avg@n over all questions, the earliest of equal ones.</p>")


def run_meta(run: Path, records: Sequence[dict[str, Any]]) -> str:
    """The line under the title: workflow, model, estimator, steps logged (from config.yaml)."""
    try:
        cfg = yaml.safe_load((run / CONFIG).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    algo: dict[str, Any] = cfg["algo"] if isinstance(cfg.get("algo"), dict) else {}
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    parts = [f"workflow {cfg['workflow']}" if cfg.get("workflow") else "", f"model {cfg['model']}" if cfg.get("model") else "",
             f"estimator {algo['estimator']}" if algo.get("estimator") else "", "shared" if cfg.get("shared") else "",
             f"{len(steps)} steps logged (last: {max(steps)})" if steps else "no training step logged yet"]
    return " · ".join(p for p in parts if p)


TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>training run {{ name }}</title>
<style>
  body { font: 13px/1.4 system-ui, sans-serif; margin: 0 16px 40px; color: #1d2430; background: #fafbfc; overflow-wrap: break-word; }
  h1 { font-size: 18px; margin: 14px 0 4px; } h2 { font-size: 15px; margin: 22px 0 4px; }
  .meta { color: #5a6473; } p.meta { margin: 2px 0 8px; max-width: 110ch; }
{% include "report.css.jinja" %}
  .board .charts figure.chart { max-width: 640px; flex-basis: 420px; }
  figure.chart circle.best { stroke: #1d2430; stroke-width: 2; }
  figure.chart a.val-link circle { cursor: pointer; }
  tr.best { background: #eef7f0; } tr.unfinished td { color: #8a6d00; }
</style>
</head>
<body>
<h1>Training run {{ name }}</h1>
<p class="meta">{{ meta }}</p>
{{ best|safe }}
<section class="board">
<div class="charts">{{ charts|safe }}</div>
<h2>Validation steps</h2>
{% if table %}{{ table|safe }}
<p class="meta">Each validation is an evaluation run folder: open one with <code>drmas-bench view {{ val_hint }}</code>.</p>
{% else %}<p class="meta">None: no {{ val_dir }}/step_N/ folder in this run.</p>{% endif %}
</section>
<pre id="test-result" hidden></pre>
<script>
"use strict";
const errors = [];
window.addEventListener("error", e => errors.push(String(e.message)));
// test hook: ?test=1 writes what the page shows into #test-result
(function () {
  const q = new URLSearchParams(location.search);
  if (q.has("test")) {
    const res = {
      charts: [...document.querySelectorAll("figure.chart")].map(f => [f.dataset.chart, f.querySelectorAll("circle.pt").length,
                                                                      f.querySelectorAll("a.val-link").length, f.querySelectorAll("path.line").length]),
      links: [...document.querySelectorAll("a.val-link, a.val-row-link")].map(a => new URL(a.getAttribute("href"), location.href).href),
      best: document.getElementById("best").dataset.step,
      rows: document.querySelectorAll("#val-table tbody tr").length,
      scroll_width: document.documentElement.scrollWidth, inner_width: window.innerWidth, errors};
    document.getElementById("test-result").textContent = JSON.stringify(res);
  }
  document.body.dataset.ready = "1";
})();
</script>
</body>
</html>
"""


def render(run: str | os.PathLike, page_dir: str | os.PathLike | None = None) -> str:
    """The page of training run ``run`` as one HTML string; its links are relative to ``page_dir``
    (where the page will be written; default the run folder)."""
    import jinja2

    run = Path(run)
    check_training_run(run)
    pdir = Path(page_dir) if page_dir is not None else run
    records = [r for r in read_metrics(run) if isinstance(r.get("step"), int)]
    points = validation_points(run)
    if not records and not points:
        raise UserError(f"{run}: no training step logged and no validation folder yet; nothing to draw")
    env = jinja2.Environment(loader=jinja2.ChoiceLoader([
        jinja2.DictLoader({"page": TEMPLATE}), jinja2.FileSystemLoader(Path(report_charts.__file__).parent)]), autoescape=True)
    return env.get_template("page").render(
        name=run.resolve().name, meta=run_meta(run, records), best=best_line(points, run, pdir), charts="".join(page_charts(records, points, pdir)),
        table=validation_table(points, pdir) if points else "", val_dir=VAL, val_hint=f"{run}/{VAL}/step_N")


def write_report(run: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write the page of training run ``run`` to ``out`` (default ``RUN/train_report.html``)."""
    run = Path(run)
    path = Path(out) if out is not None else run / PAGE
    if path.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"--out {path}: the page is HTML; give a file name ending in .html")
    html = render(run, path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, html)
    return path
