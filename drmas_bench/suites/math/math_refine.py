"""Math: solver / verifier refinement loop (REFERENCE.md §2, §2b), at most `rounds` solver turns.

    round r: the solver solves; on the last round stop; else the verifier reviews: approve? stop

Final answer = the last solver output, whole (the math env grades it). One team context for the
episode: each agent sees the entries of every earlier call (solver: its response; verifier: the
spliced response). Tags, projection, verdict and validity rules and chat layout come from
`protocol`; the role prompts from ``math_refine.prompts.yaml`` (or ``--prompts``). Options: rounds (2), prompts (Templates; None = packaged), protocol (ProtocolOptions: prompt limit,
default 8192 tokens cut in the middle).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from drmas_bench.records import RecordView, mean_or_none, rate, view, views
from drmas_bench.suites.math.rules import MATH_VERIFIER, SOLVER
from drmas_bench.types import Trajectory
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.base import Episode, workflow

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


def math_effects(records: Iterable[Any]) -> dict[str, Any]:
    """The verifier's effect in a math_refine run (solver -> verifier -> solver ...), over E episodes.

    - round2_ran = episodes with more than one solver turn; round2_rate = round2_ran / E;
    - flips {wrong_to_right, right_to_wrong, wrong_to_wrong, right_to_right}: over the round2_ran
      episodes whose round-1 grade is known, (round-1 answer graded correct?) -> (final answer graded
      correct?); round1_ungraded = round2_ran episodes without a recorded round-1 grade (older runs);
    - the verifier as a judge of the round-1 answer (its first verdict, `protocol.math_verdict`;
      anything but a reject approves), over the `judged` episodes with a verdict and a known round-1
      grade: approve_rate_on_right = P(approve | right), approve_rate_on_wrong = P(approve | wrong),
      judge_precision = P(right | approve), judge_recall = approve_rate_on_right, judge_accuracy =
      (right approved + wrong rejected) / judged;
    - graded_episodes = episodes with a known round-1 grade; over them round1_accuracy = mean
      round-1 correctness, final_accuracy = mean final correctness, accuracy_change = final - round 1
      (= (wrong_to_right - right_to_wrong) / graded_episodes).

    right / wrong = graded correct or not by the run's grader. Rates are None when their
    denominator is 0."""
    recs = views(records)
    flips: Counter = Counter()
    ran = ungraded = 0
    graded: list[tuple[bool, bool]] = []
    judged: list[tuple[bool, bool]] = []  # (round-1 right, approved)
    for r in recs:
        r1, final = round1_correct(r), r.correct
        if r1 is not None:
            graded.append((r1, final))
        if len(r.agent_turns("solver")) > 1:
            ran += 1
            if r1 is None:
                ungraded += 1
            else:
                flips[f"{'right' if r1 else 'wrong'}_to_{'right' if final else 'wrong'}"] += 1
        verdicts = [proto.math_verdict(t.text) for t in r.agent_turns("verifier")]
        if verdicts and r1 is not None:
            judged.append((r1, verdicts[0] == "approve"))
    right = [ok for r1, ok in judged if r1]
    wrong = [ok for r1, ok in judged if not r1]
    approved = [r1 for r1, ok in judged if ok]
    r1_acc = mean_or_none([float(a) for a, _ in graded])
    fin_acc = mean_or_none([float(b) for _, b in graded])
    return {
        "episodes": len(recs), "round2_ran": ran, "round2_rate": rate(ran, len(recs)),
        "flips": {k: flips[k] for k in FLIPS}, "round1_ungraded": ungraded,
        "judged": len(judged), "approve_rate_on_right": rate(sum(right), len(right)),
        "approve_rate_on_wrong": rate(sum(wrong), len(wrong)),
        "judge_precision": rate(sum(approved), len(approved)), "judge_recall": rate(sum(right), len(right)),
        "judge_accuracy": rate(sum(right) + len(wrong) - sum(wrong), len(judged)),
        "graded_episodes": len(graded), "round1_accuracy": r1_acc, "final_accuracy": fin_acc,
        "accuracy_change": None if r1_acc is None or fin_acc is None else fin_acc - r1_acc,
    }



def round1_answer(traj: Trajectory) -> str | None:
    """The first solver answer of an episode with more than one solver turn (a later round replaced
    it); None with one (the final answer is round 1's)."""
    solver = [t.completion.text for t in traj.turns if t.agent == "solver"]
    return solver[0] if len(solver) > 1 else None


# each role prompt's placeholders: (those it may use, those it must use)
SEEN = {"question", "team_context", "round", "rounds"}
PLACEHOLDERS = {"solver": (SEEN, {"question", "team_context"}), "verifier": (SEEN, {"question", "team_context"})}


MATH_LABELS = {"round2_ran": "round 2 ran", "round2_rate": "round 2 ran (%)", "flips": "round 1 -> final",
               "wrong_to_right": "wrong -> right", "right_to_wrong": "right -> wrong", "wrong_to_wrong": "wrong -> wrong",
               "right_to_right": "right -> right", "round1_ungraded": "round-1 answers never graded",
               "judged": "first answers judged", "approve_rate_on_right": "approves right (%)",
               "approve_rate_on_wrong": "approves wrong (%)", "judge_precision": "judge precision (%)",
               "judge_recall": "judge recall (%)", "judge_accuracy": "judge accuracy (%)",
               "graded_episodes": "graded episodes", "round1_accuracy": "round-1 accuracy (%)",
               "final_accuracy": "final accuracy (%)", "accuracy_change": "accuracy change (pts)"}


@workflow("math_refine", agents=("solver", "verifier"), family="math",
          rules={"solver": SOLVER, "verifier": MATH_VERIFIER}, effects=("math", math_effects),
          placeholders=PLACEHOLDERS, prompt_limit=(8192, "middle"),  # REFERENCE §2b / §3
          round1_answer=round1_answer, title="math refinement", labels=MATH_LABELS)
async def math_refine(ep: Episode, rounds: int = 2, prompts: proto.Templates | None = None,
                      protocol: proto.ProtocolOptions | None = None) -> None:
    tpl = prompts or proto.default_templates("math_refine")
    ep.limit_prompts(*(protocol or proto.ProtocolOptions()).resolve("math_refine"))
    said: list[tuple[str, str]] = []  # (agent, projected text): one team context for the episode

    def prompt(role: str, r: int) -> list[dict[str, str]]:
        return proto.chat(tpl, role, question=ep.task.question, team_context=proto.team_context(tpl, said),
                      round=r + 1, rounds=rounds)

    for r in range(rounds):
        sol = await ep.solver(prompt("solver", r))
        sol.valid = proto.valid("solver", sol.completion.text)
        said.append(("solver", proto.project("solver", sol.completion.text)))
        ep.final_answer = sol.completion.text
        if r == rounds - 1:
            break
        ver = await ep.verifier(prompt("verifier", r))
        ver.valid = proto.valid("math_verifier", ver.completion.text)
        said.append(("verifier", proto.project("math_verifier", ver.completion.text)))
        if proto.math_verdict(ver.completion.text) == "approve":
            break
