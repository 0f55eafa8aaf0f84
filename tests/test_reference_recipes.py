"""The recipes that mirror the newer reference's scripts: each loads, sets what its script sets, and
its memory plan fits one 140 GiB GPU (an H200) at the script's prompt limit."""

from __future__ import annotations

import pytest

from drmas_bench.workflows.base import get_workflow
from drmas_trainer.config.train import load_config
from drmas_trainer.config.groups import plan_worker_groups
from drmas_trainer.forecast.memory import memory_plan
from drmas_trainer.forecast.shapes import model_shape

# recipe -> (the script's prompt limit, what it sets beyond the paper's math recipe)
RECIPES = {
    "math_qwen3_4b_lemma_diagnostics": (8192, {"estimator": "grpo", "adv_metrics": "40f50a1"}),
    "math_qwen3_4b_loss_balance_vanilla": (8192, {"estimator": "grpo", "balance_loss_by_agent_freq": True}),
    "math_qwen3_4b_loss_balance_drmas": (8192, {"estimator": "drmas", "balance_loss_by_agent_freq": True}),
    "math_qwen3_4b_std_tracking": (8192, {"estimator": "drmas", "norm_by_std": True, "adv_metrics": "755152e"}),
    "math_qwen3_4b_no_std_norm": (8192, {"estimator": "drmas", "norm_by_std": False}),
    "math_qwen3_4b_gradclip_0.1": (8192, {"estimator": "grpo"}),
    "math_qwen3_4b_gradclip_0.2": (8192, {"estimator": "grpo"}),
    "math_qwen3_4b_gradclip_0.5": (8192, {"estimator": "grpo"}),
    "math_qwen3_4b_adaptive_kl": (8192, {"estimator": "grpo", "use_kl_in_reward": True, "kl_penalty": "kl"}),
    "gspo_math_qwen3_4b": (8192, {"loss": "gspo", "clip_low": 0.2, "clip_high": 0.2, "agg": "seq-mean-token-mean"}),
    "gspo_search_qwen2.5_3b": (4096, {"loss": "gspo", "clip_low": 0.2, "clip_high": 0.2, "agg": "seq-mean-token-mean",
                                      "estimator": "drmas", "c_inv": 0.01, "mini_batches": 5}),
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_reference_recipe_sets_its_script_and_fits_one_h200(recipe):
    prompt_tokens, algo = RECIPES[recipe]
    cfg = load_config(recipe)
    for key, want in algo.items():
        assert getattr(cfg.algo, key) == want, key
    groups = plan_worker_groups(cfg, get_workflow(cfg.workflow).agents)
    plan = memory_plan(cfg, groups, {g: model_shape(p.settings.model) for g, p in groups.items()}, gpu_gib=140,
                       use_ray=True, prompt_tokens=prompt_tokens)
    assert plan.fits, f"{recipe}: {plan.peak.phase} needs {plan.peak.bytes / 2**30:.1f} GiB"
    if recipe.startswith("math_qwen3_4b_gradclip_"):
        assert {p.settings.grad_clip for p in groups.values()} == {float(recipe.rsplit("_", 1)[1])}
    if cfg.algo.use_kl_in_reward:
        k = cfg.algo.kl_ctrl
        assert (k.type, k.kl_coef, k.target_kl, k.horizon) == ("adaptive", 0.001, 0.1, 10000)
        assert all(any(n.startswith("reference policy") for n in m.resident) for m in plan.groups)
