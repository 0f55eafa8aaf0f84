"""The math suite's format rules: the protocol's solver and math_verifier roles
(`workflows.protocol`, REFERENCE.md §2b) as `workflows.rules.FormatRule` objects, with what they read
off a reply (the solver's boxed answer, the verifier's verdict) and per episode (solver rounds,
verifier approvals)."""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any

from drmas_bench.grading.extract import reference_boxed
from drmas_bench.records import RecordView, mean_or_none
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.rules import FormatRule, format_rule


def rounds_figures(recs: list[RecordView]) -> dict[str, Any]:
    """math_refine's per-episode figures: solver rounds per episode and the share of verifier turns
    that approved."""
    rounds = [len(r.agent_turns("solver")) for r in recs]
    verdicts = [proto.math_verdict(t.text) for r in recs for t in r.agent_turns("verifier")]
    return {"rounds_per_episode": mean_or_none(rounds),
            "approve_rate": verdicts.count("approve") / len(verdicts) if verdicts else None}


def verifier_parse(text: str) -> tuple[str | None, str | None]:
    """(the spliced reply where the splice changed it, the verdict: approve | reject)."""
    spliced = proto.verify_splice(text)
    return (spliced if spliced != text else None), proto.math_verdict(text)


def verifier_figures(texts: list[str]) -> dict[str, Any]:
    """The math verifier's verdicts over its replies."""
    return {"verdicts": dict(sorted(Counter(proto.math_verdict(t) for t in texts).items()))}


SOLVER = format_rule(FormatRule(
    "solver", partial(proto.reasons, "solver"), ("missing_boxed", "unbalanced_boxed"),
    lambda text: (reference_boxed(text), None),  # its answer: the last box's content as the rule reads it
    labels={"missing_boxed": "no \\boxed{}", "unbalanced_boxed": "unbalanced \\boxed{}"}))
MATH_VERIFIER = format_rule(FormatRule(
    "math_verifier", partial(proto.reasons, "math_verifier"), ("missing_verify_tag", "cjk"), verifier_parse,
    agent_figures=verifier_figures, episode_figures=rounds_figures,
    labels={"missing_verify_tag": "no <verify> tag", "cjk": "CJK characters",
            "rounds_per_episode": "solver rounds per episode", "approve_rate": "verifier approvals (%)"}))
