"""The trainer with the newer reference's switches: KL in the reward against a frozen reference policy
(full weights: a copy of the recipe's model; LoRA: the base with the adapters off), the loss balance
by agent frequency and the per-step advantage metrics, on micro runs of the tiny recipes; and the
memory plan's count of the reference policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drmas_trainer.config.train import load_config
from drmas_trainer.config.groups import plan_worker_groups
from drmas_trainer.forecast.memory import memory_plan
from drmas_trainer.forecast.shapes import model_shape

# a micro tiny without the warm start: at step 1 the policy is the recipe's model, i.e. the reference
MICRO = {"sft.steps": 0, "sft.agent_steps": {}, "rollout.prompts_per_step": 2, "rollout.n": 4, "val.before_train": False, "val.every": 0,
         "rollout.max_new_tokens": 6, "data.size": 40, "agent_defaults.micro_batch_size": 16,
         "algo.use_kl_in_reward": True, "algo.kl_penalty": "low_var_kl", "algo.kl_ctrl.type": "adaptive",
         "algo.kl_ctrl.kl_coef": 0.01, "algo.kl_ctrl.target_kl": 0.001, "algo.kl_ctrl.horizon": 50,
         "algo.balance_loss_by_agent_freq": True, "save_every": 1,
         "algo.entropy_coef": 0.05}  # a gradient even when every advantage is 0: the weights move at step 1


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _plan(recipe: str, **over):
    cfg = load_config(recipe, over)
    groups = plan_worker_groups(cfg, ("solver", "verifier"))
    return memory_plan(cfg, groups, {g: model_shape(p.settings.model) for g, p in groups.items()}, use_ray=True)


def test_the_memory_plan_counts_a_frozen_reference_per_full_weight_group_and_none_for_lora():
    off, on = _plan("math_qwen3_4b"), _plan("math_qwen3_4b", **{"algo.use_kl_in_reward": True})
    for a, b in zip(off.groups, on.groups):
        extra = {k: v for k, v in b.resident.items() if k not in a.resident}
        assert len(extra) == 1 and next(iter(extra)).startswith("reference policy")
        # bf16 or fp32; sharded like its policy over the recipe's fsdp.ranks GPUs (one GPU's share)
        ranks = on.ranks
        assert next(iter(extra.values())) in {-(-w * b.shape.params // ranks) for w in (2, 4)}
    lora_off = _plan("math_qwen3_4b_lora")
    lora_on = _plan("math_qwen3_4b_lora", **{"algo.use_kl_in_reward": True})
    assert [g.resident for g in lora_off.groups] == [g.resident for g in lora_on.groups]


@pytest.mark.slow
def test_kl_in_reward_balance_and_metrics_through_a_run_and_its_resume(tmp_path):
    from drmas_trainer.trainer import train

    run = tmp_path / "run"
    train(load_config("tiny", {**MICRO, "steps": 1}), run, use_ray=False, progress=False)
    train(load_config("tiny", {**MICRO, "steps": 2}), run, resume=True, use_ray=False, progress=False)
    r1, r2 = records(run)
    # step 1: policy = reference, so the KL is 0 (same weights, same forward) and beta is kl_coef
    assert r1["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-7)
    assert r1["actor/reward_kl_penalty_coeff"] == 0.01
    assert r1["actor/reward_kl_penalty_coeff_next"] < 0.01  # KL below target_kl: the adaptive beta shrinks
    # the resumed step 2 starts from the controller value step 1 left
    assert r2["actor/reward_kl_penalty_coeff"] == r1["actor/reward_kl_penalty_coeff_next"]
    # the resumed policy is step 1's checkpoint, the reference still the recipe's model: they differ
    assert r1["actor/grad_norm"] > 0 and r2["actor/reward_kl_penalty"] > 1e-9
    for r in (r1, r2):
        for a in ("solver", "checker"):
            assert {f"adv_diag/{a}/inflation_factor_mean", f"adv_std/{a}/mean", f"adv_norm/{a}/abs_max"} <= set(r)


@pytest.mark.slow
def test_lora_reference_is_the_base_with_the_adapters_off(tmp_path):
    from drmas_trainer.trainer import train

    run = tmp_path / "run"
    train(load_config("tiny_lora", {**MICRO, "steps": 2}), run, use_ray=False, progress=False)
    r1, r2 = records(run)
    assert r1["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-7)  # fresh adapters are zero: policy = base
    assert r1["actor/grad_norm"] > 0 and r2["actor/reward_kl_penalty"] > 1e-9
