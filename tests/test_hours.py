"""The predicted hours of a run (drmas_trainer.forecast.hours) against a plain hand computation of the same
formulas on random inputs, and the rollout budget (drmas_trainer.forecast.memory.rollout_peak) against brute
force. The recipes' own plans and hours: tests/test_paper_rows.py."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from drmas_trainer.config.train import load_config
from drmas_trainer.config.groups import plan_worker_groups
from drmas_trainer.forecast.hours import HARDWARE, MBU, MFU, _lru_wakes, hardware_for, predict
from drmas_trainer.forecast.memory import GIB, memory_plan, rollout_peak
from drmas_trainer.forecast.shapes import ModelShape

AGENTS = ("solver", "verifier")


def _random_case(rng: random.Random) -> tuple:
    shape = ModelShape(hidden=rng.choice([512, 1024, 2048]), layers=rng.randint(2, 40), heads=rng.choice([8, 16]),
                       kv_heads=rng.choice([2, 4, 8]), intermediate=rng.choice([2048, 4096, 8192]),
                       vocab=rng.choice([32_000, 151_936]), head_dim=rng.choice([0, 128]), tied=rng.random() < 0.5)
    calls = [{"agent": rng.choice(AGENTS), "share": rng.choice([1.0, 0.5, 0.25]),
              "context_tokens": rng.randint(0, 3000)} for _ in range(rng.randint(1, 5))]
    recipe = {
        "workflow": "math_refine", "model": "some/model", "shared": rng.random() < 0.5, "steps": rng.randint(1, 500),
        "rollout": {"prompts_per_step": rng.randint(1, 64), "n": rng.randint(1, 8),
                    "max_new_tokens": rng.randint(16, 4096), "old_logprobs": rng.choice(["recompute", "engine"])},
        "algo": {"ppo_epochs": rng.randint(1, 2), "mini_batches": 1, "use_kl_in_reward": rng.random() < 0.3},
        "agent_defaults": {"gradient_checkpointing": rng.random() < 0.5, "sleep_engine": True, "dtype": "bfloat16",
                           "optimizer_offload": rng.choice(["none", "cpu"]), "engine": "sglang",
                           "engine_options": {"mem_fraction_static": rng.choice([0.2, 0.4, 0.6])}},
        "fsdp": {"ranks": rng.choice([1, 2, 4, 8])},
        "plan": {"question_tokens": rng.randint(0, 500), "response_share": rng.uniform(0.05, 1.0), "calls": calls},
    }
    return shape, recipe


def _by_hand(cfg, shape, groups, gpu: str, capacity: int, ranks: int, gpus: int) -> dict:
    """The module docstring's formulas, written out once more with plain arithmetic."""
    hw = HARDWARE[gpu]
    P, W = shape.params, 2 * shape.params
    attn = 4 * shape.layers * shape.heads * (shape.head_dim or shape.hidden // shape.heads)
    kv = shape.layers * 2 * shape.kv_heads * (shape.head_dim or shape.hidden // shape.heads) * 2
    B = cfg.rollout.prompts_per_step * cfg.rollout.n
    L = cfg.rollout.max_new_tokens
    r = cfg.plan.response_share * L
    group_of = {a: g for g, p in groups.items() for a in p.agents}
    rollout = 0.0
    tokens = {g: 0.0 for g in groups}
    sq = {g: 0.0 for g in groups}
    awake: list[str] = []
    syncs = 0
    for c in cfg.plan.calls:
        b = c.share * B / ranks
        p = cfg.plan.question_tokens + c.context_tokens
        rollout += b * p * (2 * P + attn * p / 2) / (hw.bf16_flops * MFU)
        memory = (L * W + b * r * (p + r / 2) * kv) / (hw.hbm_bytes_s * MBU)
        compute = b * r * 2 * P / (hw.bf16_flops * MFU)
        rollout += max(memory, compute)
        g = group_of[c.agent]
        tokens[g] += c.share * B * (p + r)
        sq[g] += c.share * B * (p + r) ** 2 / 2
        if g in awake:
            awake.remove(g)
        else:
            syncs += 1
            if len(awake) >= capacity:
                awake.pop(0)
        awake.append(g)
    passes = (cfg.rollout.old_logprobs == "recompute") + cfg.algo.use_kl_in_reward + cfg.algo.ppo_epochs * (
        3 + cfg.agent_defaults["gradient_checkpointing"])
    per_group = []
    for g in groups:
        t = (tokens[g] * 2 * P + attn * sq[g]) * passes / (ranks * hw.bf16_flops * MFU)
        if cfg.agent_defaults["optimizer_offload"] == "cpu":
            t += cfg.algo.ppo_epochs * cfg.algo.mini_batches * (
                8 * P / ranks / hw.pcie_bytes_s + 28 * P / ranks / (hw.host_bytes_s / min(8, gpus)))
        per_group.append(t)
    # groups sharded over the same GPUs update in turn; unsharded groups on a GPU each, at the same time
    update = max(per_group) if ranks == 1 and len(groups) > 1 else sum(per_group)
    sync = syncs * (W * (ranks - 1) / ranks / hw.nvlink_bytes_s + 2 * W / hw.hbm_bytes_s)
    return {"rollout": rollout, "update": update, "sync": sync, "syncs": syncs,
            "hours": cfg.steps * (rollout + update + sync) / 3600}


@pytest.mark.parametrize("seed", range(12))
def test_the_hours_are_the_hand_computation_on_random_inputs(seed):
    rng = random.Random(seed)
    shape, recipe = _random_case(rng)
    cfg = load_config(recipe)
    groups = plan_worker_groups(cfg, AGENTS)
    shapes = {g: shape for g in groups}
    gpu = rng.choice(sorted(HARDWARE))
    plan = memory_plan(cfg, groups, shapes, gpu_gib=HARDWARE[gpu].memory_gib, use_ray=True)
    capacity = min((ro.awake for ro in plan.rollouts if ro.engines), default=len(groups))
    est = predict(cfg, groups, shapes, plan, HARDWARE[gpu], gpu=gpu, gpus=plan.n_gpus, tasks=None)
    want = _by_hand(cfg, shape, groups, gpu, max(capacity, 1), plan.ranks, plan.n_gpus)
    assert est.rollout_s == pytest.approx(want["rollout"], rel=1e-9)
    assert est.update_wall_s == pytest.approx(want["update"], rel=1e-9)
    assert est.sync_s == pytest.approx(want["sync"], rel=1e-9) and est.syncs == want["syncs"]
    assert est.hours == pytest.approx(want["hours"], rel=1e-9)


def test_decode_is_memory_bound_at_small_batch_and_compute_bound_at_large():
    shape = ModelShape(4096, 32, 32, 8, 14336, 128_256)
    base = {"workflow": "math_refine", "model": "m", "shared": True, "steps": 1,
            "agent_defaults": {"engine": "sglang", "sleep_engine": True}, "rollout": {"max_new_tokens": 512}}
    for n, bound in ((1, "memory"), (64, "compute")):
        cfg = load_config({**base, "rollout": {"max_new_tokens": 512, "prompts_per_step": 64, "n": n},
                           "plan": {"response_share": 1.0, "question_tokens": 0,
                                    "calls": [{"agent": "solver", "share": 1.0}]}})
        groups = plan_worker_groups(cfg, AGENTS)
        plan = memory_plan(cfg, groups, {g: shape for g in groups}, use_ray=True)
        est = predict(cfg, groups, {g: shape for g in groups}, plan, HARDWARE["h100"], gpu="h100", gpus=1, tasks=None)
        assert est.calls[0].decode_bound == bound


def test_wake_ups_follow_the_least_recently_used_engine():
    assert _lru_wakes(["a", "b", "a", "b"], 2) == [1, 1, 0, 0]  # both fit: each wakes once after the update
    assert _lru_wakes(["a", "b", "a", "b"], 1) == [1, 1, 1, 1]  # one at a time: every switch is a sync
    assert _lru_wakes(["a", "b", "c", "a"], 2) == [1, 1, 1, 1]  # c evicts a (least recently used)
    assert _lru_wakes(["a", "b", "a", "c", "a"], 2) == [1, 1, 0, 1, 0]  # c evicts b, a stays


@pytest.mark.parametrize("seed", range(20))
def test_the_rollout_budget_keeps_awake_the_most_engines_any_set_of_which_fits(seed):
    rng = random.Random(seed)
    engines = {f"g{i}": rng.randint(1, 40) * GIB for i in range(rng.randint(1, 5))}
    budget = rng.randint(0, 120) * GIB
    k, used = rollout_peak(engines, budget)
    sets = lambda n: itertools.combinations(engines.values(), n)  # noqa: E731
    assert all(sum(s) <= budget for s in sets(k))  # whichever k the pool keeps awake, they fit
    assert k == len(engines) or any(sum(s) > budget for s in sets(k + 1))  # and k + 1 may not
    assert used == max((sum(s) for s in sets(k)), default=0)


def test_hardware_defaults_follow_the_memory():
    assert hardware_for(None, 80)[0] == "h100" and hardware_for(None, 141)[0] == "h200"
    assert hardware_for("a100", 141)[0] == "a100" and hardware_for(None, None)[0] == "h200"
    for hw in HARDWARE.values():
        assert hw.source and math.isfinite(hw.bf16_flops) and hw.hbm_bytes_s > hw.nvlink_bytes_s > hw.pcie_bytes_s
