"""Small charts as inline SVG strings, for the self-contained HTML pages (`report.view`,
`report.pages`): no JavaScript library, nothing fetched at view time.

Every chart is a ``<figure class="chart" data-chart=NAME>`` holding one ``<svg>`` whose bars are
``<rect class="bar">`` (a point with a CI is a ``<circle class="bar">``), each with a ``<title>``
(the browser's tooltip: the row, the series and the exact figure). The SVG scales to its box
(``viewBox`` + ``width: 100%``), so a chart is never wider than the page.
"""

from __future__ import annotations

from html import escape
from typing import Sequence

PALETTE = ("#4f7fd1", "#d1804f", "#3c9a5f", "#9a5fc0", "#c0a43c", "#4fb3c0", "#c04f7f", "#7f8c3c")
GOOD, BAD, NEUTRAL = "#3c9a5f", "#d1604f", "#98a2b0"

WIDTH = 380  # viewBox width; the label column and the value text take the sides
LABEL_W = 140
VALUE_W = 50
ROW_H = 20


def _svg(name: str, title: str, height: int, body: list[str], legend: Sequence[tuple[str, str]] = ()) -> str:
    leg = ""
    if legend:
        leg = '<div class="legend">' + "".join(
            f'<span><i style="background:{c}"></i>{escape(t)}</span>' for t, c in legend) + "</div>"
    return (f'<figure class="chart" data-chart="{escape(name)}"><figcaption>{escape(title)}</figcaption>{leg}'
            f'<svg viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}" '
            f'preserveAspectRatio="xMinYMin meet">{"".join(body)}</svg></figure>')


