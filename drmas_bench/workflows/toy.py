"""Toy: the math refinement loop shrunk to one-digit addition, for smoke runs and the CI recipe.

The solver answers in <answer>...</answer>; the checker approves or rejects; a rejected answer gets
one more try. Small models learn both formats quickly, and the two agents' reward statistics differ
by design (the solver acts once or twice, the checker once).
"""

from __future__ import annotations

import re

from drmas_bench.workflows.base import Episode, chat, format_rule, workflow

ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)
VERDICT = re.compile(r"<verdict>\s*(approve|reject)\s*</verdict>", re.IGNORECASE)

SOLVER_SYSTEM = "You are the Solver. Answer the question with a number inside <answer></answer>."
CHECKER_SYSTEM = ("You are the Checker. Reply <verdict>approve</verdict> if the proposed answer is right, "
                  "otherwise <verdict>reject</verdict>.")


def parse_verdict(text: str) -> str | None:
    """'approve' | 'reject' from the last <verdict> tag, None when there is none (the toy's own
    format; the paper's workflows follow REFERENCE §2b in protocol.py)."""
    found = VERDICT.findall(text)
    return found[-1].lower() if found else None


@format_rule("toy_answer")
def answer_reasons(text: str) -> list[str]:
    """The toy solver's rule: an ``<answer>...</answer>`` pair (missing_answer_tag)."""
    return [] if ANSWER.search(text) else ["missing_answer_tag"]


@format_rule("toy_verdict")
def verdict_reasons(text: str) -> list[str]:
    """The toy checker's rule: a ``<verdict>`` tag holding approve or reject (missing_verdict_tag)."""
    return [] if parse_verdict(text) is not None else ["missing_verdict_tag"]


def solver_prompt(question: str, previous: str | None) -> list[dict[str, str]]:
    user = question if previous is None else f"{question}\nYour previous answer {previous} was rejected. Try again."
    return chat(SOLVER_SYSTEM, user)


def checker_prompt(question: str, proposed: str) -> list[dict[str, str]]:
    return chat(CHECKER_SYSTEM, f"{question}\nProposed answer: {proposed}")


@workflow("toy", agents=("solver", "checker"), grader="toy", rules={"solver": "toy_answer", "checker": "toy_verdict"})
async def toy(ep: Episode, rounds: int = 2) -> None:
    previous = None
    for r in range(rounds):
        sol = await ep.solver(solver_prompt(ep.task.question, previous))
        found = ANSWER.findall(sol.completion.text)
        sol.valid = not answer_reasons(sol.completion.text)
        previous = found[-1] if found else sol.completion.text.strip()[:20]
        ep.final_answer = sol.completion.text
        if r == rounds - 1:
            break
        chk = await ep.checker(checker_prompt(ep.task.question, previous))
        verdict = parse_verdict(chk.completion.text)
        chk.valid = not verdict_reasons(chk.completion.text)
        if verdict in (None, "approve"):
            break
