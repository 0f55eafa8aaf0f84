"""Toy: the math refinement loop shrunk to one-digit addition, for smoke runs and the CI recipe.

The solver answers in <answer>...</answer>; the checker approves or rejects; a rejected answer gets
one more try. Small models learn both formats quickly, and the two agents' reward statistics differ
by design (the solver acts once or twice, the checker once).
"""

from __future__ import annotations

import random
import re
from typing import Any

from drmas_bench.suite import Episode, FormatRule, SFTExample, chat, format_rule, workflow
from drmas_bench.suites.arithmetic import near_miss, sum_question

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


def answer_reasons(text: str) -> list[str]:
    """The toy solver's rule: an ``<answer>...</answer>`` pair (missing_answer_tag)."""
    return [] if ANSWER.search(text) else ["missing_answer_tag"]


def verdict_reasons(text: str) -> list[str]:
    """The toy checker's rule: a ``<verdict>`` tag holding approve or reject (missing_verdict_tag)."""
    return [] if parse_verdict(text) is not None else ["missing_verdict_tag"]


def parse_answer(text: str) -> tuple[str | None, None]:
    """(the last ``<answer>`` tag's content, no verdict): what the viewer shows beside a solver reply."""
    found = ANSWER.findall(text)
    return (found[-1] if found else None), None


TOY_ANSWER = format_rule(FormatRule("toy_answer", answer_reasons, ("missing_answer_tag",), parse_answer,
                                    labels={"missing_answer_tag": "no answer tag"}))
TOY_VERDICT = format_rule(FormatRule("toy_verdict", verdict_reasons, ("missing_verdict_tag",),
                                     lambda text: (None, parse_verdict(text)),
                                     labels={"missing_verdict_tag": "no verdict tag"}))


def solver_prompt(question: str, previous: str | None) -> list[dict[str, str]]:
    user = question if previous is None else f"{question}\nYour previous answer {previous} was rejected. Try again."
    return chat(SOLVER_SYSTEM, user)


def checker_prompt(question: str, proposed: str) -> list[dict[str, str]]:
    return chat(CHECKER_SYSTEM, f"{question}\nProposed answer: {proposed}")


# ------------------------------------------------------------------------------ the warm start
# A randomly initialised model cannot discover the answer format from RL alone: it almost never
# writes <answer>N</answer>, so every reward is 0 and every advantage is 0. The ``sft:`` stage of the
# ``tiny`` recipe teaches both agents their formats, deliberately partially (`toy_sft_examples`): the
# model learns the format and a spread-out belief about each sum, so a sampled answer is right only
# part of the time and RL has to sharpen it. The prompts are the workflow's own, rendered by each
# worker group with its chat template, so the warm-started model sees what the rollouts show it.


def toy_sft_examples(agents: list[str], n: int, seed: int = 0, *, solver_accuracy: float = 0.5,
                     checker_accuracy: float = 0.8, max_operand: int = 9, retry_share: float = 0.2,
                     **_: Any) -> list[SFTExample]:
    """``n`` examples per agent in ``agents`` (``solver`` and/or ``checker``), interleaved.

    Args:
        agents: which agents' examples to make; others are an error.
        n: examples per agent.
        seed: generation seed.
        solver_accuracy: share of solver targets carrying the right sum.
        checker_accuracy: share of checker targets carrying the right verdict.
        max_operand: operands are drawn from 0..max_operand (as ``make_toy_tasks``).
        retry_share: share of solver examples that use the "previous answer was rejected" prompt.

    The solver's target is ``<answer>N</answer>``, N the right sum with probability
    ``solver_accuracy``, else a near miss (sum +- 1..3, never negative, never the previous rejected
    answer). The checker sees a proposed answer that is right half of the time; its target is
    ``<verdict>approve</verdict>`` when it is right and ``<verdict>reject</verdict>`` otherwise,
    flipped with probability ``1 - checker_accuracy``. Examples come from ``random.Random(seed)``.
    """
    unknown = sorted(set(agents) - {"solver", "checker"})
    if unknown:
        raise ValueError(f"the toy warm start knows the agents solver and checker, not {', '.join(unknown)}")
    rng = random.Random(seed)
    out: list[SFTExample] = []
    for _example in range(n):
        for agent in agents:
            q, right = sum_question(rng, max_operand)
            if agent == "solver":
                previous = near_miss(rng, right) if rng.random() < retry_share else None
                ans = right if rng.random() < solver_accuracy else near_miss(rng, right, avoid=previous)
                msgs = solver_prompt(q, None if previous is None else str(previous))
                out.append(SFTExample("solver", msgs, f"<answer>{ans}</answer>"))
            else:
                proposed = right if rng.random() < 0.5 else near_miss(rng, right)
                ok = proposed == right
                if rng.random() >= checker_accuracy:
                    ok = not ok
                out.append(SFTExample("checker", checker_prompt(q, str(proposed)),
                                      f"<verdict>{'approve' if ok else 'reject'}</verdict>"))
    return out


@workflow("toy", agents=("solver", "checker"), family="toy", rules={"solver": TOY_ANSWER, "checker": TOY_VERDICT},
          sft=toy_sft_examples)
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
