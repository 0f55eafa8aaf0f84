"""The CPU toy team with four agents (toy_4agent: math_4agent's loop on "What is a + b?"), its warm
start and the tiny_4agent recipe. The recipe trains whole in CI's tiny phase (.ci/run), against
trainer/recipes/tiny_4agent_bands.json."""

from __future__ import annotations

import asyncio
import json

import pytest

from drmas_bench.types import Completion, Sampling, Task
from drmas_bench.workflows import get_workflow
from drmas_bench.suites.toy.toy_4agent import toy4_sft_examples
from drmas_bench.workflows.base import Episode
from drmas_trainer.config.train import RECIPES_DIR, load_config


class Scripted:
    """A fake model per agent: each agent answers its list in order (the last entry repeated)."""

    def __init__(self, scripts):
        self.scripts, self.calls = scripts, []

    def worker_group(self, agent):
        return agent

    def sampling(self, agent):
        return Sampling()

    async def generate(self, agent, request):
        k = sum(a == agent for a, _ in self.calls)
        self.calls.append((agent, request.messages[-1]["content"]))
        s = self.scripts[agent]
        return Completion(text=s[min(k, len(s) - 1)])


def _run(scripts, rounds=2):
    wf = get_workflow("toy_4agent")
    b = Scripted(scripts)
    ep = Episode(Task("1", "toy", "What is 2 + 3?", ["5"]), 0, b, wf.agents)
    asyncio.run(wf.fn(ep, rounds=rounds))
    return ep.finish(), b


def test_toy_4agent_runs_the_4agent_loop():
    s = {"solver": ["<answer>4</answer>", "<answer>5</answer>"], "critic": ["<critique>wrong</critique>"],
         "refiner": ["<answer>6</answer>"], "checker": ["<verdict>reject</verdict>"]}
    traj, b = _run(s)
    assert [a for a, _ in b.calls] == ["solver", "critic", "refiner", "checker", "solver"]
    assert traj.final_answer == "<answer>5</answer>" and all(t.valid for t in traj.turns)
    assert "Proposed answer: 4\nCritique: wrong" in b.calls[2][1]  # the refiner sees the answer and the critique
    assert "Proposed answer: 6" in b.calls[3][1]  # the checker judges the refined answer
    assert "previous answer 6 was rejected" in b.calls[4][1]
    traj, b = _run({**s, "checker": ["<verdict>approve</verdict>"]})
    assert len(b.calls) == 4 and traj.final_answer == "<answer>6</answer>"  # approved: the refiner's answer
    traj, b = _run({**s, "checker": ["no tag"], "critic": ["fine"]})
    assert len(b.calls) == 4 and [t.valid for t in traj.turns] == [True, False, True, False]
    assert "Critique: fine" in b.calls[2][1]


def test_the_warm_start_teaches_each_agent_its_format_at_the_set_accuracy():
    agents = ["solver", "critic", "refiner", "checker"]
    ex = toy4_sft_examples(agents, 400, seed=3, solver_accuracy=0.7, checker_accuracy=0.9)
    assert ex == toy4_sft_examples(agents, 400, seed=3, solver_accuracy=0.7, checker_accuracy=0.9)
    rules = get_workflow("toy_4agent").rules
    for agent in agents:
        mine = [e for e in ex if e.agent == agent]
        assert len(mine) == 400 and not any(rules[agent](e.target) for e in mine)
    refiner = [e for e in ex if e.agent == "refiner"]
    right = sum(str(asked_sum(e.messages[-1]["content"])) in e.target for e in refiner) / len(refiner)
    assert 0.6 < right < 0.8
    critic = [e for e in ex if e.agent == "critic"]
    agree = sum((("right" in e.target) == (proposed(e) == asked_sum(e.messages[-1]["content"]))) for e in critic)
    assert 0.85 < agree / len(critic) < 0.95
    with pytest.raises(ValueError, match="not fixer"):
        toy4_sft_examples(["fixer"], 1)


def asked_sum(user: str) -> int:
    """The sum asked by "What is a + b?" (parsed, not evaluated)."""
    a, b = user.split("?")[0].removeprefix("What is ").split(" + ")
    return int(a) + int(b)


def proposed(e) -> int:
    return int(e.messages[-1]["content"].split("Proposed answer: ")[1].split("\n")[0])


def test_the_tiny_4agent_recipe_and_its_bands_load():
    cfg = load_config("tiny_4agent")
    assert cfg.workflow == "toy_4agent" and cfg.device == "cpu" and cfg.model == "tiny-random"
    bands = json.loads((RECIPES_DIR / "tiny_4agent_bands.json").read_text())
    assert bands["recipe"] == "tiny_4agent"
    names = {b["metric"] if isinstance(b["metric"], str) else "list" for b in bands["bands"]}
    assert {"critic/score/mean", "agent/refiner/valid/mean"} <= names
