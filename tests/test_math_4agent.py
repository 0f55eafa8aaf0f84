"""The 4-agent math team (Solver -> Critic -> Refiner -> Verifier, looped) against the reference's own
outputs (../shared/reference_vectors/math4.jsonl: critic and refiner validity and projection, whole
episodes), and the 2-agent episodes (episodes_math.jsonl) through the same loop with the critic and
the refiner absent.

Episodes are driven with a scripted backend (`Scripted`, a fake model: the k-th call of an agent gets
``scripts[agent][k]``, or "" once the list runs out). The role wording is ours, so the team context
each call saw is read back from our prompts through marker templates (every allowed slot between
separators), and the packaged prompts are checked to carry the same text."""

from __future__ import annotations

import asyncio

import pytest
from conftest import assert_all_agree, load_reference_cases
from test_reference_vectors import Scripted

from drmas_bench.suites.math.math_4agent import math4_effects
from drmas_bench.suites.math.refine_loop import CRITIC, REFINER, critique_splice, refine_loop
from drmas_bench.types import Task
from drmas_bench.workflows import get_workflow
from protocol_roles import P
from drmas_bench.workflows.base import Episode

RULES = {"critic": CRITIC, "refiner": REFINER}

REF = {"Solver Agent": "solver", "Critic Agent": "critic", "Refiner Agent": "refiner", "Verifier Agent": "verifier"}
NAME = {a: n for n, a in REF.items()}
SEP = "\x1e"  # no vector text holds it


def _markers(workflow: str) -> P.Templates:
    roles = {role: "".join(f"{SEP}{name}{SEP}{{{{{name}}}}}" for name in sorted(allowed))
             for role, (allowed, _) in P.placeholders(workflow).items()}
    return P.load_templates(workflow, ({"roles": roles}, "markers"))


def _slots(prompt: str) -> dict[str, str]:
    parts = prompt.split(SEP)[1:]
    return dict(zip(parts[0::2], parts[1::2]))


def _episode(case, tpl: P.Templates, agents: tuple[str, ...]):
    i = case["input"]
    backend = Scripted(i["scripts"], NAME)
    ep = Episode(Task("m", "aime24", "Q", [i["gold"]]), 0, backend, agents)
    asyncio.run(refine_loop(ep, tpl, i["max_loop_num"], agents))
    traj = ep.finish()
    calls = [{"agent": n, "k": k, "valid": t.valid, "team_context": _slots(p).get("team_context")}
             for (n, k, p), t in zip(backend.calls, traj.turns)]
    return {"calls": calls, "final_answer": traj.final_answer}, backend


# ------------------------------------------------------------------------------ single rules


@pytest.mark.parametrize("role", ["critic", "refiner"])
def test_validity(role):
    def check(c):
        got = not RULES[role](c["input"]["response"])
        return got == c["reference"], got

    assert_all_agree(f"validity/{role}", load_reference_cases("math4.jsonl", f"validity/{role}"), check)


@pytest.mark.parametrize("role,ours", [("critic", critique_splice), ("refiner", lambda t: t)])
def test_team_context_text(role, ours):
    def check(c):
        got = ours(c["input"]["response"])
        return got == c["reference"], got

    assert_all_agree(f"action/{role}", load_reference_cases("math4.jsonl", f"action/{role}"), check)


def test_critic_and_refiner_rules_name_each_failure_and_read_their_reply():
    assert CRITIC("<critique>fine</critique>") == []
    assert CRITIC("</critique> late <critique>") == []  # either order
    assert CRITIC("<critique>no close") == ["missing_critique_tag"]
    assert CRITIC("<critique>\u4e00</critique>") == ["cjk"]
    assert critique_splice("a<critique>  b </critique>c") == "a<critique>b</critique>c"
    assert CRITIC.parse("a<critique>  b </critique>c") == ("a<critique>b</critique>c", None)
    assert CRITIC.parse("<critique>b</critique>") == (None, None)  # nothing spliced: nothing to show
    assert REFINER("so \\boxed{2}") == [] and REFINER("2") == ["missing_boxed"]
    assert REFINER.parse("so \\boxed{2}") == ("2", None)


# ------------------------------------------------------------------------------ whole episodes


