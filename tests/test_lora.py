"""Per-agent LoRA over one shared base: the config, the worker group's adapters (only
they train, each with its own optimiser), checkpoints in peft's format, engines serving adapters."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from drmas_bench.types import UserError
from drmas_trainer.config.train import load_config
from drmas_trainer.config.groups import plan_worker_groups

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
    from drmas_bench.suites.toy.toy import toy_sft_examples

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


# ------------------------------------------------------------------ engines


def _adapter_folder(tmp_path, agents=AGENTS, seed=0):
    """A worker group's adapter folder with random (non-zero) adapters, one per agent."""
    from drmas_bench.models import resolve_model
    from drmas_bench.models.adapters import save_adapter
    from drmas_bench.models.loading import load_causal_lm
    from drmas_trainer.config.train import AgentConfig
    from drmas_trainer.lora import attach

    torch.manual_seed(seed)
    base = str(resolve_model("tiny-random"))
    pm = attach(load_causal_lm(base), {a: AgentConfig(lora=LORA) for a in agents})
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    folder = tmp_path / "adapters"
    for a in agents:
        save_adapter(pm, a, folder / a, "tiny-random")
    (folder / "base.json").write_text(json.dumps({"name": "tiny-random"}))
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    return folder, pm


def _req(agent, i=0, tokens=6):
    from drmas_bench.types import Request, Sampling

    return Request(agent, [{"role": "user", "content": f"What is {i} + 2?"}], Sampling(max_new_tokens=tokens, seed=i,
                                                                                      temperature=0), want_logprobs=True)


def test_hf_engine_serves_each_agent_its_adapter_in_one_batch(tmp_path):
    from drmas_bench.engines import make_engine, traits

    assert traits("hf").serves_adapters and traits("sglang").serves_adapters and not traits("openai").serves_adapters
    folder, _ = _adapter_folder(tmp_path)
    base = make_engine("hf", "tiny-random", device="cpu", max_batch=8)
    eng = make_engine("hf", str(folder), device="cpu", max_batch=8)

    async def main():
        mixed = await eng.generate([_req("solver", 1), _req("checker", 1), _req("nobody", 1), _req("solver", 2)])
        alone = [(await eng.generate([r]))[0] for r in (_req("solver", 1), _req("checker", 1), _req("nobody", 1))]
        plain = (await base.generate([_req("x", 1)]))[0]
        return mixed, alone, plain

    mixed, alone, plain = asyncio.run(main())
    assert [c.token_ids for c in mixed[:3]] == [c.token_ids for c in alone]  # a batch never mixes adapters
    assert mixed[0].logprobs != mixed[1].logprobs  # two adapters, two policies
    assert mixed[2].token_ids == plain.token_ids and mixed[2].logprobs == pytest.approx(plain.logprobs, abs=1e-5)
    assert mixed[0].logprobs != pytest.approx(plain.logprobs, abs=1e-3)
    asyncio.run(eng.close())
    asyncio.run(base.close())


def test_hf_engine_update_adapter_changes_only_that_agent(tmp_path):
    from drmas_bench.engines import EngineError, make_engine
    from drmas_trainer.lora import adapter_tensors

    folder, pm = _adapter_folder(tmp_path)
    eng = make_engine("hf", str(folder), device="cpu")
    base_before = {k: v.clone() for k, v in eng._hf_model.state_dict().items() if "lora_" not in k}

    async def main():
        before = await eng.generate([_req("solver"), _req("checker")])
        zeroed = {k: torch.zeros_like(v) if "lora_B" in k else v for k, v in adapter_tensors(pm, "solver").items()}
        await eng.update_adapter("solver", {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}, zeroed)
        after = await eng.generate([_req("solver"), _req("checker")])
        with pytest.raises(EngineError, match="unknown tensor"):
            await eng.update_adapter("checker", {}, {"bogus.lora_A.weight": torch.zeros(2)})
        return before, after

    before, after = asyncio.run(main())
    assert after[1].logprobs == before[1].logprobs and after[0].logprobs != before[0].logprobs
    plain = make_engine("hf", "tiny-random", device="cpu")
    (ref,) = asyncio.run(plain.generate([_req("solver")]))
    assert after[0].logprobs == pytest.approx(ref.logprobs, abs=1e-5)  # B = 0: the adapter is the identity
    assert all(torch.equal(v, base_before[k]) for k, v in eng._hf_model.state_dict().items() if "lora_" not in k)


