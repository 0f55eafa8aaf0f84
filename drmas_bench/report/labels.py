"""What a reader sees instead of a summary key: one table of human labels (with units) and one way
to format each kind of figure, used by the run viewer (`report.view`), summary.md
(`report.markdown`) and the leaderboard page (`report.pages`), so a figure is called the same
thing everywhere.

`label(key)` is the column head of a summary key; `value(key, x)` its cell text (shares in %,
seconds with two decimals, dollars to four significant digits); `caption(section, workflow)` a
section's heading in words. The suites name their own keys (a format rule's reasons and figures,
a workflow's effects: their ``labels``) and their workflows (``title``). A key missing from both
falls back to its words with underscores spaced (never the raw key), and `tests/test_view.py`
checks that no raw key reaches the page.
"""

from __future__ import annotations

from typing import Any, Mapping

from drmas_bench.figures import fill, format_of_label, lookup, rule_labels, shown_keys
from drmas_bench.workflows import find_workflow, registered_rules, registered_workflows

# key -> the words a reader sees (units in parentheses). Keys of summary.json (metrics.summarize),
# its compliance and effects blocks, the workflows' effects blocks, the format rules' reasons, and
# keys other parts add (pass^k beside pass@k).
LABELS: dict[str, str] = {
    # how good
    "questions": "questions",
    "samples": "samples",
    "n": "samples per question",
    "avg@n": "avg@n (%)",
    "pass@n": "pass@n (%)",
    "pass@k": "pass@k (%)",
    "pass^n": "pass^n (%)",
    "pass^k": "pass^k (%)",
    "ci95": "95% CI",
    "em": "EM (%)",
    "f1": "F1 (%)",
    "cover_em": "cover EM (%)",
    "micro": "all questions (micro)",
    "macro": "mean of benchmarks (macro)",
    "duplicate_samples": "duplicate samples",
    "grading_timeouts": "grading timeouts",
    # at what cost
    "models": "worker group",
    "model": "model",
    "worker_group": "worker group",
    "calls": "calls",
    "calls_per_traj": "calls per trajectory",
    "calls_per_question": "calls per question",
    "prompt_tokens_per_call": "prompt tokens per call",
    "completion_tokens_per_call": "completion tokens per call",
    "tokens_per_question": "tokens per question",
    "usage_unknown_calls": "calls with unknown usage",
    "usage_counted_calls": "calls counted by a tokenizer",
    "usage_flagged_calls": "calls with an engine note",
    "usd_per_call": "$ per call",
    "usd_per_question": "$ per question",
    "usd_total": "$ in all",
    "usd": "$",
    # where the time went
    "latency_s": "latency p50 / p95 (s)",
    "call_latency_s": "call latency p50 / p95 (s)",
    "trajectory_latency_s": "trajectory latency p50 / p95 (s)",
    "wall_s": "wall time (s)",
    # why: protocol compliance per agent
    "rule": "format rule",
    "valid": "valid calls",
    "valid_rate": "valid (%)",
    "invalid_reasons": "why invalid (turns)",
    "valid_by_rules": "valid under today's rules",
    "valid_by_rules_rate": "valid under today's rules (%)",
    "length_cut": "cut at max tokens",
    "empty_responses": "blank replies",
    "actions": "actions",
    "verdicts": "verdicts",
    "rule_figures": "what its rule read",  # the column of every figure an agent's rule declares
    # why: per episode (the figures themselves are named by the rules that compute them)
    "episodes": "episodes",
    # a paired comparison of two runs
    "fixed": "fixed",
    "broken": "broken",
    "unchanged": "unchanged",
}

# keys whose value is a share in [0, 1], shown in %
_SHARE_SUFFIXES = ("_rate", "_recall", "_precision", "_accuracy", "_on_right", "_on_wrong")
_SHARES = {"avg@n", "pass@n", "em", "f1", "cover_em"}

# where a summary's dollars come from (metrics' ``usd_source``), in words
USD_SOURCES = {"price sheet": "the price sheet", "recorded cost_usd": "the costs recorded with each trajectory"}


CAPTIONS = {
    "scores": "How good: score per benchmark",
    "score_chart": "Score per benchmark (%), with its 95% bootstrap CI",
    "compliance": "Why: protocol compliance of the {workflow} workflow, per agent",
    "compliance_chart": "Valid replies and why the others failed, per agent (% of the agent's calls)",
    "episodes": "Why: what an episode of the {workflow} workflow did",
    "effects": "Why: what the {workflow} workflow's agents did to the score",
    "block": "{name} of the {workflow} workflow, per agent",
    "cost": "At what cost: calls, tokens and dollars per agent",
    "calls_chart": "Calls per trajectory",
    "tokens_chart": "Tokens per question (prompt + completion)",
    "time": "Where the time went: latency per agent and per benchmark",
    "latency_chart": "Call latency per agent, p50 and p95 (s)",
    "changes": "What changed from A to B, question by question",
    "changes_chart": "Questions fixed, broken and unchanged",
}