def test_episodes_math4():
    """calls (agent, k, valid, team context in the prompt), final answer, through the registered
    workflow; the packaged prompts hold the same team-context text at every call."""
    wf = get_workflow("math_4agent")
    markers, packaged = _markers("math_4agent"), P.default_templates("math_4agent")

    def check(c):
        ref = c["reference"]
        got, _ = _episode(c, markers, wf.agents)
        _, b2 = _episode(c, packaged, wf.agents)
        same_text = len(b2.calls) == len(ref["calls"]) and all(
            x["team_context"] in p for (_, _, p), x in zip(b2.calls, ref["calls"]))
        return got == {k: ref[k] for k in got} and same_text, got

    assert_all_agree("episode/math4", load_reference_cases("math4.jsonl", "episode/math4"), check)


def test_the_workflow_runs_the_loop_with_its_options():
    """`math_4agent` itself (not only the loop): rounds is the reference's max_loop_num."""
    wf = get_workflow("math_4agent")
    assert wf.agents == ("solver", "critic", "refiner", "verifier") and wf.defaults["rounds"] == 2
    scripts = {"Solver Agent": ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"], "Critic Agent": ["<critique>x</critique>"] * 2,
               "Refiner Agent": ["\\boxed{5}"] * 2, "Verifier Agent": ["<verify>reject</verify>"] * 2}
    for rounds, order in ((2, "SCRVS"), (3, "SCRVSCRVS"), (1, "S")):
        backend = Scripted(scripts, NAME)
        ep = Episode(Task("m", "aime24", "Q", ["1"]), 0, backend, wf.agents)
        asyncio.run(wf.fn(ep, **{**wf.defaults, "rounds": rounds}))
        assert "".join(n[0] for n, _, _ in backend.calls) == order
        assert ep.finish().final_answer == scripts["Solver Agent"][rounds - 1]


def test_episodes_math4_reward():
    """The math env grades the final answer with the reference grader; ours is `reference_compat`."""
    from drmas_bench.grading.graders import grade_math

    def check(c):
        got = float(grade_math(c["reference"]["final_answer"], c["input"]["gold"], backend="reference_compat"))
        return got == c["reference"]["reward"], got

    assert_all_agree("episode/math4 reward", load_reference_cases("math4.jsonl", "episode/math4"), check)


def test_the_2agent_episodes_through_the_same_loop():
    """With the critic and the refiner absent the loop is the reference's 2-agent one: every case of
    episodes_math.jsonl (calls, validity, team context, final answer); math_refine runs this loop
    (tests/test_reference_vectors.py drives math_refine itself on the same cases)."""
    markers = _markers("math_4agent")

    def check(c):
        ref = c["reference"]
        got, _ = _episode(c, markers, ("solver", "verifier"))
        return got == {k: ref[k] for k in got}, got

    assert_all_agree("episode/math (4-agent loop, 2 agents)", load_reference_cases("episodes_math.jsonl"), check)


# ------------------------------------------------------------------------------ effects


def _record(turns, correct, round1=None):
    extra = {} if round1 is None else {"round1_correct": round1}
    return {"turns": [{"agent": a, "completion": {"text": t}} for a, t in turns], "correct": correct,
            "grade": "correct" if correct else "incorrect", "extra": extra, "task": {"benchmark": "b", "id": "1"}}


def test_effects_count_refinements_flips_and_verdicts():
    recs = [
        _record([("solver", "a")], True),  # one answer: round 1 is final
        _record([("solver", "a"), ("critic", "c"), ("refiner", "b"), ("verifier", "<verify>approve</verify>")],
                True, round1=False),  # wrong -> right
        _record([("solver", "a"), ("critic", "c"), ("refiner", "b"), ("verifier", "<verify>reject</verify>"),
                 ("solver", "d")], False, round1=True),  # right -> wrong
        _record([("solver", "a"), ("critic", "c"), ("refiner", "b"), ("verifier", "")], False),  # round 1 ungraded
    ]
    e = math4_effects(recs)
    assert (e["episodes"], e["refined"], e["replaced"], e["judged"]) == (4, 3, 3, 3)
    assert e["flips"] == {"wrong_to_right": 1, "right_to_wrong": 1, "wrong_to_wrong": 0, "right_to_right": 0}
    assert e["approve_rate"] == pytest.approx(2 / 3)  # no verdict tag approves
    assert e["graded_episodes"] == 3 and e["round1_accuracy"] == pytest.approx(2 / 3)
    assert e["final_accuracy"] == pytest.approx(2 / 3) and e["accuracy_change"] == pytest.approx(0.0)
