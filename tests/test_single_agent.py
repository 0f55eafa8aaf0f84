"""The single-agent baselines: math_single and search_single driven by a scripted
backend (exact calls, messages, observation text, env rules, the search cap), their validity rules
against the compliance table, an eval on tiny-random, compute-matched scoring, the leaderboard
marker, and the tiny_single recipe for one training step."""

from __future__ import annotations

import json

import pytest

from drmas_bench.metrics import invalid_reasons
from drmas_bench.api import evaluate_compute_matched
from drmas_bench.report import compute_matched as CM
from protocol_roles import P
from drmas_bench.suites.search.search_single import single_action, single_valid
from test_workflows_protocol import ANSWER, MTASK, SEARCH, TASK, FakeRetriever, FakeScriptedAgents, run_wf

SYSTEM = "You are a helpful and harmless assistant."


# ------------------------------------------------------------------------------ math_single


def test_math_single_is_one_solver_call_without_team_context():
    b = FakeScriptedAgents(solver=["so \\boxed{2}", "never asked"])
    traj = run_wf("math_single", MTASK, b)
    assert b.agents == ["solver"] and len(traj.turns) == 1
    req = b.calls[0][1]
    tpl = P.default_templates("math_single")
    assert req.messages == [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": P.render(tpl.roles["solver"], question=MTASK.question)}]
    assert MTASK.question in req.messages[1]["content"] and "The output of" not in req.messages[1]["content"]
    assert (req.max_prompt_tokens, req.truncate) == (8192, "middle")  # math_refine's limit
    assert traj.turns[0].valid is True and traj.final_answer == "so \\boxed{2}"


@pytest.mark.parametrize("text", ["no box", "\\boxed{", "\\boxed{2}", "答案 \\boxed{2}"])
def test_math_single_validity_is_the_solvers(text):
    traj = run_wf("math_single", MTASK, FakeScriptedAgents(solver=[text]))
    assert traj.turns[0].valid == P.valid("solver", text)


# ------------------------------------------------------------------------------ search_single


def hits_obs(q: str = "") -> str:
    return P.observation(FakeRetriever().search([q], 3)[0])


def test_search_then_answer_is_one_growing_conversation():
    first = SEARCH.format(" hamlet author ") + "<information>made up</information>"
    b = FakeScriptedAgents(agent=[first, ANSWER.format("William Shakespeare")])
    r = FakeRetriever()
    traj = run_wf("search_single", TASK, b, retriever=r)
    assert b.agents == ["agent", "agent"] and r.queries == ["hamlet author"]
    m1, m2 = b.calls[0][1].messages, b.calls[1][1].messages
    assert [m["role"] for m in m1] == ["system", "user"] and TASK.question in m1[1]["content"]
    # the reply is kept up to its action's closing tag; the next user message is the observation itself
    assert m2[:2] == m1 and m2[2] == {"role": "assistant", "content": SEARCH.format(" hamlet author ")}
    assert m2[3] == {"role": "user", "content": hits_obs()} and m2[3]["content"].startswith('<information>{"result": "Doc 1: ')
    assert b.calls[0][1].max_prompt_tokens == 4096 and b.calls[0][1].truncate == "left"
    env = traj.extra["env"]
    assert env["reward"] == 1.0 and env["length"] == 2 and traj.final_answer == "William Shakespeare"
    assert [t.valid for t in traj.turns] == [True, True]
    assert env["steps"][0]["action"] == "<search>hamlet author</search>" and env["steps"][0]["query"] == "hamlet author"


def test_at_most_three_searches_then_the_episode_ends():
    b = FakeScriptedAgents(agent=lambda req: SEARCH.format("again"))
    r = FakeRetriever()
    traj = run_wf("search_single", TASK, b, retriever=r)
    assert len(b.calls) == 4 and r.queries == ["again"] * 3  # the 4th step is done whatever the action
    assert traj.final_answer is None and traj.extra["env"]["reward"] == 0.0 and traj.extra["env"]["length"] == 4
    assert len(b.calls[3][1].messages) == 2 + 2 * 3


def test_an_empty_step_gets_the_no_action_message_and_no_search():
    b = FakeScriptedAgents(agent=["I think it is Shakespeare", ANSWER.format("shakespeare william")])
    r = FakeRetriever()
    traj = run_wf("search_single", TASK, b, retriever=r)
    tpl = P.default_templates("search_single")
    assert r.queries == [] and b.calls[1][1].messages[3]["content"] == P.render(tpl.roles["no_action"], step=1, max_steps=4)
    assert b.calls[1][1].messages[2]["content"] == "I think it is Shakespeare"  # no action: the whole reply
    assert traj.turns[0].valid is False and traj.extra["env"]["reward"] == 0.0  # EM, not word overlap


def test_the_action_that_closes_first_counts_and_an_empty_query_is_sent():
    assert single_action("<think>x</think><search>q <answer>a</answer></search>")[0] == "<answer>a</answer>"
    assert single_action("<search> q </search><answer>a</answer>") == ("<search>q</search>", 20)
    assert single_action("</search>q<search>") == ("", len("</search>q<search>"))
    r = FakeRetriever()
    run_wf("search_single", TASK, FakeScriptedAgents(agent=[SEARCH.format("  "), ANSWER.format("x")]), retriever=r)
    assert r.queries == [""]


def test_reward_is_the_envs_last_answer_match():
    # three searches, then the last step's answer pair is what the env grades
    b = FakeScriptedAgents(agent=[SEARCH.format("a"), SEARCH.format("b"), SEARCH.format("c"),
                                  ANSWER.format("William Shakespeare")])
    traj = run_wf("search_single", TASK, b, retriever=FakeRetriever())
    assert traj.extra["env"]["reward"] == 1.0 and traj.extra["env"]["length"] == 4


@pytest.mark.parametrize("text", [
    "<think>a</think><search>q</search>", "<think>a</think><answer>x</answer>", "<search>q</search>",
    "<think>a</think><think>b</think><answer>x</answer>", "</think><think><answer>x</answer>",
    "<think>好</think><answer>x</answer>", "<think>a</think>", "</answer>x<answer>",
])
def test_single_validity_agrees_with_the_compliance_reasons(text):
    assert single_valid(text) == (not invalid_reasons("single_action", text))


# ------------------------------------------------------------------------------ compute-matched


def rec(q, i, answer, correct, tokens=10):
    return {"task": {"benchmark": "b", "id": q}, "sample_idx": i, "final_answer": answer, "correct": correct,
            "extra": {}, "turns": [{"completion": {"prompt_tokens": tokens, "completion_tokens": 0}}]}


def test_majority_vote_groups_and_k():
    assert CM.matched_k(300, 100) == 3 and CM.matched_k(10, 100) == 1
    assert CM.tokens_per_trajectory([rec("1", 0, "a", True, 4), rec("1", 1, "a", True, 8)]) == 6
    recs = [rec("1", i, a, a == "right") for i, a in enumerate(["right", "wrong", "wrong", "right", "right", None])]
    # groups of 3 in sample order: (right, wrong, wrong) -> wrong; (right, right, None) -> right
    assert CM.matched_values(recs, 3, 2) == {("b", "1"): 0.5}
    assert CM.vote([rec("1", 0, "x", False), rec("1", 1, "y", True)]) == 0.0  # tie: the first seen
    assert CM.vote([rec("1", 0, None, False), rec("1", 1, None, False)]) == 0.0


# ------------------------------------------------------------------------------ end to end on tiny-random


# data_dir: the session fixture of conftest.py (skips with a reason where the benchmark files are absent)


@pytest.mark.data
def test_eval_compute_matched_and_leaderboard_on_tiny_random(tmp_path, data_dir):
    from drmas_bench.api import EvalConfig, evaluate
    from drmas_bench.report.leaderboard import build_leaderboard
    from drmas_bench.report.tables import Metric
    from drmas_bench.report.runs import load_runs

    common = dict(model="tiny-random", suite="math", benchmarks=["aime24"], limit=2, max_new_tokens=8,
                  data_dir=str(data_dir), progress=False)
    team = evaluate(EvalConfig(**common, n=1, out=str(tmp_path / "team")))
    cfg = EvalConfig(**common, n=1, workflow="math_single", out=str(tmp_path / "single"))
    summary, doc = evaluate_compute_matched(cfg, team.run_dir)
    assert summary["compliance"]["agents"]["solver"]["rule"] == "solver"
    single_recs = [json.loads(x) for x in (tmp_path / "single" / "samples.jsonl").read_text().splitlines()]
    assert all(len(r["turns"]) == 1 and r["turns"][0]["agent"] == "solver" for r in single_recs)
    assert doc["k"] == CM.matched_k(doc["team_tokens_per_trajectory"], doc["single_tokens_per_trajectory"]) >= 2
    assert len(single_recs) == 2 * doc["k"] and doc["questions_with_all_groups"] == 2
    assert json.loads((tmp_path / "single" / CM.FILE).read_text())["k"] == doc["k"]
    (table,) = build_leaderboard(load_runs([team.run_dir, summary.run_dir]), [Metric("avg")])
    labels = [(r.label, r.team) for r in table.rows if r.source == "reproduced"]
    assert labels[1] == ("single", "single-agent (math_single)")
    assert labels[2] == (f"single [maj@{doc['k']}, compute-matched]", "single-agent (math_single)")


@pytest.mark.data
def test_search_single_eval_on_tiny_random(tmp_path, data_dir):
    from drmas_bench.api import EvalConfig, evaluate

    s = evaluate(EvalConfig(model="tiny-random", suite="search", benchmarks=["bamboogle"], limit=1, n=1,
                            max_new_tokens=8, workflow="search_single", data_dir=str(data_dir), progress=False,
                            out=str(tmp_path / "s")))
    (r,) = [json.loads(x) for x in (tmp_path / "s" / "samples.jsonl").read_text().splitlines()]
    assert {t["agent"] for t in r["turns"]} == {"agent"} and 1 <= len(r["turns"]) <= 4
    assert r["extra"]["env"]["length"] == len(r["turns"]) and s["effects"] is not None


def test_tiny_single_recipe_trains_one_step(tmp_path):
    import yaml
    from drmas_trainer.config.train import load_config
    from drmas_trainer.trainer import train

    out = tmp_path / "t"
    train(load_config("tiny_single", {"steps": 1, "sft.steps": 3}), out, fresh=True, progress=False)  # a short warm start
    (m,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert m["step"] == 1 and m["agent/solver/num_calls/mean"] == 1.0 and "wg/solver/actor/loss" in m
    team = yaml.safe_load((out / "ckpt" / "latest" / "team.yaml").read_text())
    assert team["workflow"] == "math_single" and list(team["agents"]) == ["solver"]
    assert team["prompts"]["workflow"] == "math_single" and team["protocol"]["max_prompt_tokens"] == 8192


@pytest.mark.data
def test_search_single_trains_one_step_multi_turn(tmp_path, data_dir):
    from drmas_bench.retrievers import default_spec as default_retriever_spec
    from drmas_trainer.config.train import load_config
    from drmas_trainer.trainer import train

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": str(i), "benchmark": "hotpotqa", "question": q, "answers": [a]}) + "\n"
                             for i, (q, a) in enumerate([("Who wrote Hamlet?", "William Shakespeare"),
                                                         ("What is the capital of France?", "Paris")])))
    cfg = load_config("tiny_single", {"workflow": "search_single", "steps": 1, "data.source": str(tasks), "sft.steps": 0,
                                      "retriever": default_retriever_spec(data_dir), "rollout.prompts_per_step": 2,
                                      "rollout.n": 2, "rollout.max_new_tokens": 8})
    train(cfg, tmp_path / "run", fresh=True, progress=False)
    (m,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert m["agent/agent/num_calls/mean"] == m["num_turns/mean"] >= 1 and "wg/agent/actor/loss" in m


@pytest.mark.data
def test_compute_matched_refuses_another_suite_before_running(tmp_path, data_dir):
    from drmas_bench.api import EvalConfig, evaluate
    from drmas_bench.types import UserError

    team = evaluate(EvalConfig(model="tiny-random", suite="math", benchmarks=["aime24"], limit=1, n=1, max_new_tokens=4,
                               data_dir=str(data_dir), progress=False, out=str(tmp_path / "team")))
    cfg = EvalConfig(model="tiny-random", suite="search", workflow="search_single", limit=1, data_dir=str(data_dir),
                     progress=False, out=str(tmp_path / "single"))
    with pytest.raises(UserError, match="is a math run"):
        evaluate_compute_matched(cfg, team.run_dir)
    assert not (tmp_path / "single").exists()
    with pytest.raises(UserError, match="not a run directory"):
        evaluate_compute_matched(cfg, tmp_path / "nope")


def test_math_single_warm_start_examples_are_the_workflows_own_prompts_with_boxed_targets():
    """tiny_single's sft stage: math_single's packaged prompt on toy sums, target \\boxed{N}, right
    with probability solver_accuracy (else a near miss), reproducible from the seed."""
    import re

    from drmas_bench.workflows import get_workflow
    from drmas_bench.suites.math.math_single import math_single_sft_examples

    assert get_workflow("math_single").sft is math_single_sft_examples
    ex = math_single_sft_examples(["solver"], 200, seed=3, solver_accuracy=0.5, max_operand=9)
    assert ex == math_single_sft_examples(["solver"], 200, seed=3, solver_accuracy=0.5, max_operand=9)
    tpl = P.default_templates("math_single")
    right = 0
    for e in ex:
        a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", e.messages[-1]["content"]).groups())
        assert e.messages == P.chat(tpl, "solver", question=f"What is {a} + {b}?")
        assert P.valid("solver", e.target)
        right += e.target == f"\\boxed{{{a + b}}}"
    assert 60 < right < 140  # about half
    with pytest.raises(ValueError, match="solver"):
        math_single_sft_examples(["checker"], 1)
