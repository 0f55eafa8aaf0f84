"""Math: solver / verifier refinement loop (REFERENCE.md §2, §2b), at most `rounds` solver turns.

    round r: the solver solves; on the last round stop; else the verifier reviews: approve? stop

Final answer = the last solver output, whole (the math env grades it). One team context for the
episode: each agent sees the entries of every earlier call (solver: its response; verifier: the
spliced response). The loop is `refine_loop.refine_loop` over (solver, verifier): math_4agent's,
with its critic and refiner absent. Tags, projection, verdict and validity rules and chat layout come from
`protocol`; the role prompts from ``math_refine.prompts.yaml`` (or ``--prompts``). Options: rounds (2), prompts (Templates; None = packaged), protocol (ProtocolOptions: prompt limit,
default 8192 tokens cut in the middle).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from drmas_bench.figures import Effects, Figure
from drmas_bench.records import RecordView, rate, view
from drmas_bench.suites.math.refine_loop import refine_loop
from drmas_bench.suites.math.rules import MATH_VERIFIER, SOLVER, math_verdict
from drmas_bench.types import Trajectory
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.base import Episode, workflow
from drmas_bench.workflows.rules import Folded

FLIPS = ("wrong_to_right", "right_to_wrong", "wrong_to_wrong", "right_to_right")


def round1_correct(r: Any) -> bool | None:
    """Whether an episode's round-1 answer (its first solver turn) was graded correct: with one solver
    turn that answer is the final one, so the final grade (``correct``); with more, the grade
    recorded at grading time (``extra["round1_correct"]``, `runner.grade_trajectories`). None when
    the solver never spoke, or a later round ran in a run recorded before round-1 grades were kept."""
    rec: RecordView = view(r)
    n = len(rec.agent_turns("solver"))
    if n == 0:
        return None
    if n == 1:
        return rec.correct
    return rec.round1_correct


class MathEffects:
    """The verifier's effect in a math_refine run (solver -> verifier -> solver ...), over E episodes, one at a
    time.

    - round2_ran = episodes with more than one solver turn; round2_rate = round2_ran / E;
    - flips {wrong_to_right, right_to_wrong, wrong_to_wrong, right_to_right}: over the round2_ran
      episodes whose round-1 grade is known, (round-1 answer graded correct?) -> (final answer graded
      correct?); round1_ungraded = round2_ran episodes without a recorded round-1 grade (older runs);
    - the verifier as a judge of the round-1 answer (its first verdict, `rules.math_verdict`;
      anything but a reject approves), over the `judged` episodes with a verdict and a known round-1
      grade: approve_rate_on_right = P(approve | right), approve_rate_on_wrong = P(approve | wrong),
      judge_precision = P(right | approve), judge_recall = approve_rate_on_right, judge_accuracy =
      (right approved + wrong rejected) / judged;
    - graded_episodes = episodes with a known round-1 grade; over them round1_accuracy = mean
      round-1 correctness, final_accuracy = mean final correctness, accuracy_change = final - round 1
      (= (wrong_to_right - right_to_wrong) / graded_episodes).

    right / wrong = graded correct or not by the run's grader. Rates are None when their
    denominator is 0."""

    def __init__(self) -> None:
        self.episodes = self.ran = self.ungraded = 0
        self.flips: Counter = Counter()
        self.graded = self.graded_r1 = self.graded_final = 0  # episodes with a known round-1 grade; right in round 1 / final
        self.judged: Counter = Counter()  # (round-1 right, approved) -> episodes

    def add(self, record: Any) -> None:
        r = view(record)
        self.episodes += 1
        r1, final = round1_correct(r), r.correct
        if r1 is not None:
            self.graded += 1
            self.graded_r1 += r1
            self.graded_final += final
        if len(r.agent_turns("solver")) > 1:
            self.ran += 1
            if r1 is None:
                self.ungraded += 1
            else:
                self.flips[f"{'right' if r1 else 'wrong'}_to_{'right' if final else 'wrong'}"] += 1
        verdicts = r.agent_turns("verifier")
        if verdicts and r1 is not None:
            self.judged[(bool(r1), math_verdict(verdicts[0].text) == "approve")] += 1

    def result(self) -> dict[str, Any]:
        j = self.judged
        right, right_ok = j[(True, True)] + j[(True, False)], j[(True, True)]
        wrong, wrong_ok = j[(False, True)] + j[(False, False)], j[(False, True)]
        r1_acc = rate(self.graded_r1, self.graded)
        fin_acc = rate(self.graded_final, self.graded)
        return {
            "episodes": self.episodes, "round2_ran": self.ran, "round2_rate": rate(self.ran, self.episodes),
            "flips": {k: self.flips[k] for k in FLIPS}, "round1_ungraded": self.ungraded,
            "judged": right + wrong, "approve_rate_on_right": rate(right_ok, right),
            "approve_rate_on_wrong": rate(wrong_ok, wrong),
            "judge_precision": rate(right_ok, right_ok + wrong_ok), "judge_recall": rate(right_ok, right),
            "judge_accuracy": rate(right_ok + wrong - wrong_ok, right + wrong),
            "graded_episodes": self.graded, "round1_accuracy": r1_acc, "final_accuracy": fin_acc,
            "accuracy_change": None if r1_acc is None or fin_acc is None else fin_acc - r1_acc,
        }


math_effects = Folded(MathEffects)  # over a list of records (`metrics.effects` folds it as it reads)


def round1_answer(traj: Trajectory) -> str | None:
    """The first solver answer of an episode with more than one solver turn (a later round replaced
    it); None with one (the final answer is round 1's)."""
    solver = [t.completion.text for t in traj.turns if t.agent == "solver"]
    return solver[0] if len(solver) > 1 else None


# each role prompt's placeholders: (those it may use, those it must use)
SEEN = {"question", "team_context", "round", "rounds"}
PLACEHOLDERS = {"solver": (SEEN, {"question", "team_context"}), "verifier": (SEEN, {"question", "team_context"})}


FLIP_WORDS = {"wrong_to_right": "wrong -> right", "right_to_wrong": "right -> wrong", "wrong_to_wrong": "wrong -> wrong",
              "right_to_right": "right -> right"}
# the verifier's effect as every report shows it (`drmas_bench.figures`): the figures in reading order
MATH_EFFECTS = Effects(
    "math", math_effects,
    figures=(Figure("round2_rate", "round 2 ran", "share"),
             *(Figure(f"flips.{k}", words, "count") for k, words in FLIP_WORDS.items()),
             Figure("approve_rate_on_right", "approves right", "share"),
             Figure("approve_rate_on_wrong", "approves wrong", "share"),
             Figure("judge_precision", "judge precision", "share"), Figure("round1_accuracy", "round-1 accuracy", "share"),
             Figure("final_accuracy", "final accuracy", "share"), Figure("accuracy_change", "accuracy change", "points"),
             Figure("episodes", "episodes", "count"), Figure("round2_ran", "round 2 ran", "count"),
             Figure("round1_ungraded", "round-1 answers never graded", "count"),
             Figure("judged", "first answers judged", "count"), Figure("judge_recall", "judge recall", "share"),
             Figure("judge_accuracy", "judge accuracy", "share"), Figure("graded_episodes", "graded episodes", "count")),
    phrase=("round 2 in {round2_rate}: wrong->right {flips.wrong_to_right}, right->wrong {flips.right_to_wrong}"
            "[ ({round1_ungraded} round-1 answers never graded)]; acc {round1_accuracy} -> {final_accuracy}"),
    note=("Round 1 -> final: the solver's round-1 answer against its final answer, both graded. Of {episodes} "
          "episodes, {round2_ran} ran a second solver round; the verifier judged {judged} first answers (judge "
          "accuracy {judge_accuracy}); accuracy {round1_accuracy} after round 1 -> {final_accuracy} final."
          "[ {round1_ungraded} episodes ran round 2 but their round-1 answer was never graded (a run recorded "
          "before round-1 grades were kept): left out of the flip table.]"))


@workflow("math_refine", agents=("solver", "verifier"), family="math",
          rules={"solver": SOLVER, "verifier": MATH_VERIFIER}, effects=MATH_EFFECTS,
          placeholders=PLACEHOLDERS, prompt_limit=(8192, "middle"),  # REFERENCE §2b / §3
          round1_answer=round1_answer, title="math refinement")
async def math_refine(ep: Episode, rounds: int = 2, prompts: proto.Templates | None = None,
                      protocol: proto.ProtocolOptions | None = None) -> None:
    tpl = prompts or proto.default_templates("math_refine")
    ep.limit_prompts(*(protocol or proto.ProtocolOptions()).resolve("math_refine"))
    await refine_loop(ep, tpl, rounds, ("solver", "verifier"))  # the 4-agent loop, critic and refiner absent