def _text(x: float, y: float, s: str, anchor: str = "start", cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{c}>{escape(s)}</text>'


def _clip(s: str, n: int = 21) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def bars(name: str, title: str, rows: Sequence[tuple[str, Sequence[tuple[str, float | None, str]]]],
         fmt=lambda v: f"{v:.2f}", max_value: float | None = None, legend: Sequence[tuple[str, str]] = ()) -> str:
    """Horizontal bars: ``rows`` is [(row label, [(series, value, colour), ...])]; a row with several
    series draws them as thin bars under one another. A value None draws no bar ("–"). A row whose
    series list is empty is a group heading (bold, no bar)."""
    vals = [v for _, ser in rows for _, v, _ in ser if v is not None]
    top = max_value if max_value is not None else max(vals, default=0.0)
    top = top if top > 0 else 1.0
    span = WIDTH - LABEL_W - VALUE_W
    body, y, group = [], 4, ""
    for lab, ser in rows:
        if not ser:
            group = lab
            body.append(_text(0, y + 14, _clip(lab, 40), cls="group"))
            y += ROW_H
            continue
        h = 14 if len(ser) == 1 else 11  # several series: thin bars, each still tall enough for its value
        body.append(_text(LABEL_W - 6, y + (h * len(ser)) / 2 + 5, _clip(lab), "end"))
        for i, (s, v, colour) in enumerate(ser):
            yy = y + i * h
            w = 0.0 if v is None else span * max(0.0, v) / top
            tip = f"{group + ' · ' if group else ''}{lab}{' · ' + s if s else ''}: {'–' if v is None else fmt(v)}"
            body.append(f'<rect class="bar" x="{LABEL_W}" y="{yy:.1f}" width="{w:.1f}" height="{h - 1}" '
                        f'fill="{colour}"><title>{escape(tip)}</title></rect>')
            body.append(_text(LABEL_W + w + 4, yy + h - 2, "–" if v is None else fmt(v), cls="val"))
        y += max(ROW_H, h * len(ser) + 4)
    return _svg(name, title, y + 4, body, legend)


def ci_points(name: str, title: str, rows: Sequence[tuple[str, float | None, Sequence[float] | None]],
              colour: str = PALETTE[0]) -> str:
    """Points on a 0..100% axis with their CI as whiskers: ``rows`` is [(label, share, (lo, hi) or
    None)]; each point is a ``circle.bar``."""
    span = WIDTH - LABEL_W - VALUE_W
    x = lambda v: LABEL_W + span * max(0.0, min(1.0, v))  # noqa: E731
    body, y = [], 4
    for t in (0, 0.25, 0.5, 0.75, 1.0):
        body.append(f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="0" y2="{len(rows) * ROW_H + 4}"/>')
    for lab, v, ci in rows:
        mid = y + ROW_H / 2
        body.append(_text(LABEL_W - 6, mid + 4, _clip(lab), "end"))
        if v is None or v != v:
            body.append(_text(LABEL_W + 4, mid + 4, "–", cls="val"))
            y += ROW_H
            continue
        tip = f"{lab}: {100 * v:.1f}%"
        if ci and all(c is not None and c == c for c in ci):
            body.append(f'<line class="whisker" x1="{x(ci[0]):.1f}" x2="{x(ci[1]):.1f}" y1="{mid:.1f}" y2="{mid:.1f}"/>'
                        f'<line class="whisker" x1="{x(ci[0]):.1f}" x2="{x(ci[0]):.1f}" y1="{mid - 4:.1f}" y2="{mid + 4:.1f}"/>'
                        f'<line class="whisker" x1="{x(ci[1]):.1f}" x2="{x(ci[1]):.1f}" y1="{mid - 4:.1f}" y2="{mid + 4:.1f}"/>')
            tip += f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
        body.append(f'<circle class="bar" cx="{x(v):.1f}" cy="{mid:.1f}" r="4.5" fill="{colour}">'
                    f'<title>{escape(tip)}</title></circle>')
        body.append(_text(WIDTH - VALUE_W + 6, mid + 4, f"{100 * v:.1f}%", cls="val"))
        y += ROW_H
    axis = len(rows) * ROW_H + 18
    for t in (0, 0.5, 1.0):
        body.append(_text(x(t), axis, f"{int(100 * t)}%", "middle", cls="axis"))
    return _svg(name, title, axis + 4, body)


def scatter(name: str, title: str, points: Sequence[tuple[str, float, float, bool]], x_label: str, y_label: str,
            x_fmt=lambda v: f"{v:.3g}") -> str:
    """A scatter of (label, x, y share, on the Pareto front) with the front joined by a line; each
    point a ``circle.bar``. y is a share drawn on 0..100%."""
    left, right, top, bottom, height = 48, 20, 10, 40, 300
    xs = [p[1] for p in points]
    lo, hi = (min(xs, default=0.0), max(xs, default=1.0))
    if hi <= lo:
        lo, hi = lo - 1, hi + 1
    pad = (hi - lo) * 0.08
    lo, hi = lo - pad, hi + pad
    sx = lambda v: left + (WIDTH - left - right) * (v - lo) / (hi - lo)  # noqa: E731
    sy = lambda v: top + (height - top - bottom) * (1 - max(0.0, min(1.0, v)))  # noqa: E731
    body = [f'<line class="grid" x1="{left}" x2="{WIDTH - right}" y1="{sy(t):.1f}" y2="{sy(t):.1f}"/>'
            + _text(left - 4, sy(t) + 4, f"{int(100 * t)}%", "end", cls="axis") for t in (0, 0.25, 0.5, 0.75, 1.0)]
    for t in (lo + pad, (lo + hi) / 2, hi - pad):
        body.append(_text(sx(t), height - bottom + 16, x_fmt(t), "middle", cls="axis"))
    body.append(_text((left + WIDTH - right) / 2, height - 6, x_label, "middle", cls="axis"))
    body.append(f'<text class="axis" transform="translate(12 {(top + height - bottom) / 2:.0f}) rotate(-90)" '
                f'text-anchor="middle">{escape(y_label)}</text>')
    front = sorted((p for p in points if p[3]), key=lambda p: p[1])
    if len(front) > 1:
        body.append('<polyline class="front" points="' + " ".join(f"{sx(p[1]):.1f},{sy(p[2]):.1f}" for p in front) + '"/>')
    for i, (lab, xv, yv, on) in enumerate(points):
        body.append(f'<circle class="bar{" on-front" if on else ""}" cx="{sx(xv):.1f}" cy="{sy(yv):.1f}" r="5" '
                    f'fill="{GOOD if on else NEUTRAL}"><title>{escape(f"{lab}: {100 * yv:.1f}% at {x_fmt(xv)}")}'
                    f'{" (on the front)" if on else ""}</title></circle>')
        right = sx(xv) > WIDTH / 2  # a label on the right half reads leftwards, so it stays inside the plot
        body.append(_text(sx(xv) + (-7 if right else 7), sy(yv) - 8, _clip(lab, 26), "end" if right else "start", cls="val"))
    return _svg(name, title, height, body)
