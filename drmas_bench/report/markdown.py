"""Markdown rendering of run summaries, leaderboards, paired comparisons and cost studies. Numbers
come in computed (drmas_bench.metrics, report.leaderboard / compare / cost); this module only formats.

- `format_summary_markdown(summary)`: a run's summary.json as tables (accuracy with CIs, cost and
  latency, agents, protocol compliance, per-agent effects, notes); `compliance_markdown` and
  `effects_markdown` are its compliance and effects sections, drawing whatever the workflow and its
  rules declare (`drmas_bench.figures`) under the declared words.
- `table_markdown(table, ci)`, `leaderboard_markdown(tables, ci)`: leaderboard sections.
- `compare_markdown(comparison, max_flips)`: a paired comparison and its flipped questions.
- `cost_markdown(costs, prices_source, unpriced)`: a cost study's team and per-agent tables.
- `run_summary_markdown(summary)`: a finished eval's summary.md: `format_summary_markdown` plus the
  run's prompts line (`protocol_markdown`), call-cache lines (`cache_markdown`) and what the server
  engines learned about their servers (`engine_notes_markdown`).
- `sweep_markdown(doc)`: an assignment sweep's sweep.md.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from tabulate import tabulate

from drmas_bench.figures import shown_keys
from drmas_bench.metrics import MACRO, MICRO, QA_KEYS
from drmas_bench.report.compare import Comparison
from drmas_bench.report.cost import TeamCost, cost_notes
from drmas_bench.report.labels import (
    USD_SOURCES,
    Words,
    caption,
    effect_blocks,
    effect_note,
    figure_value,
    label,
    rule_figure_keys,
    rule_words,
    value,
)
from drmas_bench.report.tables import Cell, Table


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or x != x else f"{100 * x:.{digits}f}"


def _cell_text(c: Cell | None, ci: bool) -> str:
    if c is None or c.value is None:
        return "–"
    if ci and c.ci is not None and all(v == v for v in c.ci):
        return f"{_pct(c.value)} [{_pct(c.ci[0])}, {_pct(c.ci[1])}]"
    return _pct(c.value)


def table_markdown(t: Table, ci: bool = False) -> str:
    """A Table as a Markdown section (heading, caption, tabulate github table)."""

    head = ["run", "model", "team", "estimator", "step", "n", "sampling"] + t.columns + ["agents' effect", "notes"]
    body = [[r.label, r.model, r.team, r.estimator, r.step, r.n, r.sampling]
            + [_cell_text(r.cells.get(c), ci) for c in t.columns] + [r.effect, "; ".join(r.notes) or "–"]
            for r in t.rows]
    return "\n".join([f"## {t.suite}: {t.metric}", "", f"{t.caption}.", "",
                      tabulate(body, head, tablefmt="github", disable_numparse=True)]) + "\n"


def leaderboard_markdown(tables: Sequence[Table], ci: bool = False) -> str:
    return "# Leaderboard\n\n" + "\n".join(table_markdown(t, ci) for t in tables)


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _p(p: float) -> str:
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"


def compare_markdown(cmp: Comparison, max_flips: int = 50) -> str:
    """The comparison as Markdown: a table per benchmark + pooled, then the flipped questions."""

    a, b = cmp.a, cmp.b
    head = ["benchmark", "shared questions", "A avg@n", "B avg@n", "Δ avg (pts) [95% CI]", "A pass@k", "B pass@k",
            "Δ pass (pts) [95% CI]", "k", "B better / A better / tied", "sign test p", "flips (B only / A only)"]
    body = []
    for r in cmp.benchmarks + [cmp.pooled]:
        fb = sum(1 for f in r.flips if f.direction == "B only")
        body.append([r.name, r.shared, _pct(r.avg_a), _pct(r.avg_b),
                     f"{_pts(r.avg_diff)} [{_pts(r.avg_ci[0])}, {_pts(r.avg_ci[1])}]",
                     _pct(r.pass_a), _pct(r.pass_b), f"{_pts(r.pass_diff)} [{_pts(r.pass_ci[0])}, {_pts(r.pass_ci[1])}]",
                     r.k_pass, f"{r.b_better} / {r.a_better} / {r.ties}", _p(r.sign_p), f"{fb} / {len(r.flips) - fb}"])
    lines = [
        "# Paired comparison: B vs A", "",
        f"- A: `{a.name}` ({a.model_label}; {a.team_label}; n={a.n}; {a.sampling_label}; seed {a.seed})",
        f"- B: `{b.name}` ({b.model_label}; {b.team_label}; n={b.n}; {b.sampling_label}; seed {b.seed})", "",
        "Differences are B - A in percentage points over the questions both runs answered (same benchmark "
        f"and task id). CIs: paired bootstrap over questions, {cmp.n_boot} resamples, seed {cmp.seed}. Sign test: "
        "exact two-sided binomial over questions whose per-question success rate differs. pass@k uses the "
        "unbiased estimator at k = the smaller n. A flip is a question solved at least once in one run and "
        "never in the other.", "",
        tabulate(body, head, tablefmt="github", disable_numparse=True), "",
    ]
    if cmp.notes:
        lines += [*[f"- {n}" for n in cmp.notes], ""]
    lines += compare_effects_markdown(cmp)
    flips = [f for r in cmp.benchmarks for f in r.flips]
    lines += [f"## Flipped questions ({len(flips)})", ""]
    if flips:
        fl = [[f.benchmark, f.id, f.direction, f"{f.a[0]}/{f.a[1]}", f"{f.b[0]}/{f.b[1]}", _clip(f.question, 70)]
              for f in flips[:max_flips]]
        lines.append(tabulate(fl, ["benchmark", "task id", "solved by", "A correct/n", "B correct/n", "question"],
                              tablefmt="github", disable_numparse=True))
        if len(flips) > max_flips:
            lines.append(f"\n... and {len(flips) - max_flips} more (raise --max-flips to list them)")
    else:
        lines.append("none")
    return "\n".join(lines) + "\n"


def compare_effects_markdown(cmp: Comparison) -> list[str]:
    """The effects blocks the two runs' workflows declare (`compare.effects_sides`), a figure per row
    in its declared order and words, A and B side by side; [] when neither declares one."""
    lines: list[str] = []
    for side in cmp.effects:
        blocks = [blk for blk in (side.a, side.b) if blk is not None]
        keys = shown_keys(blocks, side.words)
        cell = lambda blk, k: "–" if blk is None else _md_value(k, figure_value(blk, k), side.words)  # noqa: E731
        rows = [[md_label(k, side.words), cell(side.a, k), cell(side.b, k)] for k in keys]
        lines += [f"## {caption('effects', side.workflow)}", "",
                  tabulate(rows, ["figure", "A", "B"], tablefmt="github", disable_numparse=True), ""]
    return lines


def _clip(s: str, width: int) -> str:
    s = " ".join(str(s).split()).replace("|", "\\|")
    return s if len(s) <= width else s[: width - 1] + "…"


def _rel(x: float | None, base: float | None) -> str:
    if x is None or base is None:  # an unknown cost: no relative figure (never "-100%")
        return "unknown"
    if base == 0:
        return "–" if x == 0 else "n/a (base 0)"
    return f"{100 * (x - base) / base:+.1f}%"


def _usd(x: float | None) -> str:
    if x is None:
        return "unknown"
    if x == 0:
        return "0"
    return f"{x:.4f}" if abs(x) >= 0.01 else f"{x:.3g}"


def cost_markdown(costs: Sequence[TeamCost], prices_source: str = "the price sheet", unpriced: Iterable[str] = ()) -> str:
    """The study as Markdown: the team table (relative to the first team) and per-agent breakdowns."""

    base = costs[0]
    head = ["team", "model", "questions x n", "avg@n (%)", "Δ avg (pts)", "pass@n (%)", "latency p50 (s)",
            "latency p95 (s)", "Δ p50", "summed call latency (s)", "Δ call latency", "tokens / question",
            "$ / 1k questions", "Δ $"]
    body = []
    for c in costs:
        body.append([c.label, c.run.model_label, f"{c.questions} x {c.run.n}", _pct(c.avg),
                     "–" if c is base else _pts(c.avg - base.avg), _pct(c.pass_n),
                     f"{c.latency_p50:.2f}", f"{c.latency_p95:.2f}", "–" if c is base else _rel(c.latency_p50, base.latency_p50),
                     f"{c.call_latency_mean:.2f}", "–" if c is base else _rel(c.call_latency_mean, base.call_latency_mean),
                     f"{c.tokens / c.trajectories:.1f}", _usd(c.usd_per_1k),
                     "–" if c is base else _rel(c.usd_per_1k, base.usd_per_1k)])
    lines = [
        "# Cost study", "",
        f"Relative columns (Δ) compare with the first team, `{base.label}`. A question = one trajectory (one "
        "answered question); latency = the trajectory's wall time (p50/p95) and the mean of its calls' summed "
        f"latencies; dollars recomputed from every call's recorded tokens with {prices_source} and the model of "
        "the call's worker group.", "",
        tabulate(body, head, tablefmt="github", disable_numparse=True), "",
        "## Per-agent breakdown", "",
        "Tokens and dollars per agent over the whole run; each team's `total` line is the sum of its agents "
        "(dollars rounded for display only).", "",
    ]
    ag_head = ["team", "agent", "priced as", "calls", "prompt tokens", "completion tokens", "tokens / question",
               "$ (run)", "$ / 1k questions", "share of $"]
    rows = []
    for c in costs:
        for a, ac in c.agents.items():
            share = "–" if c.usd == 0 or c.unknown_calls else f"{100 * float(ac.usd / c.usd):.1f}%"
            mark = f" ({ac.unknown_calls} calls unknown)" if ac.unknown_calls else ""
            rows.append([c.label, a, ", ".join(ac.price_keys) or "–", ac.calls, f"{ac.prompt_tokens}{mark}",
                         f"{ac.completion_tokens}{mark}", f"{ac.tokens / c.trajectories:.1f}{mark}",
                         _usd(float(ac.usd) if ac.known else None), _usd(c.agent_usd_per_1k(a)), share])
        mark = f" ({c.unknown_calls} calls unknown)" if c.unknown_calls else ""
        rows.append([c.label, "**total**", "", sum(x.calls for x in c.agents.values()), f"{c.prompt_tokens}{mark}",
                     f"{c.completion_tokens}{mark}", f"{c.tokens / c.trajectories:.1f}{mark}",
                     _usd(None if c.unknown_calls else float(c.usd)), _usd(c.usd_per_1k),
                     "100%" if c.usd and not c.unknown_calls else "–"])
    lines.append(tabulate(rows, ag_head, tablefmt="github", disable_numparse=True))
    notes = cost_notes(costs)
    for c in costs:
        if c.unknown_calls:
            notes.append(f"{c.label}: {c.unknown_calls} calls came back without token usage (and no tokenizer "
                         "counted them): their tokens and dollars are unknown, and so are the team's totals")
    unpriced = sorted(set(unpriced))
    if unpriced:
        notes.append(f"unpriced models (costed at $0 by the sheet's `default: zero`): {', '.join(unpriced)}")
    if notes:
        lines += ["", "Notes:", "", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ run summaries


def _with_ci(x: float, ci: Sequence[float] | None) -> str:
    if ci is None or any(v != v for v in ci):  # NaN
        return _pct(x)
    return f"{_pct(x)} [{_pct(ci[0])}, {_pct(ci[1])}]"


def _usd_sig(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def _unknown_calls(d: dict[str, Any]) -> int:
    """Calls without usage in a summary block ({usage: {...}}) or agent entry (usage_unknown_calls)."""
    return int(d.get("usage_unknown_calls") or (d.get("usage") or {}).get("unknown") or 0)


def _usd_known(x: float | None, d: dict[str, Any]) -> str:
    """A dollar figure, or `unknown (K calls without usage)` where a call had no usage."""
    k = _unknown_calls(d)
    return f"unknown ({k} calls without usage)" if k else _usd_sig(x)


def _tokens(x: float | None, d: dict[str, Any]) -> str:
    """Tokens per call (over the calls with known usage), marked when some were unknown."""
    if x is None:
        return "unknown"
    k = _unknown_calls(d)
    return f"{x:.0f}" + (f" ({k} calls unknown)" if k else "")


def _n_cell(blk: dict[str, Any]) -> str:
    """The n column: n, or `min..max *` when samples per question are uneven (see the notes)."""
    if blk.get("n_varies"):
        return f"{blk['n_min']}..{blk['n_max']} *"
    return str(blk.get("n", "–"))


def _summary_header(summary: dict[str, Any]) -> list[str]:
    """The title of a run's summary.md: suite and benchmarks, model(s), date, so a file found later
    says what it measured. Empty for a bare `metrics.summarize` result (no ``run`` block)."""
    run = summary.get("run") or {}
    team = run.get("team") or {}
    if not team:
        return []
    models = list(dict.fromkeys(t["model"] for t in team.values()))
    prov = summary.get("provenance") or {}
    when = str(prov.get("finished_at") or prov.get("started_at") or "")
    when = when.replace("T", " ").replace("Z", " UTC") if when else "date unknown"
    what = run.get("suite") or run.get("workflow", "?")
    benches = ", ".join(run.get("benchmarks") or summary.get("benchmarks", {}))
    return [f"# {what} suite ({benches}): {', '.join(models)}, {when}", "",
            f"Workflow {run.get('workflow', '?')}; run dir `{run.get('dir', '?')}`; "
            f"{run.get('episodes_run', 0)} episodes run, {run.get('episodes_resumed', 0)} resumed.", ""]


def _agent_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The agents table: every agent of the team in team order (one never called shows 0 calls), its
    model and worker group; a summary without the team (older runs) names the worker groups only."""
    agents = summary["micro"].get("agents", {})
    team = (summary.get("run") or {}).get("team") or {}
    head = ["agent", label("model"), label("worker_group"), label("calls"), label("calls_per_traj"),
            label("prompt_tokens_per_call"), label("completion_tokens_per_call"), label("tokens_per_question"),
            label("usd_per_question")]
    rows = []
    for a in list(team) + [a for a in agents if a not in team]:
        v, t = agents.get(a), team.get(a, {})
        wg = t.get("worker_group") or ", ".join(v["models"])  # the recorded `models` are worker groups
        if v is None:
            rows.append([a, t.get("model", "–"), wg, "0", "0.00", "–", "–", "–", "–"])
            continue
        tq = v.get("tokens_per_question")
        rows.append([a, t.get("model", "–"), wg, str(v.get("calls", "–")), f"{v['calls_per_traj']:.2f}",
                     _tokens(v["prompt_tokens_per_call"], v), _tokens(v["completion_tokens_per_call"], v),
                     "unknown" if tq is None else f"{tq:.0f}", _usd_known(v.get("usd_per_question"), v)])
    return head, rows


