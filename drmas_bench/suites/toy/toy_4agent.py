"""Toy with four agents: the 4-agent math loop (Solver -> Critic -> Refiner -> Checker) on "What is a + b?".

    loop r (at most `rounds`): the solver answers in <answer>N</answer>; on the last loop stop; else
    the critic judges that answer (<critique>right</critique> or <critique>wrong</critique>), the
    refiner answers again having seen both (its answer becomes the current one), the checker
    approves or rejects the refined answer: approve (or no verdict) stops, reject goes round again

The control flow mirrors math_4agent's (the math suite's `refine_loop`; no suite imports another)
with the toy's own short formats, so the tiny CPU recipe (`tiny_4agent`) trains a team with twice the roles of `toy` in
minutes. The final answer is the last solver or refiner output. Warm start
(`toy4_sft_examples`): the answering agents' targets are right ``solver_accuracy`` of the time, the
judging agents' ``checker_accuracy``.
"""

from __future__ import annotations

import random
import re
from typing import Any

from drmas_bench.suites.arithmetic import near_miss, sum_question
from drmas_bench.suites.toy.toy import (
    ANSWER,
    TOY_ANSWER,
    TOY_VERDICT,
    answer_reasons,
    checker_prompt,
    parse_verdict,
    solver_prompt,
    verdict_reasons,
)
from drmas_bench.types import SFTExample
from drmas_bench.workflows.base import Episode, chat, workflow
from drmas_bench.workflows.rules import FormatRule, format_rule

CRITIQUE = re.compile(r"<critique>\s*(right|wrong)\s*</critique>", re.IGNORECASE)
CRITIC_SYSTEM = "You are the Critic. Reply <critique>right</critique> or <critique>wrong</critique> about the proposed answer."
REFINER_SYSTEM = "You are the Refiner. Give the right number inside <answer></answer>."


def critique_reasons(text: str) -> list[str]:
    """The toy critic's rule: a ``<critique>`` tag holding right or wrong (missing_critique_tag)."""
    return [] if CRITIQUE.search(text) else ["missing_critique_tag"]


def parse_critique(text: str) -> tuple[None, str | None]:
    """(no action, the critique it gave: right | wrong, the last tag's)."""
    found = CRITIQUE.findall(text)
    return None, (found[-1].lower() if found else None)


TOY_CRITIQUE = format_rule(FormatRule("toy_critique", critique_reasons, ("missing_critique_tag",), parse_critique,
                                      labels={"missing_critique_tag": "no critique tag"}))


def critic_prompt(question: str, proposed: str) -> list[dict[str, str]]:
    return chat(CRITIC_SYSTEM, f"{question}\nProposed answer: {proposed}")


def refiner_prompt(question: str, proposed: str, critique: str) -> list[dict[str, str]]:
    return chat(REFINER_SYSTEM, f"{question}\nProposed answer: {proposed}\nCritique: {critique}")


def _shown(text: str) -> str:
    """What the next agent is shown of an answer: the last tagged answer, else the response's start."""
    found = ANSWER.findall(text)
    return found[-1] if found else text.strip()[:20]


def _critique(text: str) -> str:
    """What the refiner is shown of a critique: its verdict, else the response's start."""
    return parse_critique(text)[1] or text.strip()[:20]


def toy4_sft_examples(agents: list[str], n: int, seed: int = 0, *, solver_accuracy: float = 0.5,
                      checker_accuracy: float = 0.8, max_operand: int = 9, retry_share: float = 0.2,
                      **_: Any) -> list[SFTExample]:
    """``n`` examples per agent in ``agents`` (solver, critic, refiner, checker), interleaved.

    solver: as the toy's (``<answer>N</answer>``, right ``solver_accuracy`` of the time, a share
    ``retry_share`` on the "previous answer was rejected" prompt); refiner: shown a proposed answer
    (right half of the time) and a critique of it (itself right 80 % of the time), answers right ``solver_accuracy`` of the time;
    critic and checker: shown a proposed answer right half of the time, their target (right / wrong,
    approve / reject) is correct ``checker_accuracy`` of the time. Other options are ignored."""
    unknown = sorted(set(agents) - {"solver", "critic", "refiner", "checker"})
    if unknown:
        raise ValueError(f"the toy_4agent warm start knows the agents solver, critic, refiner and checker, "
                         f"not {', '.join(unknown)}")
    rng = random.Random(seed)
    out: list[SFTExample] = []
    for _i in range(n):
        for agent in agents:
            q, right = sum_question(rng, max_operand)
            proposed = right if rng.random() < 0.5 else near_miss(rng, right)
            judged_ok = (proposed == right) == (rng.random() < checker_accuracy)
            answer = right if rng.random() < solver_accuracy else near_miss(rng, right)
            if agent == "solver":
                previous = near_miss(rng, right) if rng.random() < retry_share else None
                if answer == previous:
                    answer = right
                msgs = solver_prompt(q, None if previous is None else str(previous))
                out.append(SFTExample("solver", msgs, f"<answer>{answer}</answer>"))
            elif agent == "refiner":
                said = "right" if (proposed == right) == (rng.random() < 0.8) else "wrong"
                out.append(SFTExample("refiner", refiner_prompt(q, str(proposed), said), f"<answer>{answer}</answer>"))
            elif agent == "critic":
                out.append(SFTExample("critic", critic_prompt(q, str(proposed)),
                                      f"<critique>{'right' if judged_ok else 'wrong'}</critique>"))
            else:
                out.append(SFTExample("checker", checker_prompt(q, str(proposed)),
                                      f"<verdict>{'approve' if judged_ok else 'reject'}</verdict>"))
    return out


@workflow("toy_4agent", agents=("solver", "critic", "refiner", "checker"), family="toy",
          rules={"solver": TOY_ANSWER, "critic": TOY_CRITIQUE, "refiner": TOY_ANSWER, "checker": TOY_VERDICT},
          sft=toy4_sft_examples, title="4-agent toy")
async def toy_4agent(ep: Episode, rounds: int = 2) -> None:
    previous = None
    q = ep.task.question
    for r in range(rounds):
        sol = await ep.solver(solver_prompt(q, previous))
        sol.valid = not answer_reasons(sol.completion.text)
        ep.final_answer = sol.completion.text
        current = _shown(sol.completion.text)
        if r == rounds - 1:
            break
        crit = await ep.critic(critic_prompt(q, current))
        crit.valid = not critique_reasons(crit.completion.text)
        ref = await ep.refiner(refiner_prompt(q, current, _critique(crit.completion.text)))
        ref.valid = not answer_reasons(ref.completion.text)
        ep.final_answer = ref.completion.text
        previous = _shown(ref.completion.text)
        chk = await ep.checker(checker_prompt(q, previous))
        chk.valid = not verdict_reasons(chk.completion.text)
        if parse_verdict(chk.completion.text) in (None, "approve"):
            break
