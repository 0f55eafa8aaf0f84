"""Toy with a fixer: a second agent that acts only on failing episodes, so its rewards differ from the team's.

The solver answers "What is a + b?" in <answer>N</answer>. The answer is checked against the gold
sum (the env's check, as a unit test would check code); a right answer ends the episode. A wrong
one goes to the fixer, told the answer was wrong; the fixer tries again, at most ``fixes`` times,
until it is right. The final answer is the last one given; the reward is 1 when it is right.

Why it exists: every row of an episode carries the same trajectory reward, so agents' reward
statistics differ only through *which episodes they act in*. The fixer acts only in episodes whose
first answer failed, and twice in those it could not fix at the first try, so its rows' mean sits
far below the team's pooled mean when the solver is mostly right and the fixer mostly is not. That
is the setting of Lemma 4.2: under global statistics its second-moment factor
``(sigma_k^2 + (mu_k - mu)^2) / sigma^2`` is far above 1 (trainer/moment_factor.py measures it).
Because the fixer can act twice per episode, step-level (per row) and trajectory-level (per cell
average) statistics differ for it too, so the estimators' 2 x 2 ablation is not degenerate here.

Options: ``fixes`` (the fixer's tries, default 2). Warm start (`toy_fixer_sft_examples`): the
solver's targets are right ``solver_accuracy`` of the time, the fixer's ``fixer_accuracy``.
"""

from __future__ import annotations

import random
from typing import Any

from drmas_bench.figures import Effects, Figure
from drmas_bench.records import view
from drmas_bench.suites.arithmetic import near_miss, sum_question
from drmas_bench.suites.toy.grading import grade_toy
from drmas_bench.suites.toy.toy import ANSWER, TOY_ANSWER, answer_reasons
from drmas_bench.types import SFTExample
from drmas_bench.workflows.base import Episode, chat, workflow
from drmas_bench.workflows.rules import Folded

SOLVER_SYSTEM = "You are the Solver. Answer the question with a number inside <answer></answer>."
FIXER_SYSTEM = ("You are the Fixer. A teammate's answer was wrong. Give the right number inside "
                "<answer></answer>.")


def solver_prompt(question: str) -> list[dict[str, str]]:
    return chat(SOLVER_SYSTEM, question)


def fixer_prompt(question: str, wrong: str) -> list[dict[str, str]]:
    return chat(FIXER_SYSTEM, f"{question}\nThe answer {wrong} is wrong.")


def _shown(text: str) -> str:
    """What the fixer is told was wrong: the last tagged answer, else the response's start."""
    found = ANSWER.findall(text)
    return found[-1] if found else text.strip()[:20]


class FixerEffects:
    """How often the fixer was called, how often it fixed the episode, and the solver's own accuracy,
    one episode at a time."""

    def __init__(self) -> None:
        self.episodes = self.called = self.fixed = self.solver_right = 0

    def add(self, record: Any) -> None:
        r = view(record)
        n_fix = sum(t.agent == "fixer" for t in r.turns)
        self.episodes += 1
        self.solver_right += n_fix == 0 and r.correct
        self.called += n_fix > 0
        self.fixed += n_fix > 0 and r.correct

    def result(self) -> dict[str, Any]:
        n = self.episodes
        return {"episodes": n, "solver_accuracy": self.solver_right / n if n else None,
                "fixer_called_rate": self.called / n if n else None,
                "fix_rate": self.fixed / self.called if self.called else None}


fixer_effects = Folded(FixerEffects)  # over a list of records (`metrics.effects` folds it as it reads)
# the fixer's effect as every report shows it (`drmas_bench.figures`)
FIXER_EFFECTS = Effects(
    "fixer", fixer_effects,
    figures=(Figure("fixer_called_rate", "fixer called", "share"),
             Figure("fix_rate", "fixed, of the episodes it was called", "share"),
             Figure("solver_accuracy", "solver right alone", "share"), Figure("episodes", "episodes", "count")),
    phrase="fixer called in {fixer_called_rate}, fixed {fix_rate}; solver right alone {solver_accuracy}")


def toy_fixer_sft_examples(agents: list[str], n: int, seed: int = 0, *, solver_accuracy: float = 0.5,
                           fixer_accuracy: float = 0.3, max_operand: int = 9, **_: Any) -> list[SFTExample]:
    """``n`` examples per agent in ``agents`` (``solver`` and/or ``fixer``), interleaved.

    The solver's target is ``<answer>N</answer>``, N the right sum with probability
    ``solver_accuracy``, else a near miss (sum +- 1..3). The fixer sees a near miss said to be wrong;
    its target is the right sum with probability ``fixer_accuracy``, else another near miss (never
    the one it was told is wrong). Other options of the trainer's ``sft:`` section are ignored.
    ``fixer_accuracy`` is this workflow's own warm-start option (a recipe's ``sft.fixer_accuracy``,
    in [0, 1]; the trainer checks its name and type against this signature)."""
    if not 0 <= fixer_accuracy <= 1:
        raise ValueError(f"sft.fixer_accuracy: a share in [0, 1], got {fixer_accuracy}")
    unknown = sorted(set(agents) - {"solver", "fixer"})
    if unknown:
        raise ValueError(f"the toy_fixer warm start knows the agents solver and fixer, not {', '.join(unknown)}")
    rng = random.Random(seed)
    out: list[SFTExample] = []
    for _i in range(n):
        for agent in agents:
            q, right = sum_question(rng, max_operand)
            if agent == "solver":
                ans = right if rng.random() < solver_accuracy else near_miss(rng, right)
                out.append(SFTExample("solver", solver_prompt(q), f"<answer>{ans}</answer>"))
            else:
                wrong = near_miss(rng, right)
                ans = right if rng.random() < fixer_accuracy else near_miss(rng, right, avoid=wrong)
                out.append(SFTExample("fixer", fixer_prompt(q, str(wrong)), f"<answer>{ans}</answer>"))
    return out


def round1_answer(traj: Any) -> str | None:
    """The solver's answer of an episode the fixer took over (None when the solver's answer is final)."""
    if not any(t.agent == "fixer" for t in traj.turns):
        return None
    return next(t.completion.text for t in traj.turns if t.agent == "solver")


@workflow("toy_fixer", agents=("solver", "fixer"), family="toy", rules={"solver": TOY_ANSWER, "fixer": TOY_ANSWER},
          effects=FIXER_EFFECTS, sft=toy_fixer_sft_examples, round1_answer=round1_answer)
async def toy_fixer(ep: Episode, fixes: int = 2) -> None:
    gold = ep.task.answers[0]
    turn = await ep.solver(solver_prompt(ep.task.question))
    for _ in range(max(0, fixes) + 1):
        text = turn.completion.text
        turn.valid = not answer_reasons(text)
        ep.final_answer = text
        if grade_toy(text, gold) or sum(t.agent == "fixer" for t in ep.turns) >= fixes:
            return
        turn = await ep.fixer(fixer_prompt(ep.task.question, _shown(text)))
