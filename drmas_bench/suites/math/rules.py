"""The math suite's protocol roles (REFERENCE.md §2b: the solver and the math_verifier, what each
must emit, its projection, the verifier's verdict) and its format rules (those roles as
`workflows.rules.FormatRule` objects), with what they read off a reply (the solver's boxed answer,
the verifier's verdict) and per episode (solver rounds, verifier approvals)."""

from __future__ import annotations

from functools import partial
from typing import Any

from drmas_bench.grading.extract import has_boxed_answer, reference_boxed
from drmas_bench.records import RecordView
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.rules import Folded, FormatRule, Verdicts, format_rule

# the names the reference gives this suite's agents (its team context, its checkpoints' agent ids)
AGENT_NAMES = {"solver": "Solver Agent", "verifier": "Verifier Agent", "critic": "Critic Agent",
               "refiner": "Refiner Agent"}
ROLES = ("solver", "math_verifier")  # the suite's protocol roles (the critic's and refiner's: refine_loop.py)


def _role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown math protocol role {role!r}; roles: {', '.join(ROLES)}")
    return role


def project(role: str, text: str) -> str:
    """What the reference keeps of `role`'s response in the team context: the solver's unchanged,
    the verifier's spliced (`protocol.verify_splice`)."""
    return text if _role(role) == "solver" else proto.verify_splice(text)


def reasons(role: str, text: str) -> list[str]:
    """Every reason `role`'s response fails its validity rule (REFERENCE §2b "Validity"; invalid
    costs the row c_inv); empty: valid.

    - solver: the reference's boxed extraction on the whole response returns a string (no CJK
      rule); missing_boxed (no ``\\boxed`` at all), unbalanced_boxed (there is one, but the
      extraction finds no answer: the last one is not ``\\boxed{`` with its closing brace);
    - math_verifier: missing_verify_tag (``<verify>`` or ``</verify>`` absent), cjk."""
    if _role(role) == "math_verifier":
        return proto.verify_reasons(text)
    if has_boxed_answer(text):
        return []
    return ["missing_boxed" if "\\boxed" not in text else "unbalanced_boxed"]


def valid(role: str, text: str) -> bool:
    """Whether `role`'s response passes its validity rule: `reasons` finds none."""
    return not reasons(role, text)


def math_verdict(text: str) -> str:
    """'approve' | 'reject' of a math verifier's raw response: case-sensitive substring tests on the
    spliced response, approve first; neither counts as approve (``<verify>re ject</verify>`` and a
    later ``<verify> reject </verify>`` approve: only the first pair's ends are stripped)."""
    spliced = proto.verify_splice(text)
    if "<verify>approve</verify>" in spliced:
        return "approve"
    if "<verify>reject</verify>" in spliced:
        return "reject"
    return "approve"


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
            self.approved += math_verdict(t.text) == "approve"

    def result(self) -> dict[str, Any]:
        return {"rounds_per_episode": self.rounds / self.episodes if self.episodes else None,
                "approve_rate": self.approved / self.verdicts if self.verdicts else None}


rounds_figures = Folded(Rounds)


def verifier_parse(text: str) -> tuple[str | None, str | None]:
    """(the spliced reply where the splice changed it, the verdict: approve | reject)."""
    spliced = proto.verify_splice(text)
    return (spliced if spliced != text else None), math_verdict(text)


verifier_figures = Folded(partial(Verdicts, math_verdict))  # the math verifier's verdicts over its replies


SOLVER = format_rule(FormatRule(
    "solver", partial(reasons, "solver"), ("missing_boxed", "unbalanced_boxed"),
    lambda text: (reference_boxed(text), None),  # its answer: the last box's content as the rule reads it
    labels={"missing_boxed": "no \\boxed{}", "unbalanced_boxed": "unbalanced \\boxed{}"}))
MATH_VERIFIER = format_rule(FormatRule(
    "math_verifier", partial(reasons, "math_verifier"), ("missing_verify_tag", "cjk"), verifier_parse,
    agent_figures=verifier_figures, episode_figures=rounds_figures,
    labels={"missing_verify_tag": "no <verify> tag", "cjk": "CJK characters",
            "rounds_per_episode": "solver rounds per episode", "approve_rate": "verifier approvals (%)",
            "verdicts": "verdicts"}))
