"""Math with four agents: Solver -> Critic -> Refiner -> Verifier, looped (the reference's 4-agent team,
run_math_4agent{,_vanilla}.sh; its agent ids ``Solver Agent``, ``Critic Agent``, ``Refiner Agent``,
``Verifier Agent``).

The loop is `refine_loop` (``refine_loop.py``: the control flow, the critic's and refiner's format
rules), the one math_refine runs with the critic and the refiner absent. Final answer = the last
solver or refiner output. Prompts: ``math_4agent.prompts.yaml`` (our wording) or ``--prompts``.
Options: rounds (2, the reference scripts' max_loop_num), prompts, protocol (as math_refine: 8192
prompt tokens, cut in the middle). Effects (`math4_effects`): what the critic / refiner / verifier
did to the score.
"""

from __future__ import annotations

from typing import Any

from drmas_bench.figures import Effects, Figure
from drmas_bench.records import rate, view
from drmas_bench.suites.math.refine_loop import ANSWERING, CRITIC, REFINER, refine_loop
from drmas_bench.suites.math.rules import MATH_VERIFIER, SOLVER, math_verdict
from drmas_bench.types import Trajectory
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.base import Episode, workflow
from drmas_bench.workflows.rules import Folded


def round1_answer(traj: Trajectory) -> str | None:
    """The solver's first answer when a later solver or refiner output replaced it; None when it is final."""
    answers = [t.completion.text for t in traj.turns if t.agent in ANSWERING]
    return answers[0] if len(answers) > 1 else None


class Math4Effects:
    """What the critic / refiner / verifier did to the score, over E episodes, one at a time.

    - refined = episodes in which the refiner acted (refined_rate = refined / E); replaced = episodes
      whose first solver answer was replaced (by the refiner or a second solver turn);
    - flips {wrong_to_right, right_to_wrong, wrong_to_wrong, right_to_right}: over the replaced
      episodes with a recorded round-1 grade, (first answer right?) -> (final answer right?);
    - approve_rate = the verifier's first verdicts that approve / episodes with a verdict;
    - graded_episodes, round1_accuracy, final_accuracy, accuracy_change (final - round 1), over the
      episodes whose first answer's grade is known (the final grade when it was never replaced)."""

    def __init__(self) -> None:
        self.flips = dict.fromkeys(("wrong_to_right", "right_to_wrong", "wrong_to_wrong", "right_to_right"), 0)
        self.episodes = self.refined = self.replaced = self.approved = self.judged = 0
        self.graded = self.graded_r1 = self.graded_final = 0  # episodes with a known first-answer grade; right first / final

    def add(self, record: Any) -> None:
        r = view(record)
        self.episodes += 1
        answers = sum(len(r.agent_turns(a)) for a in ANSWERING)
        self.refined += bool(r.agent_turns("refiner"))
        r1 = r.correct if answers == 1 else r.round1_correct if answers > 1 else None
        if answers > 1:
            self.replaced += 1
            if r1 is not None:
                self.flips[f"{'right' if r1 else 'wrong'}_to_{'right' if r.correct else 'wrong'}"] += 1
        if r1 is not None:
            self.graded += 1
            self.graded_r1 += r1
            self.graded_final += r.correct
        verdicts = r.agent_turns("verifier")
        if verdicts:
            self.judged += 1
            self.approved += math_verdict(verdicts[0].text) == "approve"

    def result(self) -> dict[str, Any]:
        r1_acc = rate(self.graded_r1, self.graded)
        fin_acc = rate(self.graded_final, self.graded)
        return {"episodes": self.episodes, "refined": self.refined, "refined_rate": rate(self.refined, self.episodes),
                "replaced": self.replaced, "flips": dict(self.flips), "judged": self.judged,
                "approve_rate": rate(self.approved, self.judged), "graded_episodes": self.graded,
                "round1_accuracy": r1_acc, "final_accuracy": fin_acc,
                "accuracy_change": None if r1_acc is None or fin_acc is None else fin_acc - r1_acc}


math4_effects = Folded(Math4Effects)  # over a list of records (`metrics.effects` folds it as it reads)


SEEN = {"question", "team_context", "round", "rounds"}
AGENTS = ("solver", "critic", "refiner", "verifier")
PLACEHOLDERS = {a: (SEEN, {"question", "team_context"}) for a in AGENTS}
FLIP_WORDS = {"wrong_to_right": "wrong -> right", "right_to_wrong": "right -> wrong", "wrong_to_wrong": "wrong -> wrong",
              "right_to_right": "right -> right"}
# what the critic / refiner / verifier did, as every report shows it (`drmas_bench.figures`)
MATH4_EFFECTS = Effects(
    "math_4agent", math4_effects,
    figures=(Figure("refined_rate", "refiner acted", "share"),
             *(Figure(f"flips.{k}", words, "count") for k, words in FLIP_WORDS.items()),
             Figure("approve_rate", "first verdict approves", "share"), Figure("round1_accuracy", "round-1 accuracy", "share"),
             Figure("final_accuracy", "final accuracy", "share"), Figure("accuracy_change", "accuracy change", "points"),
             Figure("episodes", "episodes", "count"), Figure("refined", "refiner acted", "count"),
             Figure("replaced", "first answer replaced", "count"), Figure("judged", "episodes with a verdict", "count"),
             Figure("graded_episodes", "graded episodes", "count")),
    phrase=("refiner in {refined_rate}: wrong->right {flips.wrong_to_right}, right->wrong {flips.right_to_wrong}; "
            "acc {round1_accuracy} -> {final_accuracy}"),
    note="Round 1 -> final: the first answer against the final one (the last solver or refiner answer), both graded.")


@workflow("math_4agent", agents=AGENTS, family="math",
          rules={"solver": SOLVER, "critic": CRITIC, "refiner": REFINER, "verifier": MATH_VERIFIER},
          effects=MATH4_EFFECTS, placeholders=PLACEHOLDERS, prompt_limit=(8192, "middle"),
          round1_answer=round1_answer, title="4-agent math")
async def math_4agent(ep: Episode, rounds: int = 2, prompts: proto.Templates | None = None,
                      protocol: proto.ProtocolOptions | None = None) -> None:
    tpl = prompts or proto.default_templates("math_4agent")
    ep.limit_prompts(*(protocol or proto.ProtocolOptions()).resolve("math_4agent"))
    await refine_loop(ep, tpl, rounds, AGENTS)