def declared_labels() -> dict[str, str]:
    """The words the suites declare for their own keys: each format rule's (its reasons and
    figures, `FormatRule.labels`) and each workflow's (its effects' figures and `WorkflowSpec.labels`)."""
    out: dict[str, str] = rule_labels(registered_rules().values())
    for spec in registered_workflows().values():
        out.update(spec.effect_labels())
    return out


def all_labels() -> dict[str, str]:
    """`LABELS` with the suites' own (`declared_labels`): what the viewer's script looks keys up in."""
    return {**declared_labels(), **LABELS}


Words = Mapping[str, str] | None  # the words one run's declaration gives its own keys (read first)


def label(key: str, own: Words = None) -> str:
    """The words a reader sees for summary key ``key``: ``own`` (what the run's workflow and rules
    declare, from summary.json's ``labels`` or the registry: a suite's word for ``actions`` wins over
    the built-in one), then `LABELS`, then any suite's (`declared_labels`); an unknown key gets its
    words with underscores spaced, a ``pass@K`` / ``pass^K`` / ``avg@K`` its name with "(%)"."""
    if own and key in own:
        return own[key]
    if key in LABELS:
        return LABELS[key]
    declared = declared_labels()
    if key in declared:
        return declared[key]
    if key[:5] in ("pass@", "pass^") or key[:4] == "avg@":
        return f"{key} (%)"
    return key.replace("_", " ")


def is_share(key: str, own: Words = None) -> bool:
    """Whether the figure under ``key`` is a share in [0, 1] (shown in %): a declared label says so by
    its unit (`figures.format_of_label`), a built-in key by its name."""
    if own and key in own:
        return format_of_label(own[key]) == "share"
    return (key in _SHARES or key.endswith(_SHARE_SUFFIXES) or key[:5] in ("pass@", "pass^")
            or key[:4] == "avg@" or (key not in LABELS and declared_labels().get(key, "").endswith("(%)")))


def is_points(key: str, own: Words = None) -> bool:
    """Whether the figure under ``key`` is a difference of shares in percentage points (label unit "(pts)")."""
    if not key or (key in LABELS and not (own and key in own)):
        return False
    words = own[key] if own and key in own else declared_labels().get(key, "")
    return format_of_label(words) == "points"


def rule_words(comp: Mapping[str, Any] | None) -> dict[str, str]:
    """The words a compliance block's rules declare: summary.json's ``compliance.labels``, else (a
    summary written before labels were stored) the registry's for its workflow."""
    comp = comp or {}
    if isinstance(comp.get("labels"), Mapping):
        return dict(comp["labels"])
    spec = find_workflow(comp.get("workflow"))
    return spec.rule_labels() if spec is not None else {}


def effect_words(eff: Mapping[str, Any] | None) -> dict[str, str]:
    """The words of an effects block's declared figures, in order: summary.json's ``effects.labels``,
    else (a summary written before labels were stored) the registry's for its workflow."""
    eff = eff or {}
    if isinstance(eff.get("labels"), Mapping):
        return dict(eff["labels"])
    spec = find_workflow(eff.get("workflow"))
    return spec.effect_labels() if spec is not None else {}


# keys of summary.json's effects that are not a workflow's block
_EFFECTS_FRAME = ("workflow", "agents", "benchmarks", "labels")


def effect_blocks(eff: Mapping[str, Any] | None) -> list[tuple[str, list[tuple[str, dict[str, Any]]], list[str], dict[str, str]]]:
    """Every workflow block in summary.json's ``effects``, as (its key, [(benchmark or "all", the
    block)], the keys shown in order (`figures.shown_keys`), their words): one row source per
    benchmark and, with several (or none), one over all records. What summary.md and the viewer draw."""
    eff = eff or {}
    words = effect_words(eff)
    out = []
    for key, whole in eff.items():
        if key in _EFFECTS_FRAME or not isinstance(whole, dict):
            continue
        per = [(b, v[key]) for b, v in (eff.get("benchmarks") or {}).items() if isinstance(v, dict) and key in v]
        blocks = per + ([("all", whole)] if len(per) != 1 else [])
        out.append((key, blocks, shown_keys([b for _, b in blocks], words), words))
    return out


def rule_figure_keys(entry: Mapping[str, Any]) -> list[str]:
    """The keys of one agent's compliance entry that its rule's figures added (`FormatRule.agent_figures`):
    every key beyond compliance's own."""
    return [k for k in entry if k not in _COMPLIANCE_KEYS]


# an agent's compliance entry's own keys (`summary_stream.SummaryStream.compliance`); others are its rule's figures
_COMPLIANCE_KEYS = ("rule", "calls", "valid", "valid_rate", "invalid_reasons", "valid_by_rules", "valid_by_rules_rate",
                    "length_cut", "empty_responses")


