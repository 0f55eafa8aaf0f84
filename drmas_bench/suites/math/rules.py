"""The math suite's format rules: the protocol's solver and math_verifier roles
(`workflows.protocol`, REFERENCE.md §2b) as `workflows.rules.FormatRule` objects, with what they read
off a reply (the solver's boxed answer, the verifier's verdict) and per episode (solver rounds,
verifier approvals)."""

from __future__ import annotations

from functools import partial
from typing import Any

from drmas_bench.grading.extract import reference_boxed
from drmas_bench.records import RecordView
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.rules import Folded, FormatRule, Verdicts, format_rule


class Rounds:
    """math_refine's per-episode figures, one episode at a time: solver rounds per episode and the
    share of verifier turns that approved."""

    def __init__(self) -> None:
        self.episodes = self.rounds = self.verdicts = self.approved = 0

    def add(self, r: RecordView) -> None:
        self.episodes += 1
        self.rounds += len(r.agent_turns("solver"))
        for t in r.agent_turns("verifier"):
            self.verdicts += 1
            self.approved += proto.math_verdict(t.text) == "approve"

    def result(self) -> dict[str, Any]:
        return {"rounds_per_episode": self.rounds / self.episodes if self.episodes else None,
                "approve_rate": self.approved / self.verdicts if self.verdicts else None}


rounds_figures = Folded(Rounds)


def verifier_parse(text: str) -> tuple[str | None, str | None]:
    """(the spliced reply where the splice changed it, the verdict: approve | reject)."""
    spliced = proto.verify_splice(text)
    return (spliced if spliced != text else None), proto.math_verdict(text)


verifier_figures = Folded(partial(Verdicts, proto.math_verdict))  # the math verifier's verdicts over its replies


SOLVER = format_rule(FormatRule(
    "solver", partial(proto.reasons, "solver"), ("missing_boxed", "unbalanced_boxed"),
    lambda text: (reference_boxed(text), None),  # its answer: the last box's content as the rule reads it
    labels={"missing_boxed": "no \\boxed{}", "unbalanced_boxed": "unbalanced \\boxed{}"}))
MATH_VERIFIER = format_rule(FormatRule(
    "math_verifier", partial(proto.reasons, "math_verifier"), ("missing_verify_tag", "cjk"), verifier_parse,
    agent_figures=verifier_figures, episode_figures=rounds_figures,
    labels={"missing_verify_tag": "no <verify> tag", "cjk": "CJK characters",
            "rounds_per_episode": "solver rounds per episode", "approve_rate": "verifier approvals (%)",
            "verdicts": "verdicts"}))
