"""The toy_fixer workflow (a fixer that acts only after a wrong answer), its recipe, and the factor it
is built to show: the fixer's rows come from failing episodes, so under global statistics its
second-moment factor is far above 1 while the solver's is below 1."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from test_moment_factor import study_module  # tests/ is on sys.path (rootdir conftest)

from drmas_bench.records import RecordView
from drmas_bench.types import Completion, Sampling, Task
from drmas_bench.workflows import get_workflow
from drmas_bench.workflows.base import Episode
from drmas_bench.suites.toy.toy_fixer import fixer_effects, toy_fixer_sft_examples
from drmas_trainer.moment_factor import second_moment_factors


class ScriptedBackend:
    """A fake: each agent answers from its own script, in order."""

    def __init__(self, scripts: dict[str, list[str]]) -> None:
        self.scripts = {a: list(s) for a, s in scripts.items()}
        self.seen: list[tuple[str, str]] = []

    def worker_group(self, agent: str) -> str:
        return agent

    def sampling(self, agent: str) -> Sampling:
        return Sampling(max_new_tokens=10)

    async def generate(self, agent: str, request) -> Completion:
        self.seen.append((agent, request.messages[-1]["content"]))
        return Completion(self.scripts[agent].pop(0), prompt_tokens=5, completion_tokens=8, latency_s=0.0, finish="stop")


def episode(scripts: dict[str, list[str]], **options):
    spec = get_workflow("toy_fixer")
    backend = ScriptedBackend(scripts)
    ep = Episode(Task("t0", "toy", "What is 3 + 4?", ["7"]), 0, backend, spec.agents)
    asyncio.run(spec.fn(ep, **options))
    return ep.finish(), backend


def test_declaration() -> None:
    spec = get_workflow("toy_fixer")
    assert spec.agents == ("solver", "fixer") and spec.family == "toy" and spec.defaults == {"fixes": 2}
    assert {a: r.name for a, r in spec.rules.items()} == {"solver": "toy_answer", "fixer": "toy_answer"}
    assert spec.effects[0] == "fixer" and spec.sft is toy_fixer_sft_examples
    assert spec.rules["fixer"].reasons("<answer>7</answer>") == []
    assert spec.rules["fixer"].reasons("7") == ["missing_answer_tag"]


def test_a_right_first_answer_ends_the_episode() -> None:
    traj, backend = episode({"solver": ["<answer>7</answer>"], "fixer": []})
    assert [t.agent for t in traj.turns] == ["solver"] and traj.turns[0].valid
    assert traj.final_answer == "<answer>7</answer>" and backend.seen == [("solver", "What is 3 + 4?")]
    assert get_workflow("toy_fixer").round1_answer(traj) is None


def test_the_fixer_acts_only_after_a_wrong_answer_and_at_most_fixes_times() -> None:
    traj, backend = episode({"solver": ["<answer>6</answer>"], "fixer": ["<answer>8</answer>", "9", "<answer>7</answer>"]})
    assert [t.agent for t in traj.turns] == ["solver", "fixer", "fixer"]  # fixes=2: the third answer is never asked
    assert [t.valid for t in traj.turns] == [True, True, False]  # the untagged "9" fails the answer rule
    assert traj.final_answer == "9"
    # each fixer call is told the wrong answer it must replace
    assert backend.seen[1] == ("fixer", "What is 3 + 4?\nThe answer 6 is wrong.")
    assert backend.seen[2] == ("fixer", "What is 3 + 4?\nThe answer 8 is wrong.")
    assert get_workflow("toy_fixer").round1_answer(traj) == "<answer>6</answer>"

    traj, _ = episode({"solver": ["<answer>5</answer>"], "fixer": ["<answer>7</answer>", "<answer>1</answer>"]})
    assert [t.agent for t in traj.turns] == ["solver", "fixer"] and traj.final_answer == "<answer>7</answer>"

    traj, _ = episode({"solver": ["<answer>5</answer>"], "fixer": ["<answer>7</answer>"]}, fixes=0)
    assert [t.agent for t in traj.turns] == ["solver"] and traj.final_answer == "<answer>5</answer>"


def test_effects_count_fixer_calls_and_fixes() -> None:
    def rec(agents: list[str], correct: bool) -> RecordView:
        return RecordView.of({"turns": [{"agent": a} for a in agents], "correct": correct})

    out = fixer_effects([rec(["solver"], True), rec(["solver", "fixer"], True), rec(["solver", "fixer", "fixer"], False),
                         rec(["solver", "fixer", "fixer"], False)])
    assert out == {"episodes": 4, "solver_accuracy": 0.25, "fixer_called_rate": 0.75, "fix_rate": pytest.approx(1 / 3)}


def test_warm_start_examples() -> None:
    ex = toy_fixer_sft_examples(["solver", "fixer"], 400, seed=1, solver_accuracy=0.9, fixer_accuracy=0.2)
    solver = [e for e in ex if e.agent == "solver"]
    fixer = [e for e in ex if e.agent == "fixer"]
    assert len(solver) == len(fixer) == 400

    def right(e) -> bool:
        q = e.messages[-1]["content"].split("\n")[0]
        a, b = (int(x) for x in q.removeprefix("What is ").removesuffix("?").split(" + "))
        return e.target == f"<answer>{a + b}</answer>"

    assert 0.85 < sum(map(right, solver)) / 400 < 0.95 and 0.15 < sum(map(right, fixer)) / 400 < 0.25
    for e in fixer:  # never the answer it was told is wrong
        wrong = e.messages[-1]["content"].split("The answer ")[1].split(" is wrong")[0]
        assert e.target != f"<answer>{wrong}</answer>"
    with pytest.raises(ValueError, match="solver and fixer"):
        toy_fixer_sft_examples(["checker"], 1)


class CoinBackend:
    """A fake: the solver is right with probability p_solver, the fixer with p_fixer."""

    def __init__(self, rng: random.Random, p_solver: float, p_fixer: float) -> None:
        self.rng, self.p = rng, {"solver": p_solver, "fixer": p_fixer}

    def worker_group(self, agent: str) -> str:
        return agent

    def sampling(self, agent: str) -> Sampling:
        return Sampling(max_new_tokens=10)

    async def generate(self, agent: str, request) -> Completion:
        ans = 7 if self.rng.random() < self.p[agent] else 6
        return Completion(f"<answer>{ans}</answer>", prompt_tokens=5, completion_tokens=8, latency_s=0.0, finish="stop")


def test_the_fixer_factor_is_far_above_one() -> None:
    """Episodes of the real workflow (fake models: solver right 90 %, fixer 20 %), 16 per prompt as in
    the recipe, scored as the trainer scores rows: the fixer's factor is >= 2, the solver's < 1."""
    spec = get_workflow("toy_fixer")
    backend = CoinBackend(random.Random(0), 0.9, 0.2)
    scores, uid, agent = [], [], []
    for u in range(200):
        for i in range(16):
            ep = Episode(Task(f"q{u}", "toy", "What is 3 + 4?", ["7"]), i, backend, spec.agents)
            asyncio.run(spec.fn(ep))
            traj = ep.finish()
            r = float(traj.final_answer == "<answer>7</answer>")
            for t in traj.turns:
                scores.append(r - 0.1 * (not t.valid))
                uid.append(u)
                agent.append(spec.agents.index(t.agent))
    f = second_moment_factors(torch.tensor(scores), torch.tensor(uid), torch.tensor(agent), 2)
    assert f[1][0] >= 2.5 and f[0][0] < 1.0, f


def test_recipe_loads() -> None:
    from drmas_trainer.config.train import load_config

    cfg = load_config("tiny_fixer", {"algo.estimator": "traj_traj", "algo.group_by_agent": True})
    assert cfg.workflow == "toy_fixer" and cfg.workflow_options == {"fixes": 2}
    assert cfg.rollout.n == 16 and cfg.sft.fixer_accuracy < cfg.sft.solver_accuracy
    assert cfg.algo.group_by_agent is True


def test_fixer_accuracy_is_the_workflows_own_warm_start_option() -> None:
    """``sft.fixer_accuracy`` is a keyword of toy_fixer's example maker, not a trainer field: checked by
    name and type against that maker, refused for a workflow whose maker does not take it."""
    from drmas_trainer.config.train import SFTConfig, load_config
    from drmas_bench.types import UserError

    assert "fixer_accuracy" not in SFTConfig.model_fields
    assert load_config("tiny_fixer", {"sft.fixer_accuracy": 0.5}).sft.model_extra == {"fixer_accuracy": 0.5}
    with pytest.raises(UserError, match="sft.fixer_accuracy: expected float"):
        load_config("tiny_fixer", {"sft.fixer_accuracy": "lots"})
    with pytest.raises(UserError, match="sft.fixer_acuracy: unknown key.*warm-start options: fixer_accuracy, "):
        load_config("tiny_fixer", {"sft.fixer_acuracy": 0.5})
    with pytest.raises(UserError, match="sft.fixer_accuracy: unknown key.*workflow toy's warm-start options: "
                                        "checker_accuracy"):
        load_config("tiny", {"sft.fixer_accuracy": 0.5})


# ------------------------------------------------------------------------------ the study's 2 x 2



def test_study_arms_set_the_group_index() -> None:
    s = study_module()
    assert s.arm_overrides("drmas") == {"algo.estimator": "drmas"}
    assert s.arm_overrides("traj_traj@agent") == {"algo.estimator": "traj_traj", "algo.group_by_agent": True}
    assert s.arm_overrides("agent_agent@uid") == {"algo.estimator": "agent_agent", "algo.group_by_agent": False}
    from drmas_bench.types import UserError

    with pytest.raises(UserError, match="agent or uid"):
        s.arm_overrides("traj_traj@both")
    assert s.SETTINGS["fixer"].recipe == "tiny_fixer"
    cfg = s._config(s.SETTINGS["fixer"], "traj_traj@agent", 3, 2)
    assert (cfg.workflow, cfg.algo.estimator, cfg.algo.group_by_agent, cfg.seed, cfg.steps) == ("toy_fixer", "traj_traj", True, 3, 2)


def _fake_run(spikes: float, g2: float, factor: float) -> dict:
    """A run's metrics as `run_metrics` returns them (made up: the 2 x 2's arithmetic is under test)."""
    agent = {"spread": spikes, "spikes": spikes, "max": spikes, "median": 1.0, "g2": g2, "factor": factor,
             "adv_m2": g2, "steps": []}
    return {"agents": {"fixer": agent}, "last10": 0.5, "eval": 0.5}


def test_study_factorial_separates_the_two_changes() -> None:
    """Made-up cells where global statistics add 2 spikes at either level and the level adds nothing:
    the statistics effect is 2 in every seed, the level effect and the interaction 0."""
    s = study_module()
    arms = {e: {k: _fake_run(base + k % 3, 4.0 if cell[1] == "global" else 1.0, 3.0) for k in range(8)}
            for e, base, cell in (("grpo", 3.0, ("traj", "global")), ("global_step", 3.0, ("step", "global")),
                                  ("traj_traj@agent", 1.0, ("traj", "agent")), ("drmas", 1.0, ("step", "agent")))}
    lines, claims = s._factorial_lines("fixer", arms, ["fixer"])
    row = next(x for x in lines if x.startswith("| fixer: steps with grad norm > k x median | statistics |"))
    assert "| 2.000 [2.000, 2.000] |" in row and "| 8/8 | 0.008 |" in row
    level = next(x for x in lines if x.startswith("| fixer: steps with grad norm > k x median | level |"))
    assert "| 0.000 [0.000, 0.000] |" in level and "| 0/8 |" in level
    assert any("statistics effect" in c and "**yes**" in c for c in claims)
    assert all("**not shown**" in c for c in claims if "level effect" in c)
    ratio = s._ratio_lines(arms, ["fixer"])
    step = next(x for x in ratio if x.startswith("| `global_step` / `drmas` | fixer |"))
    assert "| 3.00 | 4.00 / 1.00 | 4.00 | 4.00 | 1.73 |" in step  # F, E[A^2] per arm, E[A^2] and E[g^2] ratios, sqrt(F)
    assert s._factorial_lines("fixer", {k: v for k, v in arms.items() if k != "drmas"}, ["fixer"]) == ([], [])


@pytest.mark.slow  # about 9 s of CPU: model loads, a warm start and a step
def test_one_training_step_logs_the_fixer_factor(tmp_path) -> None:
    """The real trainer on the recipe, shrunk (2 warm-start steps, 2 prompts x 4 rollouts, one RL
    step): both agents' grad norms and factors are logged under their own names."""
    import json

    from drmas_trainer import metric_names as N
    from drmas_trainer.config.train import load_config
    from drmas_trainer.trainer import train

    cfg = load_config("tiny_fixer", {"steps": 1, "sft.steps": 2, "sft.agent_steps": {}, "rollout.prompts_per_step": 2,
                                     "rollout.n": 4, "algo.mini_batches": 1, "algo.estimator": "grpo"})
    train(cfg, tmp_path / "run", fresh=True, use_ray=False, progress=False)
    (rec,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rec[N.agent("solver", N.CALLS)] == 1.0
    for a in ("solver", "fixer"):
        assert N.agent(a, N.MOMENT_FACTOR) in rec and N.agent(a, N.MOMENT_FACTOR_GROUPS) in rec
    assert N.agent("solver", N.GRAD_NORM) in rec