def test_trainer_sync_pushes_only_adapter_tensors(tmp_path):
    wg = _group(_cfg())
    sent = []

    class Spy:
        is_awake = True

        async def update_adapter(self, name, config, tensors):
            sent.append((name, config, tensors))

        async def update_weights(self, named):  # pragma: no cover - must not be called
            raise AssertionError("full weights pushed")

    wg.engine = Spy()
    asyncio.run(wg.sync_weights())
    assert [n for n, _, _ in sent] == ["solver", "checker"]
    for name, config, tensors in sent:
        assert config["r"] == 4 and config["peft_type"] == "LORA"
        assert tensors and all(".lora_A." in k or ".lora_B." in k for k in tensors)
    n_adapter = sum(t.numel() for _, _, ts in sent for t in ts.values())
    assert n_adapter == sum(p.numel() for p in wg.params) < sum(p.numel() for p in wg.policy.parameters()) / 4


def test_sglang_lora_args_and_lora_path_per_request(tmp_path):
    from drmas_bench.engines.sglang import generate_kwargs, lora_server_args
    from drmas_bench.models.adapters import adapter_layout

    folder, _ = _adapter_folder(tmp_path)
    layout = adapter_layout(folder)
    args = lora_server_args(layout)
    assert args["enable_lora"] is True and args["max_lora_rank"] == 4
    assert args["lora_target_modules"] == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                  "down_proj"])  # "all-linear" as peft resolved it
    assert args["lora_paths"] == {a: str(folder / a) for a in sorted(AGENTS)} and args["max_loras_per_batch"] >= 3
    assert args["model_path"].endswith("tiny-random")
    kw = generate_kwargs([[1], [2], [3]], [_req("solver"), _req("nobody"), _req("checker")], layout)
    assert kw["lora_path"] == ["solver", None, "checker"]
    assert "lora_path" not in generate_kwargs([[1]], [_req("solver")])


@pytest.fixture
def fake_sglang(monkeypatch):
    from test_engines_sglang import FAKE_ROOT, _drop_sglang_modules

    _drop_sglang_modules()
    monkeypatch.syspath_prepend(str(FAKE_ROOT))
    import sglang

    sglang.CALLS.clear()
    yield sglang
    _drop_sglang_modules()


def test_sglang_engine_serves_and_updates_adapters_on_the_fake(fake_sglang, tmp_path):
    from drmas_bench.engines import EngineError
    from drmas_bench.engines.sglang import SGLangEngine
    from drmas_trainer.lora import adapter_tensors

    folder, pm = _adapter_folder(tmp_path)
    eng = SGLangEngine(str(folder))

    async def main():
        a = await eng.generate([_req("solver"), _req("checker"), _req("nobody")])
        assert len({tuple(c.token_ids) for c in a}) == 3  # each adapter (and the base) its own outputs
        started = next(d for op, d in fake_sglang.CALLS if op == "Engine")
        assert started["enable_lora"] and set(started["lora_paths"]) == set(AGENTS)
        fake_sglang.CALLS.clear()
        t = {k: v * 2 for k, v in adapter_tensors(pm, "solver", torch.bfloat16).items()}
        await eng.update_adapter("solver", {"r": 4, "lora_alpha": 8, "peft_type": "LORA"}, t)
        ops = [op for op, _ in fake_sglang.CALLS]
        assert ops == ["unload_lora_adapter", "load_lora_adapter_from_tensors"]
        b = await eng.generate([_req("solver"), _req("checker"), _req("nobody")])
        assert b[0].token_ids != a[0].token_ids and [c.token_ids for c in b[1:]] == [c.token_ids for c in a[1:]]
        with pytest.raises(EngineError, match="max rank"):  # SGLang's memory pool was sized by the adapters
            await eng.update_adapter("solver", {"r": 64}, t)
        await eng.close()

    asyncio.run(main())


