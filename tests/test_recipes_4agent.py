"""The paper's 4-agent recipes (Dr. MAS and its vanilla-GRPO control, mirroring the reference's
run_math_4agent{,_vanilla}.sh) and their memory plans on one H200 (the CPU toy team: test_toy_4agent.py).
One training step of each, shrunk to tiny-random on CPU, runs in tests/test_recipes_smoke.py."""

from __future__ import annotations

import pytest
import yaml

from drmas_bench.cli import main
from drmas_trainer.config.train import RECIPES_DIR, load_config

PAPER = ("math_qwen3_4b_4agent", "math_qwen3_4b_4agent_vanilla")


def _recipe(recipe: str) -> dict:
    return yaml.safe_load((RECIPES_DIR / f"{recipe}.yaml").read_text())


def test_the_two_paper_recipes_are_the_reference_scripts_and_differ_only_in_the_statistics():
    a, b = (_recipe(r) for r in PAPER)
    assert a["algo"].pop("estimator") == "drmas" and b["algo"].pop("estimator") == "grpo"
    assert a == b
    cfg = load_config(PAPER[0])
    assert cfg.workflow == "math_4agent" and cfg.workflow_options == {"rounds": 2} and not cfg.shared
    assert (cfg.rollout.prompts_per_step, cfg.rollout.n, cfg.rollout.max_new_tokens) == (32, 8, 4096)
    assert (cfg.algo.c_inv, cfg.agent_defaults["lr"], cfg.agent_defaults["micro_batch_size"]) == (0.1, 1e-6, 4)


@pytest.mark.parametrize("recipe", PAPER)
def test_the_paper_recipes_plan_on_one_h200_with_updates_one_at_a_time(recipe, capsys):
    rc = main(["train", "--recipe", recipe, "--plan", "--local"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert all(f"worker group {a}" in out.out for a in ("solver", "critic", "refiner", "verifier"))
    rc = main(["train", "--recipe", recipe, "--plan"])  # Ray actors: four updates at once
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("plan:")]
    assert rc == 1 and "update (all groups at once)" in line
