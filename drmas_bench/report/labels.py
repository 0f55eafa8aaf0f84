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

from typing import Any

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
    figures, `FormatRule.labels`) and each workflow's (its effects, `WorkflowSpec.labels`)."""
    out: dict[str, str] = {}
    for rule in registered_rules().values():
        out.update(rule.labels)
    for spec in registered_workflows().values():
        out.update(spec.labels)
    return out


def all_labels() -> dict[str, str]:
    """`LABELS` with the suites' own (`declared_labels`): what the viewer's script looks keys up in."""
    return {**declared_labels(), **LABELS}


def label(key: str) -> str:
    """The words a reader sees for summary key ``key`` (`LABELS`, then the suites' own:
    `declared_labels`); an unknown key gets its words with underscores spaced, a ``pass@K`` /
    ``pass^K`` / ``avg@K`` its name with "(%)"."""
    if key in LABELS:
        return LABELS[key]
    declared = declared_labels()
    if key in declared:
        return declared[key]
    if key[:5] in ("pass@", "pass^") or key[:4] == "avg@":
        return f"{key} (%)"
    return key.replace("_", " ")


def is_share(key: str) -> bool:
    """Whether the figure under ``key`` is a share in [0, 1] (shown in %)."""
    return (key in _SHARES or key.endswith(_SHARE_SUFFIXES) or key[:5] in ("pass@", "pass^")
            or key[:4] == "avg@" or (key not in LABELS and declared_labels().get(key, "").endswith("(%)")))


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


def value(key: str, x: Any) -> str:
    """The cell text of ``x`` under summary key ``key``: shares in %, p50 / p95 pairs as ``a / b``,
    dollars to four significant digits, other floats with two decimals, counts as they are,
    dicts of counts as ``label n`` lists; "–" for none."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, dict):
        if set(x) == {"p50", "p95"}:
            p50, p95 = x["p50"], x["p95"]
            return "–" if p50 is None else f"{p50:.2f} / {p95:.2f}"
        return ", ".join(f"{label(str(k))} {value('', v)}" for k, v in x.items()) or "–"
    if isinstance(x, (list, tuple)):
        return ", ".join(value("", v) for v in x) or "–"
    if isinstance(x, float):
        if x != x:
            return "–"
        if is_share(key):
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
