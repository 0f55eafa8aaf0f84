"""Math: solver / verifier refinement loop (REFERENCE.md §2), at most `rounds` solver turns.

    round 1: solver solves            -> verifier reviews -> approve? stop : continue
    round 2: solver solves again (last round: no review)
    final answer = the last solver output

A verdict that cannot be parsed counts as approve. Solver valid iff its output has a \\boxed{};
verifier valid iff its verdict tag is present and it wrote no CJK characters (as the reference).
"""

from __future__ import annotations

import re

from drmas_bench.workflows.base import Episode, chat, team_context, workflow

SOLVER_SYSTEM = (
    "You are the Solver on a two-member math team. Work the problem out step by step, take any "
    "feedback from the Verifier into account, and put your final answer inside \\boxed{}."
)
VERIFIER_SYSTEM = (
    "You are the Verifier on a two-member math team. Check the Solver's latest solution carefully. "
    "Briefly explain any error you find, then end with exactly one verdict: "
    "<verdict>approve</verdict> if the solution is correct, or <verdict>reject</verdict> if it is not."
)

VERDICT = re.compile(r"<verdict>\s*(approve|reject)\s*</verdict>", re.IGNORECASE)
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
BOXED = re.compile(r"\\(boxed|fbox)\s*[{\s]")


def has_boxed(text: str) -> bool:
    return BOXED.search(text) is not None


def parse_verdict(text: str) -> str | None:
    """'approve' | 'reject' from the last verdict tag, None when there is none."""
    found = VERDICT.findall(text)
    return found[-1].lower() if found else None


def solver_prompt(problem: str, context: str) -> list[dict[str, str]]:
    user = f"Problem:\n{problem}"
    if context:
        user += f"\n\nTeam discussion so far:\n{context}\n\nWrite an improved solution."
    return chat(SOLVER_SYSTEM, user)


def verifier_prompt(problem: str, context: str) -> list[dict[str, str]]:
    return chat(VERIFIER_SYSTEM, f"Problem:\n{problem}\n\nTeam discussion so far:\n{context}\n\nGive your verdict on the latest solution.")


@workflow("math_refine", agents=("solver", "verifier"), grader="math", rounds=2)
async def math_refine(ep: Episode, rounds: int = 2) -> None:
    for r in range(rounds):
        sol = await ep.solver(solver_prompt(ep.task.question, team_context(ep.turns)))
        sol.valid = has_boxed(sol.completion.text)
        ep.final_answer = sol.completion.text
        if r == rounds - 1:
            break
        ver = await ep.verifier(verifier_prompt(ep.task.question, team_context(ep.turns)))
        verdict = parse_verdict(ver.completion.text)
        ver.valid = verdict is not None and not CJK.search(ver.completion.text)
        if verdict in (None, "approve"):
            break