def _share(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def md_label(key: str, own: Words = None) -> str:
    """`labels.label` for Markdown: a tag in it (``<verify>``) in backticks, so it stays visible."""
    return re.sub(r"(<[a-z/]+>|\\boxed\{\})", r"`\1`", label(key, own))


def _counts(d: dict[str, int] | None, own: Words = None) -> str:
    return ", ".join(f"{md_label(str(k), own)} {v}" for k, v in (d or {}).items()) or "–"


def _md_value(key: str, x: Any, own: Words) -> str:
    """`labels.value` for Markdown: a dict of counts with its names' labels in backticks where tagged."""
    return _counts(x, own) if isinstance(x, dict) and set(x) != {"p50", "p95"} else value(key, x, own)


def compliance_markdown(comp: dict[str, Any] | None) -> list[str]:
    """The protocol-compliance section (metrics.compliance): one row per agent (every figure its rule
    reads under its own label), then one line of the per-episode figures the rules declare; [] for a
    summary written before compliance was computed."""

    if not comp or not comp.get("agents"):
        return []
    own = rule_words(comp)
    head = ["agent", label("calls"), "valid", label("invalid_reasons"), label("length_cut"), label("empty_responses"),
            label("rule_figures")]
    rows = []
    for a, v in comp["agents"].items():
        valid = _share(v.get("valid_rate"))
        if v.get("valid_by_rules_rate") is not None and v["valid_by_rules"] != v.get("valid"):
            valid += f" ({label('valid_by_rules')}: {_share(v['valid_by_rules_rate'])})"  # recorded under other rules
        read = "; ".join(f"{md_label(k, own)}: {_md_value(k, v[k], own)}" for k in rule_figure_keys(v)) or "–"
        rows.append([a, v["calls"], valid, _counts(v.get("invalid_reasons"), own),
                     v.get("length_cut", 0), v.get("empty_responses", 0), read])
    out = ["", f"### {caption('compliance', comp.get('workflow'))}", "",
           tabulate(rows, head, tablefmt="github", disable_numparse=True)]
    ep = comp.get("episodes") or {}
    if len(ep) > 1:  # the figures the workflow's rules declare (`FormatRule.episode_figures`), each with its label
        figures = "; ".join(f"{md_label(k, own)}: {_md_value(k, x, own)}" for k, x in ep.items() if k != "episodes")
        out += ["", f"Per episode ({ep['episodes']}): {figures}."]
    return out


def effects_markdown(eff: dict[str, Any] | None) -> list[str]:
    """The per-agent effects sections (metrics.effects): per-agent latency, then the workflow's own
    block, whatever figures it declares (`labels.effect_blocks`: a figure per row in its declared
    order and words, a benchmark per column and, with several, one for all records) and its note;
    [] for a summary written before effects were computed."""

    if not eff:
        return []
    out: list[str] = []
    if eff.get("agents"):  # calls, tokens and dollars per agent are in the agents table: latency only here
        head = ["agent", label("call_latency_s")]
        rows = [[a, value("latency_s", v.get("latency_s"))] for a, v in eff["agents"].items()]
        out += ["", "### Where the time went: call latency per agent", "",
                tabulate(rows, head, tablefmt="github", disable_numparse=True)]
    for _key, blocks, keys, own in effect_blocks(eff):
        head = ["figure"] + [b for b, _ in blocks]
        rows = [[md_label(k, own)] + [_md_value(k, figure_value(blk, k), own) for _, blk in blocks] for k in keys]
        out += ["", f"### {caption('effects', eff.get('workflow'))}", "",
                tabulate(rows, head, tablefmt="github", disable_numparse=True)]
        note = effect_note(eff.get("workflow"), blocks[-1][1], own)
        out += ["", note] if note else []
    return out


def _pass_hat_markdown(rows_src: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The reliability table: pass^k (all k of k samples succeed) with its 95% CI for the k of
    pass@k, and pass^n when samples per question are uneven; [] for a summary without pass^k."""

    if not all("pass^k" in blk for _, blk in rows_src):
        return []
    ks = sorted({int(k) for _, blk in rows_src for k in blk["pass^k"]})
    uneven = any(blk.get("n_varies") for _, blk in rows_src)
    head = ["benchmark"] + [f"pass^{k} [95% CI]" for k in ks] + (["pass^n [95% CI]"] if uneven else [])
    rows = []
    for name, blk in rows_src:
        cis = blk.get("ci95", {})
        row = [name] + [_with_ci(blk["pass^k"][str(k)], cis.get("pass^k", {}).get(str(k))) if str(k) in blk["pass^k"]
                        else "–" for k in ks]
        rows.append(row + ([_with_ci(blk["pass^n"], cis.get("pass^n"))] if uneven else []))
    return ["", "### Reliability (%): pass^k, all k of k samples succeed", "",
            tabulate(rows, head, tablefmt="github", disable_numparse=True)]


def format_summary_markdown(summary: dict[str, Any]) -> str:
    """Markdown tables (accuracy in %, with 95% bootstrap CIs; cost and latency; agents), under a
    header naming suite, model and date when the summary carries its run (`evaluate` writes it)."""

    blocks = summary["benchmarks"]
    rows_src = [(b, blocks[b]) for b in blocks] + [(MICRO, summary["micro"]), (MACRO, summary["macro"])]
    ks = sorted({int(k) for _, blk in rows_src for k in blk["pass@k"]})
    head = ["benchmark", "questions", "n", "avg@n [95% CI]"] + [f"pass@{k}" for k in ks] + ["pass@n [95% CI]"]
    acc_rows = []
    for name, blk in rows_src:
        acc_rows.append(
            [name, blk["questions"], _n_cell(blk), _with_ci(blk["avg@n"], blk["ci95"]["avg@n"])]
            + [_pct(blk["pass@k"].get(str(k))) for k in ks]
            + [_with_ci(blk["pass@n"], blk["ci95"]["pass@n"])]
        )
    parts = [*_summary_header(summary), "### Accuracy (%)", "", tabulate(acc_rows, head, tablefmt="github", disable_numparse=True)]
    parts += _pass_hat_markdown(rows_src)

    qa = [k for k in QA_KEYS if any(k in blk for _, blk in rows_src)]
    cost_head = (["benchmark", "trajectory latency p50 (s)", "trajectory latency p95 (s)", label("usd_per_question")]
                 + [label(k) for k in qa])
    cost_rows = []
    for name, blk in rows_src:
        lat = blk.get("latency_s", {})
        fmt = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
        cost_rows.append([name, fmt(lat.get("p50")), fmt(lat.get("p95")), _usd_known(blk.get("usd_per_question"), blk)]
                         + [_pct(blk.get(k)) for k in qa])
    source = USD_SOURCES.get(summary["micro"].get("usd_source", ""), summary["micro"].get("usd_source", ""))
    parts += ["", f"### Cost and latency ($ from {source})", "", tabulate(cost_rows, cost_head, tablefmt="github", disable_numparse=True)]

    ag_head, ag_rows = _agent_rows(summary)
    if ag_rows:
        parts += ["", f"### {caption('cost')} (all questions)", "",
                  tabulate(ag_rows, ag_head, tablefmt="github", disable_numparse=True)]

    parts += compliance_markdown(summary.get("compliance"))
    parts += effects_markdown(summary.get("effects"))

    parts += ["", *[f"- {n}" for n in summary_notes(summary, rows_src)]]
    return "\n".join(parts) + "\n"


def summary_notes(summary: dict[str, Any], rows_src: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The notes under summary.md's tables: uneven sample counts, duplicates, grading timeouts,
    calls without usage or with an engine note, the grader, unpriced models, how micro, macro and
    the CIs are computed."""
    blocks = summary["benchmarks"]
    notes = []
    for name, blk in rows_src:
        if blk.get("n_varies"):
            notes.append(f"{name}: samples per question vary ({blk['n_min']}..{blk['n_max']}: uneven counts, a partial run?); "
                         f"{blk['questions_with_other_n']} questions differ from the usual n; pass@k and pass^k use k <= {blk['n_min']}; "
                         f"pass@n is the any-success rate over the samples present (as the reference), "
                         f"pass^n the all-success rate")
        if blk.get("duplicate_samples"):
            notes.append(f"{name}: {blk['duplicate_samples']} duplicate (task, sample_idx) records")
        if blk.get("grading_timeouts") and name in blocks:
            notes.append(f"{name}: {blk['grading_timeouts']} samples hit the grading limit twice (CPU time, "
                         "retried alone with a larger limit) and are graded wrong")
    usage = summary["micro"].get("usage") or {}
    if usage.get("unknown"):
        notes.append(f"{usage['unknown']} of {usage['calls']} calls came back without token usage and no tokenizer "
                     "here could count them: their tokens and dollars are unknown (shown as `unknown`, never $0)")
    if usage.get("counted"):
        notes.append(f"{usage['counted']} of {usage['calls']} calls came back without token usage: counted here "
                     "with the model's tokenizer")
    if usage.get("flagged"):
        notes.append(f"{usage['flagged']} of {usage['calls']} calls carry an engine note (a reply cut to the "
                     "response cap, or more completion tokens than requested): see `notes` in samples.jsonl")
    grader = summary.get("grader")
    if isinstance(grader, dict) and grader.get("name"):
        notes.append(f"graded by {grader['name']} (version {grader.get('version', '?')})")
    if summary.get("unpriced_models"):
        notes.append(f"unpriced models (costed at $0 by `default: zero`): {', '.join(summary['unpriced_models'])}")
    notes.append(f"{MACRO}: unweighted mean over {summary['macro']['benchmarks']} benchmarks; "
                 f"{MICRO}: every question weighted equally. CIs: {summary['n_boot']} bootstrap resamples of questions, seed {summary['seed']}.")
    return notes


def _usd6(x: float | None) -> str:
    return "–" if x is None else f"{x:.6f}"


def sweep_markdown(doc: dict[str, Any]) -> str:
    """``sweep.md``: one table, an assignment per row (accuracy in %, Pareto fronts marked, the agents'
    effect in the phrase the workflow declares; "–" in a sweep.json written before it was kept)."""
    rows = doc["assignments"]
    ks = sorted({k for r in rows for k in r["pass@k"]}, key=int)
    top = ks[-1] if ks else "n"
    lines = [f"# Sweep: {doc['suite']} suite, workflow {doc['workflow']}, {doc['finished']} of "
             f"{doc['design']['planned']} assignments ({doc['design']['kind']}; {doc['design']['possible']} possible)", ""]
    lines.append(f"| # | assignment | avg@n | pass@{top} | pass^{top} | latency s/question | tokens | $ as alone | $ paid "
                 f"| calls (cache hits) | Δ avg@n vs baseline [95% CI] | front $ | front latency | agents' effect |")
    lines.append("|" + "---|" * 14)
    for i, r in enumerate(rows, 1):
        vs = r.get("vs_baseline")
        if r.get("baseline"):
            delta = "baseline"
        elif vs:
            delta = f"{100 * vs['diff']:+.1f} [{100 * vs['ci_low']:+.1f}, {100 * vs['ci_high']:+.1f}] (n={vs['n_pairs']})"
        else:
            delta = "–"
        lines.append(f"| {i} | {r['label']} | {_pct(r['avg@n'])} | {_pct(r['pass@k'].get(top))} | "
                     f"{_pct(r.get('pass^k', {}).get(top))} | {r['latency_s']:.3f} | {r['tokens'] if r['tokens'] is not None else 'unknown'} | {_usd6(r['usd'])} | "
                     f"{_usd6(r['usd_paid'])} | {r['model_calls']} ({r['cache_hits']}) | {delta} | "
                     f"{'★' if r['pareto_usd'] else ''} | {'★' if r['pareto_latency'] else ''} | "
                     f"{str(r.get('effect') or '–').replace('|', '/')} |")
    lines.append("")
    ratio = doc.get("calls_ratio")
    lines.append(f"- model calls sent: {doc['model_calls']} of {doc['calls_without_cache']} that independent evals "
                 f"would send" + (f" ({100 * ratio:.1f}%)" if ratio is not None else "") +
                 (f"; cache {doc['cache']}" if doc.get("cache") else "; no call cache"))
    lines.append("- latency and $ are as if each assignment ran alone (a cached call counts its original latency and "
                 "cost); `$ paid` is what this sweep paid" + (f" (prices: {doc['prices']})" if doc.get("prices") else
                                                              " ($: pass --prices)"))
    lines.append("- Δ: paired per question against the baseline (same questions, same seed schedule; pairs share "
                 "their cached upstream samples, so the CI is a paired one; docs/sweep.md); ★: on the Pareto front of "
                 "accuracy (avg@n) vs $ / vs latency")
    if not doc.get("complete", True):
        lines.append(f"- unfinished: {doc['design']['planned'] - doc['finished']} assignments not yet run "
                     "(run the same command again to continue)")
    return "\n".join(lines) + "\n"