def test_trainer_lora_worker_on_sglang_child(fake_sglang, tmp_path):
    """start_engine (adapters saved, SGLang started on the base with them, in a child), generate per
    agent, update, sync (adapter tensors through the child): outputs move for the trained agent."""
    from drmas_bench.engines.hosting import ChildEngine
    from drmas_trainer.worker import LossSettings, Row

    wg = _group(_cfg(agent_defaults={"lora": dict(LORA), "engine": "sglang", "micro_batch_size": 4,
                                     "lr": 5e-2}, agents={"checker": {"lr": 0.0}}))

    async def main():
        await wg.start_engine()
        assert isinstance(wg.engine, ChildEngine)
        first = await wg.generate([_req("solver"), _req("checker")])
        rows = [Row(a, c.prompt_ids, c.token_ids, c.logprobs, adv) for a, c in zip(AGENTS, first) for adv in (1.0, -1.0)]
        await wg.update(rows, loss=LossSettings())
        await wg.sync_weights()
        after = await wg.generate([_req("solver"), _req("checker")])
        await wg.close()
        return first, after

    first, after = asyncio.run(main())
    assert after[0].token_ids != first[0].token_ids and after[1].token_ids == first[1].token_ids


# ------------------------------------------------------------------ eval of adapter checkpoints


def _texts(run_dir):
    """Every recorded turn's completion text, per trajectory."""
    recs = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    return [[t["completion"]["text"] for t in rec["turns"]] for rec in recs]


@pytest.mark.slow
def test_train_tiny_lora_then_eval_its_adapters(tmp_path):
    """2 RL steps of a 2-agent shared-base LoRA run (short warm start), then eval of the step folder
    (each agent its own adapter), of one adapter folder, and of the bare base: the adapters are used.
    30 warm-start steps for the solver already teach the answer format (measured: 11 of the team's
    turns and 16 of the solver adapter's write <answer>, the base none); 60 cost twice the CPU."""
    from drmas_bench.api import evaluate
    from drmas_bench.plan import EvalConfig
    from drmas_trainer.trainer import train

    cfg = load_config("tiny_lora", {"steps": 2, "save_every": 0, "rollout.prompts_per_step": 2, "rollout.n": 2,
                                    "sft.steps": 30, "sft.agent_steps": {"checker": 10}, "val.before_train": False,
                                    "val.every": 0})
    train(cfg, tmp_path / "run", progress=False)
    step = tmp_path / "run" / "ckpt" / "step_2"
    assert (step / "models" / "shared" / "solver" / "adapter_config.json").is_file()
    assert not (step / "models" / "shared" / "config.json").exists()  # the base is referenced, not copied
    from safetensors.torch import load_file

    saved = load_file(str(step / "models" / "shared" / "solver" / "adapter_model.safetensors"))
    assert any("lm_head.lora_" in k for k in saved) and all(".lora_" in k for k in saved)  # no copy of the head

    common = dict(suite="toy", limit=4, n=2, max_new_tokens=12, progress=False)
    runs = {}
    for label, model in (("team", step), ("solver", step / "models" / "shared" / "solver"), ("base", "tiny-random")):
        s = evaluate(EvalConfig(model=str(model), out=str(tmp_path / label), **common))
        runs[label] = (s, _texts(tmp_path / label))
    team, base = runs["team"][1], runs["base"][1]
    assert team != base
    said = lambda texts: sum("<answer>" in (t or "") for rec in texts for t in rec)  # noqa: E731
    assert said(team) > said(base)  # the solver adapter taught the answer format the base never writes
    assert said(runs["solver"][1]) > said(base)


