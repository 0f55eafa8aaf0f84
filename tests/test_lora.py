"""Per-agent LoRA over one shared base (issue 27): the config, the worker group's adapters (only
they train, each with its own optimiser), checkpoints in peft's format, engines serving adapters."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from drmas_bench.types import UserError
from drmas_trainer.config import load_config, plan_worker_groups

AGENTS = ("solver", "checker")
LORA = {"rank": 4, "alpha": 8}


def _cfg(**over):
    d = {"workflow": "toy", "model": "tiny-random", "shared_base": True, "device": "cpu",
         "agent_defaults": {"lora": dict(LORA), "engine": "hf", "micro_batch_size": 4},
         "rollout": {"prompts_per_step": 2, "n": 2}}
    d.update(over)
    return load_config(d)


# ------------------------------------------------------------------ config


def test_shared_base_plan_one_group_adapter_per_agent_own_lr():
    cfg = _cfg(agents={"solver": {"lr": 1e-3}, "checker": {"lr": 5e-4, "lora": {"rank": 2}}})
    plan = plan_worker_groups(cfg, AGENTS)
    assert list(plan) == ["shared"]
    g = plan["shared"]
    assert g.agents == list(AGENTS) and g.adapter_of == {"solver": "solver", "checker": "checker"}
    assert g.adapters["solver"].lr == 1e-3 and g.adapters["checker"].lr == 5e-4
    assert g.adapters["checker"].lora.rank == 2 and g.adapters["solver"].lora.rank == 4


def test_lora_without_shared_base_is_one_adapter_per_group():
    plan = plan_worker_groups(_cfg(shared_base=False), AGENTS)
    assert list(plan) == list(AGENTS)
    assert plan["solver"].adapter_of == {"solver": "solver"} and plan["checker"].adapters.keys() == {"checker"}
    shared = plan_worker_groups(_cfg(shared_base=False, shared=True), AGENTS)["shared"]
    assert shared.adapter_of == {"solver": "shared", "checker": "shared"}  # the agents share one adapter


@pytest.mark.parametrize("over, msg", [
    ({"shared": True}, "exclude each other"),
    ({"agent_defaults": {"engine": "hf"}}, "has no lora settings"),
    ({"agent_defaults": {"lora": {"rank": 0}}}, "agent_defaults.lora.rank"),
    ({"agent_defaults": {"lora": {"target_modules": []}}}, "target_modules"),
    ({"agent_defaults": {"lora": {"ranks": 4}}}, "ranks"),
    ({"agent_defaults": {"lora": dict(LORA), "engine": "hf"}, "agents": {"solver": {"dtype": "bfloat16"}}},
     "disagree on dtype"),
])
def test_bad_lora_configs_are_one_line(over, msg):
    with pytest.raises(UserError, match=msg):
        plan_worker_groups(_cfg(**over), AGENTS)


# ------------------------------------------------------------------ the worker group


def _group(cfg, path=None):
    from drmas_bench.models import resolve_model
    from drmas_trainer.worker import WorkerGroup

    g = plan_worker_groups(cfg, AGENTS)["shared"]
    return WorkerGroup(g.name, g.agents, g.settings, str(path or resolve_model("tiny-random")), device="cpu",
                       seed=0, torch_threads=1, adapters=g.adapters, adapter_of=g.adapter_of)


def _split(model):
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    ad = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    return base, ad


def _examples():
    from drmas_trainer.sft import toy_sft_examples

    return toy_sft_examples(list(AGENTS), 16, seed=0)


def test_two_agent_lora_sft_trains_only_the_adapters_and_saves_peft_folders(tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file

    from drmas_bench.models import resolve_model
    from drmas_bench.models.loading import load_causal_lm

    wg = _group(_cfg())
    base0, ad0 = _split(wg.policy)
    assert all(not p.requires_grad for n, p in wg.policy.named_parameters() if "lora_" not in n)
    assert {id(p) for p in wg.params} == {id(p) for ps in wg.adapter_params.values() for p in ps}
    out = asyncio.run(wg.sft(_examples(), steps=6, lr=2e-2, batch_size=8))
    assert out["sft_steps"] == 6 and out["sft_loss_last"] < out["sft_loss_first"]
    base1, ad1 = _split(wg.policy)
    assert base1.keys() == base0.keys() and all(torch.equal(base0[k], base1[k]) for k in base0)  # bitwise
    moved = {k for k in ad0 if not torch.equal(ad0[k], ad1[k])}
    assert any(".solver." in k for k in moved) and any(".checker." in k for k in moved)
    sol = {k.replace(".solver.", "."): v for k, v in ad1.items() if ".solver." in k}
    chk = {k.replace(".checker.", "."): v for k, v in ad1.items() if ".checker." in k}
    assert sol.keys() == chk.keys() and any(not torch.equal(sol[k], chk[k]) for k in sol)  # two different adapters

    asyncio.run(wg.save(str(tmp_path / "wg"), str(tmp_path / "optim.pt")))
    rec = json.loads((tmp_path / "wg" / "base.json").read_text())
    assert rec["name"] == "tiny-random" and len(rec["identity"]["content"]) == 32
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    for agent in AGENTS:
        folder = tmp_path / "wg" / agent
        cfg = json.loads((folder / "adapter_config.json").read_text())
        assert cfg["r"] == 4 and cfg["base_model_name_or_path"] == "tiny-random" and cfg["peft_type"] == "LORA"
        assert all(".lora_" in k and f".{agent}." not in k for k in load_file(str(folder / "adapter_model.safetensors")))
        loaded = PeftModel.from_pretrained(load_causal_lm(str(resolve_model("tiny-random"))), str(folder)).eval()
        wg.policy.eval()
        wg._use_agent(agent)
        with torch.no_grad():
            assert torch.allclose(loaded(ids).logits, wg.policy(ids).logits, atol=1e-6)
    state = torch.load(tmp_path / "optim.pt", weights_only=True)
    assert set(state["optimizer"]) == set(AGENTS)  # one optimiser state per agent


def test_update_steps_each_adapter_with_its_own_lr_and_zero_lr_freezes_it():
    from drmas_trainer.worker import LossSettings, Row

    wg = _group(_cfg(agents={"solver": {"lr": 1e-2}, "checker": {"lr": 0.0}}))
    _, ad0 = _split(wg.policy)
    rows = [Row(a, [1, 5, 9, 13], [7, 8, 2], [-1.0, -1.2, -0.9], adv)
            for a in AGENTS for adv in (1.0, -1.0, 0.5, -0.5)]
    m = asyncio.run(wg.update(rows, loss=LossSettings()))
    assert m["optimizer_steps"] == 1 and set(m["agent_grad_norm"]) == set(AGENTS)
    assert all(v > 0 for v in m["agent_grad_norm"].values())
    _, ad1 = _split(wg.policy)
    assert any(not torch.equal(ad0[k], ad1[k]) for k in ad0 if ".solver." in k)
    assert all(torch.equal(ad0[k], ad1[k]) for k in ad0 if ".checker." in k)  # lr 0: its adapter never moves
    lrs = {g["adapter"]: g["lr"] for g in wg.optimizer.param_groups}
    assert lrs == {"solver": 1e-2, "checker": 0.0}