def effect_note(workflow: str | None, block: Mapping[str, Any], own: Words = None) -> str:
    """The sentences a workflow declares under its effects table (`figures.Effects.note`), its figures
    written from ``block`` (the block over all records; `short_value`); "" for none."""
    spec = find_workflow(workflow)
    if spec is None or spec.effects is None or not spec.effects.note:
        return ""
    return fill(spec.effects.note, block, lambda k, x: short_value(k, x, own))


def short_value(key: str, x: Any, own: Words = None) -> str:
    """A figure's value in a sentence: a share as ``62%``, points as ``+5.0 pts``, counts as ``name n``
    pairs, a real number with two decimals, a count as it is; "–" for none."""
    if x is None or (isinstance(x, float) and x != x):
        return "–"
    if is_points(key, own):
        return f"{100 * x:+.1f} pts"
    if is_share(key, own) and isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{100 * x:.0f}%"
    return value(key, x, own)


def figure_value(block: Mapping[str, Any], key: str) -> Any:
    """The value under a (dotted) figure key of a block, None when it has none."""
    return lookup(block, key)[1]


def workflow_name(workflow: str | None) -> str:
    """How a caption names ``workflow``: its declared title (`WorkflowSpec.title`), else its name."""
    spec = find_workflow(workflow)
    return spec.title if spec is not None else (workflow or "unnamed")


def caption(section: str, workflow: str | None = None, **words: Any) -> str:
    """The heading of a section in words (`CAPTIONS`), the workflow named as a reader knows it."""
    return CAPTIONS[section].format(workflow=workflow_name(workflow), **words)


def pct(x: float | None, digits: int = 1) -> str:
    """A share as a percentage, "–" for none (or NaN)."""
    return "–" if x is None or x != x else f"{100 * x:.{digits}f}"


def with_ci(x: float | None, ci: Any) -> str:
    """A share in % with its CI: ``41.7 [25.0, 58.3]``."""
    if x is None:
        return "–"
    if not ci or any(v is None or v != v for v in ci):
        return pct(x)
    return f"{pct(x)} [{pct(ci[0])}, {pct(ci[1])}]"


def value(key: str, x: Any, own: Words = None) -> str:
    """The cell text of ``x`` under summary key ``key`` (``own``: the run's declared words, `label`):
    shares in %, points with a sign, p50 / p95 pairs as ``a / b``, dollars to four significant
    digits, other floats with two decimals, counts as they are, dicts of counts as ``label n``
    lists; "–" for none."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, dict):
        if set(x) == {"p50", "p95"}:
            p50, p95 = x["p50"], x["p95"]
            return "–" if p50 is None else f"{p50:.2f} / {p95:.2f}"
        return ", ".join(f"{label(str(k), own)} {value('', v)}" for k, v in x.items()) or "–"
    if isinstance(x, (list, tuple)):
        return ", ".join(value("", v) for v in x) or "–"
    if isinstance(x, (int, float)) and is_points(key, own):
        return "–" if x != x else f"{100 * x:+.1f}"
    if isinstance(x, float):
        if x != x:
            return "–"
        if is_share(key, own):
            return pct(x)
        if key.startswith("usd"):
            return "0" if x == 0 else f"{x:.4g}"
        return f"{x:.2f}"
    return str(x)


def stopped_text(stop: dict[str, Any]) -> str:
    """What a reader is told about a run a spending limit stopped (summary.json's ``run.stopped``,
    `drmas_bench.limits`): the limit, the samples finished, how to resume."""
    return (f"Stopped by a limit: {stop.get('reason')}. {stop.get('samples_finished')} of "
            f"{stop.get('samples_planned')} samples are finished; the figures below cover those only. Re-run with "
            "a higher limit to resume.")


def reproducibility_text(block: dict[str, Any]) -> str:
    """summary.md's one line on whether the run's numbers are reproducible and why (summary.json's
    ``reproducibility``, drmas_bench.reproducibility): per worker group its engine, dtype and reason,
    a server's fingerprints, and batching that changed between the invocations of a resumed run."""
    groups = block.get("groups") or {}

    def part(wg: str, g: dict[str, Any]) -> str:
        fps = g.get("fingerprints")
        seen = "" if fps is None else (f"; fingerprints {', '.join(fps)}" if fps else "; no fingerprint given")
        return f"{wg} ({g.get('engine')}, {g.get('dtype')}): {g.get('why')}{seen}"

    seed = block.get("seed")
    if block.get("reproducible"):
        head = (f"yes: every engine is batch-invariant, so the same command (seed {seed}) gives the same records "
                "whatever --max-batch, --concurrency, --workers or a resume")
    else:
        head = (f"not guaranteed (seed {seed}): a request's batch may change its tokens, so --max-batch, "
                "--concurrency, --workers or a resume can change records")
    moved = block.get("batching_changed")
    tail = f"; this run's samples were made under different {', '.join(moved)}" if moved else ""
    return f"- reproducible: {head}; " + "; ".join(part(wg, g) for wg, g in groups.items()) + tail