# ------------------------------------------------------------------ the memory plan


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj", "lm_head"]])
def test_plan_adapter_size_matches_peft(targets):
    from drmas_bench.models import resolve_model
    from drmas_bench.models.loading import load_causal_lm
    from drmas_trainer.config.train import AgentConfig
    from drmas_trainer.lora import adapter_params, attach
    from drmas_trainer.forecast.memory import lora_params
    from drmas_trainer.forecast.shapes import model_shape

    pm = attach(load_causal_lm(str(resolve_model("tiny-random"))),
                {"a": AgentConfig(lora={"rank": 8, "target_modules": targets})})
    assert lora_params(model_shape("tiny-random"), 8, targets) == sum(p.numel() for p in adapter_params(pm, "a"))


def test_lora_recipe_fits_one_h200_without_offload_and_beats_full_weights(capsys):
    from drmas_bench.cli import main
    from drmas_trainer.forecast.memory import GIB, memory_plan
    from drmas_trainer.forecast.shapes import model_shape

    assert main(["train", "--recipe", "math_qwen3_4b_lora", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "adapter solver: rank 64" in out and "adapter verifier: rank 64" in out
    assert "gradients fp32" not in out.replace("adapter gradients fp32", "")  # no gradients for the base
    cfg = load_config("math_qwen3_4b_lora")
    assert cfg.shared_base and cfg.agent_defaults.get("optimizer_offload", "none") == "none"
    shape = model_shape("Qwen/Qwen3-4B")

    def peak(c):
        groups = plan_worker_groups(c, ("solver", "verifier"))
        return memory_plan(c, groups, {g: shape for g in groups}, use_ray=True).peak.bytes / GIB

    lora = peak(cfg)
    full_1gpu = peak(load_config("math_qwen3_4b_1gpu", {"agent_defaults.optimizer_offload": "none"}))
    assert lora < 70 < 140 < full_1gpu  # 2 full copies + AdamW on one GPU do not fit; 2 adapters on one base do
    assert main(["train", "--recipe", "math_qwen3_4b_lora", "--plan", "--gpu-memory", "79"]) == 0  # even 80 GB


def test_checkpoint_presence_check_knows_adapter_folders(tmp_path):
    from drmas_bench.checkpoints import layout as checkpoints
    from drmas_trainer.checkpoint import group_files_present

    step = tmp_path / "step_3"
    (step / "models" / "shared" / "solver").mkdir(parents=True)
    (step / "optim").mkdir()
    (step / "optim" / "shared.pt").write_bytes(b"x")
    (step / "models" / "shared" / "base.json").write_text("{}")
    assert not group_files_present(step, "shared") and not checkpoints.group_files_present(f"file://{step}", "shared")
    (step / "models" / "shared" / "solver" / "adapter_model.safetensors").write_bytes(b"x")
    assert group_files_present(step, "shared") and checkpoints.group_files_present(f"file://{step}", "shared")


def test_hf_engine_drop_sleep_keeps_updated_adapters(tmp_path):
    from drmas_bench.engines import make_engine
    from drmas_trainer.lora import adapter_tensors

    folder, pm = _adapter_folder(tmp_path)
    eng = make_engine("hf", str(folder), device="cpu", sleep_mode="drop")

    async def main():
        t = {k: v * 3 for k, v in adapter_tensors(pm, "checker").items()}
        await eng.update_adapter("checker", {}, t)
        before = await eng.generate([_req("solver"), _req("checker")])
        await eng.sleep()
        assert not eng.is_awake
        after = await eng.generate([_req("solver"), _req("checker")])  # woken from the saved adapters
        await eng.close()
        return before, after

    before, after = asyncio.run(main())
    for a, b in zip(after, before):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
