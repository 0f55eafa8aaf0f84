"""The report half of the run viewer as HTML: one table per question a reader asks of a run's
summary, with human labels (`report.labels`) and inline SVG charts (`report.charts`).

- How good: score per benchmark with its 95% CI (table + points with whiskers).
- Why: protocol compliance per agent (table + valid / each reason's share per agent, and every
  figure the agent's rule reads under its own label), what an episode did, and the workflow's
  effects block, whatever figures it declares (`labels.effect_blocks`).
- At what cost: calls, tokens and dollars per agent (table + calls and tokens bars).
- Where the time went: call latency per agent, trajectory latency per benchmark (table + bars).
- For two runs, what changed question by question: fixed, broken, unchanged (bars + the list).

Each figure is in one table only. Tables carry ``data-label`` on their cells, so a narrow screen
shows each row as a card of "label: value" lines instead of scrolling sideways (the page's CSS).
Everything is computed before: the summary comes from `metrics.summarize`, the per-question
counts from `metrics.questions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any, Iterable, Sequence

from drmas_bench.metrics import QA_KEYS, questions
from drmas_bench.report import charts
from drmas_bench.report.labels import (
    USD_SOURCES,
    caption,
    effect_blocks,
    effect_note,
    figure_value,
    label,
    pct,
    rule_figure_keys,
    rule_words,
    value,
    with_ci,
)


@dataclass(frozen=True)
class Td:
    """One cell: its text, a tooltip, and whether it is a number (right-aligned)."""

    text: str
    tip: str = ""
    num: bool = False


def _cell(c: Any) -> Td:
    return c if isinstance(c, Td) else Td(str(c))


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], name: str = "", first_is_head: bool = True) -> str:
    """An HTML table; every cell carries its column's label (``data-label``) for the narrow layout."""
    h = "".join(f"<th>{escape(x)}</th>" for x in head)
    body = []
    for r in rows:
        cells = []
        for i, c in enumerate(r):
            c = _cell(c)
            tip = f' title="{escape(c.tip)}"' if c.tip else ""
            cls = ' class="num"' if c.num else ""
            tag = "th" if i == 0 and first_is_head else "td"
            cells.append(f'<{tag}{cls}{tip} data-label="{escape(head[i])}">{escape(c.text)}</{tag}>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    nm = f' data-table="{escape(name)}"' if name else ""
    return f'<table class="report"{nm}><thead><tr>{h}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _num(text: str, tip: str = "") -> Td:
    return Td(text, tip, True)


def _h(title: str) -> str:
    return f"<h3>{escape(title)}</h3>"


def _note(text: str) -> str:
    return f'<p class="meta">{escape(text)}</p>'


def _side(tables: str, figures: Sequence[str]) -> str:
    """Tables and their charts side by side where the box is wide enough, else one under the other."""
    c = f'<div class="charts">{"".join(figures)}</div>' if figures else ""
    return f'<div class="q"><div class="tables">{tables}</div>{c}</div>'


def _blocks(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(row label, block) for every benchmark, the micro block and, with several benchmarks, the macro one."""
    bs = summary.get("benchmarks") or {}
    out = [(b, blk) for b, blk in bs.items()]
    if summary.get("micro"):
        out.append((label("micro"), summary["micro"]))
    if len(bs) > 1 and summary.get("macro"):
        out.append((label("macro"), summary["macro"]))
    return out


def _n_text(blk: dict[str, Any]) -> str:
    if blk.get("n_varies"):
        return f"{blk['n_min']}..{blk['n_max']}"
    return str(blk.get("n", "–"))


# ------------------------------------------------------------------------------ how good


def scores(summary: dict[str, Any]) -> str:
    """Score per benchmark with CIs: the table (pass^n and QA columns where the summary has them)
    and the avg@n chart (and pass@n, when it differs)."""
    rows_src = _blocks(summary)
    if not rows_src:
        return ""
    has = lambda k: any(k in blk for _, blk in rows_src)  # noqa: E731
    score_keys = [k for k in ("avg@n", "pass@n", "pass^n") if has(k)]
    qa = [k for k in QA_KEYS if has(k)]
    head = ["benchmark", label("questions"), label("n")] + [f"{label(k)} [95% CI]" for k in score_keys] + [label(k) for k in qa]
    rows = []
    for name, blk in rows_src:
        ci = blk.get("ci95") or {}
        rows.append([name, _num(str(blk.get("questions", "–"))), _num(_n_text(blk)) if "n" in blk else "–"]
                    + [_num(with_ci(blk.get(k), ci.get(k))) for k in score_keys]
                    + [_num(pct(blk.get(k))) for k in qa])
    avg = [(name, blk.get("avg@n"), (blk.get("ci95") or {}).get("avg@n")) for name, blk in rows_src]
    figures = [charts.ci_points("score-avg", f"{label('avg@n')}: {caption('score_chart')}", avg)]
    if any(blk.get("pass@n") != blk.get("avg@n") for _, blk in rows_src):
        pas = [(name, blk.get("pass@n"), (blk.get("ci95") or {}).get("pass@n")) for name, blk in rows_src]
        figures.append(charts.ci_points("score-pass", f"{label('pass@n')}: {caption('score_chart')}", pas, charts.PALETTE[2]))
    return _h(caption("scores")) + _side(table(head, rows, "scores"), figures)


# ------------------------------------------------------------------------------ why


def _counts_text(d: dict[str, Any] | None, own: dict[str, str] | None = None) -> str:
    return ", ".join(f"{label(str(k), own)}: {v}" for k, v in (d or {}).items() if v) or "none"


def rule_figures_text(entry: dict[str, Any], own: dict[str, str]) -> str:
    """An agent's figures its format rule read (actions, verdicts, any other it declares), each under
    its own label: ``actions: search 3, answer 1; ended on a tagged answer (%): 25.0``."""
    return "; ".join(f"{label(k, own)}: {value(k, entry[k], own)}" for k in rule_figure_keys(entry)) or "–"


def compliance(comp: dict[str, Any] | None, colours: dict[str, str]) -> str:
    """Protocol compliance per agent: the table and the valid / reasons chart."""
    if not comp or not comp.get("agents"):
        return ""
    wf = comp.get("workflow")
    own = rule_words(comp)
    head = ["agent", label("calls"), label("valid_rate"), label("invalid_reasons"), label("length_cut"),
            label("empty_responses"), label("rule_figures")]
    rows: list[list[Any]] = []
    bars: list[tuple[str, list[tuple[str, float | None, str]]]] = []
    for a, v in comp["agents"].items():
        valid = pct(v.get("valid_rate"), 0)
        tip = f"{v.get('valid', '–')} of {v.get('calls', '–')} calls recorded valid"
        if v.get("valid_by_rules_rate") is not None and v.get("valid_by_rules") != v.get("valid"):
            valid += f" ({label('valid_by_rules')}: {pct(v['valid_by_rules_rate'], 0)})"
        rows.append([a, _num(str(v.get("calls", "–"))), _num(valid, tip), _counts_text(v.get("invalid_reasons"), own),
                     _num(str(v.get("length_cut", 0))), _num(str(v.get("empty_responses", 0))), rule_figures_text(v, own)])
        calls = v.get("calls") or 0
        bars.append((f"{a} ({calls} calls)", []))
        bars.append(("valid", [("", v.get("valid_rate"), charts.GOOD)]))
        for reason, k in (v.get("invalid_reasons") or {}).items():
            if k:
                bars.append((label(reason, own), [("", k / calls if calls else None, charts.BAD)]))
    out = [_h(caption("compliance", wf)),
           _side(table(head, rows, "compliance"), [charts.bars("compliance", caption("compliance_chart"), bars,
                                                          fmt=lambda x: f"{100 * x:.0f}%", max_value=1.0)])]
    return "".join(out)


def episodes(comp: dict[str, Any] | None) -> str:
    """What an episode did (compliance.episodes: the figures the workflow's rules declare), a figure
    per row, each under its own label."""
    ep = (comp or {}).get("episodes") or {}
    own = rule_words(comp)
    out = []
    if len(ep) > 1:
        erows = [[label(k, own), _num(value(k, x, own))] for k, x in ep.items()]
        out += [_h(caption("episodes", (comp or {}).get("workflow"))), table(["figure", "per episode"], erows, "episodes")]
    return "".join(out)


def _transposed(blocks: list[tuple[str, dict[str, Any]]], keys: Sequence[str], name: str,
                own: dict[str, str] | None = None) -> str:
    """A figure per row, a benchmark per column: narrow whatever the number of figures."""
    head = ["figure"] + [b for b, _ in blocks]
    rows = [[label(k, own)] + [_num(value(k, figure_value(blk, k), own)) for _, blk in blocks] for k in keys]
    return table(head, rows, name)


def effects(eff: dict[str, Any] | None) -> str:
    """The workflow's own effects block, whatever it declares (`labels.effect_blocks`: its figures in
    their order and words, then any other key of the block), per benchmark and over all records, with
    its declared note; the per-agent figures of ``effects.agents`` are in the cost and time tables."""
    if not eff:
        return ""
    out = []
    for key, blocks, keys, own in effect_blocks(eff):
        out += [_h(caption("effects", eff.get("workflow"))), _transposed(blocks, keys, f"effects-{key}", own)]
        note = effect_note(eff.get("workflow"), blocks[-1][1], own)
        out += [_note(note)] if note else []
    return "".join(out)


def other_blocks(summary: dict[str, Any]) -> str:
    """Any other summary block with per-agent entries (beyond compliance and effects), drawn the same
    way: a row per agent, its figures labelled."""
    out = []
    for name, blk in summary.items():
        if name in ("micro", "macro", "benchmarks", "compliance", "effects") or not isinstance(blk, dict):
            continue
        agents = blk.get("agents")
        if not isinstance(agents, dict) or not agents:
            continue
        cols: list[str] = []
        for v in agents.values():
            cols += [k for k in (v or {}) if k not in cols]
        rows = [[a] + [_num(value(k, (v or {}).get(k))) for k in cols] for a, v in agents.items()]
        title = (caption("block", blk["workflow"], name=label(name).capitalize()) if blk.get("workflow")
                 else f"{label(name).capitalize()}, per agent")
        out += [_h(title),
                table(["agent"] + [label(k) for k in cols], rows, f"block-{name}")]
    return "".join(out)


# ------------------------------------------------------------------------------ at what cost, where the time went


def _agent_order(agents: dict[str, Any], order: Sequence[str]) -> list[str]:
    return [a for a in order if a in agents] + [a for a in agents if a not in order]


def cost(summary: dict[str, Any], order: Sequence[str], colours: dict[str, str], models: dict[str, str]) -> str:
    """Calls, tokens and dollars per agent (micro block): table, calls and tokens bars."""
    agents = (summary.get("micro") or {}).get("agents") or {}
    if not agents:
        return ""
    names = _agent_order(agents, order)
    priced = any("usd_per_question" in v for v in agents.values())
    unknown = any(v.get("usage_unknown_calls") for v in agents.values())
    head = ["agent", label("model"), label("calls"), label("calls_per_traj"), label("prompt_tokens_per_call"),
            label("completion_tokens_per_call"), label("tokens_per_question")]
    head += [label("usd_per_question")] if priced else []
    head += [label("usage_unknown_calls")] if unknown else []
    rows = []
    for a in names:
        v = agents[a]
        wg = ", ".join(v.get("models") or [])
        r = [a, Td(models.get(a) or wg or "–", f"{label('worker_group')}: {wg}"), _num(str(v.get("calls", "–"))),
             _num(value("calls_per_traj", v.get("calls_per_traj"))),
             _num(value("", v.get("prompt_tokens_per_call"))), _num(value("", v.get("completion_tokens_per_call"))),
             _num("unknown" if v.get("tokens_per_question") is None else f"{v['tokens_per_question']:.0f}")]
        if priced:
            r.append(_num("unknown" if v.get("usage_unknown_calls") else value("usd_per_question", v.get("usd_per_question"))))
        if unknown:
            r.append(_num(str(v.get("usage_unknown_calls", 0))))
        rows.append(r)
    tables = table(head, rows, "cost")
    micro = summary.get("micro") or {}
    if priced:
        tables += _note(f"{label('usd_per_question')}, all agents: {value('usd_per_question', micro.get('usd_per_question'))}"
                        + (f" ($ from {USD_SOURCES.get(micro['usd_source'], micro['usd_source'])})"
                           if micro.get("usd_source") else ""))
    calls = [(a, [("", agents[a].get("calls_per_traj"), colours.get(a, charts.PALETTE[0]))]) for a in names]
    tokens = [(a, [("prompt", agents[a].get("prompt_tokens_per_call"), colours.get(a, charts.PALETTE[0])),
                   ("completion", agents[a].get("completion_tokens_per_call"), charts.NEUTRAL)]) for a in names]
    return _h(caption("cost")) + _side(tables, [
        charts.bars("agent-calls", caption("calls_chart"), calls),
        charts.bars("agent-tokens", "Tokens per call: prompt (agent's colour) and completion (grey)", tokens,
               fmt=lambda x: f"{x:.0f}")])


def time(summary: dict[str, Any], order: Sequence[str], colours: dict[str, str]) -> str:
    """Call latency per agent and trajectory latency per benchmark: tables and the per-agent bars."""
    agents = (summary.get("micro") or {}).get("agents") or {}
    names = _agent_order(agents, order)
    tables, figures = "", []
    if names:
        rows = [[a, _num(value("latency_s", agents[a].get("latency_s")))] for a in names]
        tables += table(["agent", label("call_latency_s")], rows, "time-agents")
    blocks = _blocks(summary)
    if blocks:
        rows = [[b, _num(value("latency_s", blk.get("latency_s")))] for b, blk in blocks]
        tables += table(["benchmark", label("trajectory_latency_s")], rows, "time-benchmarks")
    if names:
        lat = [(a, [("p50", (agents[a].get("latency_s") or {}).get("p50"), colours.get(a, charts.PALETTE[0])),
                    ("p95", (agents[a].get("latency_s") or {}).get("p95"), charts.NEUTRAL)]) for a in names]
        figures.append(charts.bars("agent-latency", caption("latency_chart") + ": p50 in the agent's colour, p95 grey", lat,
                             fmt=lambda x: f"{x:.2f} s"))
    return _h(caption("time")) + _side(tables, figures)


def run_report(summary: dict[str, Any], order: Sequence[str], colours: dict[str, str], models: dict[str, str]) -> str:
    """Every section of one run's summary, in the order a reader asks: how good, why, cost, time."""
    return (f'<section class="good">{scores(summary)}</section>'
            f'<section class="why">{compliance(summary.get("compliance"), colours)}'
            f'<div class="q"><div class="tables">{episodes(summary.get("compliance"))}</div>'
            f'<div class="tables">{effects(summary.get("effects"))}</div></div>{other_blocks(summary)}</section>'
            f'<section class="cost">{cost(summary, order, colours, models)}</section>'
            f'<section class="time">{time(summary, order, colours)}</section>')


# ------------------------------------------------------------------------------ two runs


@dataclass(frozen=True)
class Change:
    benchmark: str
    id: str
    question: str
    a: tuple[int, int]  # (correct samples, samples) in run A
    b: tuple[int, int]

    @property
    def kind(self) -> str:
        """fixed: never solved in A, solved at least once in B; broken: the other way; else unchanged."""
        if self.a[0] == 0 and self.b[0] > 0:
            return "fixed"
        if self.a[0] > 0 and self.b[0] == 0:
            return "broken"
        return "unchanged"


def changes(records_a: Sequence[Any], records_b: Sequence[Any]) -> list[Change]:
    """Per shared question (same benchmark and id), its correct samples in A and in B."""
    qa, qb = questions(records_a), questions(records_b)
    return [Change(k[0], k[1], qa[k].text, (qa[k].c, qa[k].n), (qb[k].c, qb[k].n)) for k in qa if k in qb]


def changes_report(cs: Sequence[Change], name_a: str, name_b: str, listed: int = 40) -> str:
    """The change list of two runs: counts as bars, then the fixed and broken questions."""
    if not cs:
        return _h(caption("changes")) + _note("The two runs share no question (same benchmark and id).")
    count = {k: sum(c.kind == k for c in cs) for k in ("fixed", "broken", "unchanged")}
    colour = {"fixed": charts.GOOD, "broken": charts.BAD, "unchanged": charts.NEUTRAL}
    bars = [(label(k), [("", float(count[k]), colour[k])]) for k in count]
    head = _h(caption("changes")) + _note(f"A: {name_a}; B: {name_b}; {len(cs)} questions in both. A question is "
                                          "solved when at least one of its samples is correct: fixed = solved in B "
                                          "only, broken = solved in A only, unchanged = both or neither.")
    lists = []
    for kind in ("fixed", "broken"):
        items = [c for c in cs if c.kind == kind]
        if not items:
            continue
        rows = [[f"{c.benchmark} {c.id}", _num(f"{c.a[0]}/{c.a[1]}"), _num(f"{c.b[0]}/{c.b[1]}"),
                 Td(c.question if len(c.question) <= 90 else c.question[:89] + "…", c.question)]
                for c in items[:listed]]
        more = f" (the first {listed} listed)" if len(items) > listed else ""
        lists += [f'<h4>{escape(label(kind))}: {len(items)}{escape(more)}</h4>',
                  table(["question", "A correct", "B correct", "text"], rows, f"changes-{kind}")]
    chart = charts.bars("changes", caption("changes_chart"), bars, fmt=lambda x: f"{x:.0f}")
    out = [head, _side("".join(lists) or _note("No question was fixed or broken."), [chart])]
    return "".join(out)

