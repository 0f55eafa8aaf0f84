"""The GPU smoke steps as ``gpu``-marked tests: what ``scripts/gpu_smoke.sh`` runs, one test per step
with its own timeout, on a machine with a CUDA GPU, torch and transformers, no project install and
no network (sglang, ray, fastapi, datasets need not be there).

    pytest -m gpu tests/test_gpu_smoke.py                       # on a CUDA machine, all steps
    GPU_SMOKE_CPU=1 pytest -m gpu tests/test_gpu_smoke.py       # the dry run: same code, CPU, tiny sizes

Every test prints one ``RESULT {json}`` line with its figures (the shell script shows it next to
PASS/FAIL) and fails when its checks do not hold. The models are built once per session into
``$GPU_SMOKE_DIR`` (the shell script's scratch folder; a pytest temporary folder otherwise), so a
step run on its own builds them first. Without a GPU and without ``GPU_SMOKE_CPU=1`` they skip
(conftest.py), like every ``gpu`` test; the dry run itself is tests/test_gpu_smoke_dryrun.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_smoke]

#: ``GPU_SMOKE_CPU=1``: the dry run on CPU at tiny sizes (set by ``gpu_smoke.sh --cpu``)
CPU = os.environ.get("GPU_SMOKE_CPU") == "1"
#: The Qwen2-0.5B shape (public config): what the GPU steps train and serve, randomly initialised.
WIDE = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "intermediate_size": 4864, "vocab_size": 151_936, "tie_word_embeddings": True}
#: The dry-run shape: same vocabulary (the memory paths see V = 151,936), tiny trunk.
WIDE_CPU = {**WIDE, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}


def report(ok: bool, **figures: Any) -> None:
    """Print the step's ``RESULT`` line (on a line of its own, whatever pytest printed before)."""
    print("\nRESULT " + json.dumps({"ok": ok, **figures}, default=str), flush=True)


def device() -> str:
    import torch

    if CPU:
        return "cpu"
    assert torch.cuda.is_available(), "CUDA is not available (GPU_SMOKE_CPU=1 for the dry run)"
    return "cuda"


def peak_gib(dev: str) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if dev == "cuda" else None


def reset_peak(dev: str) -> None:
    import torch

    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def build_models(root: Path) -> dict[str, Any]:
    """tiny-random (its builder) and the wide model (random init from WIDE, tiny's tokenizer)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from drmas_bench.models import build_tiny_random

    t0 = time.perf_counter()
    build_tiny_random(root / "tiny", log=lambda m: print(m, file=sys.stderr))
    tok = AutoTokenizer.from_pretrained(root / "tiny")
    shape = WIDE_CPU if CPU else WIDE
    cfg = Qwen2Config(**shape, max_position_embeddings=8192, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                      bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      use_sliding_window=False)
    torch.manual_seed(0)
    dev = "cpu" if CPU or not torch.cuda.is_available() else "cuda"
    with torch.device(dev):  # random init on the GPU: seconds instead of a minute on CPU
        model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                                               bos_token_id=tok.pad_token_id)
    model.to(torch.bfloat16).save_pretrained(root / "wide")
    tok.save_pretrained(root / "wide")
    n = sum(p.numel() for p in model.parameters())
    return {"params": n, "shape": shape, "seconds": round(time.perf_counter() - t0, 1)}


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding ``tiny`` and ``wide``: ``$GPU_SMOKE_DIR`` or a session temporary folder."""
    env = os.environ.get("GPU_SMOKE_DIR")
    return Path(env) if env else tmp_path_factory.mktemp("gpu-smoke-models")


@pytest.fixture(scope="session")
def models(models_dir: Path) -> Path:
    """The built models (built here when the ``build`` step has not run in this folder)."""
    if not (models_dir / "wide" / "config.json").is_file() or not (models_dir / "tiny" / "config.json").is_file():
        build_models(models_dir)
    return models_dir


def requests(n: int, max_new: int, seed0: int = 0) -> list[Any]:
    from drmas_bench.types import Request, Sampling

    return [Request("solver", [{"role": "user", "content": f"Question {i}: what is {i} + {i * 7 % 10}?"}],
                    Sampling(temperature=1.0, top_p=1.0, max_new_tokens=max_new, seed=seed0 + i), want_logprobs=True)
            for i in range(n)]


# ----------------------------------------------------------------------------------------- steps


def test_build(models_dir: Path) -> None:
    """The two models build on this machine and load back."""
    got = build_models(models_dir)
    ok = (models_dir / "wide" / "config.json").is_file() and (models_dir / "tiny" / "config.json").is_file()
    report(ok, **got)
    assert ok


def test_engine(models: Path) -> None:
    """hf engine on the wide model, bf16 on CUDA: a batch of sampled requests; tokens/s, peak memory."""
    from drmas_bench.engines import make_engine

    dev = device()
    n, max_new = (4, 8) if CPU else (32, 256)

    async def go() -> dict[str, Any]:
        eng = make_engine("hf", str(models / "wide"), device=dev, dtype="bfloat16", max_batch=n)
        try:
            await eng.generate(requests(2, 4, seed0=1000))  # warm-up (kernels, allocator)
            reset_peak(dev)
            t0 = time.perf_counter()
            comps = await eng.generate(requests(n, max_new))
            secs = time.perf_counter() - t0
        finally:
            await eng.close()
        toks = sum(len(c.token_ids) for c in comps)
        finite = all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
                     and all(math.isfinite(x) for x in c.logprobs) for c in comps)
        return {"ok": toks > 0 and finite, "requests": n, "new_tokens": toks, "seconds": round(secs, 2),
                "tokens_per_s": round(toks / secs, 1), "peak_gib": peak_gib(dev), "logprobs_finite": finite}

    r = asyncio.run(go())
    report(**r)
    assert r["ok"], r


def test_pool(models: Path) -> None:
    """Two models (wide + tiny) in a LocalPool with a budget of one model: alternating requests make
    it sleep one and wake the other; the same seeded requests must give the same tokens each time."""
    import torch

    from drmas_bench.pool import EngineSpec, make_pool

    dev = device()
    opts = {"device": dev, "dtype": "bfloat16", "max_batch": 8}
    specs = {"wide": EngineSpec("hf", str(models / "wide"), dict(opts)), "tiny": EngineSpec("hf", str(models / "tiny"), dict(opts))}
    max_new = 8 if CPU else 32

    async def go() -> dict[str, Any]:
        seen: dict[str, list[list[int]]] = {"wide": [], "tiny": []}
        alloc_after: list[float] = []
        t0 = time.perf_counter()
        async with make_pool("local", specs, budget_models=1) as pool:
            for _ in range(2):
                for wg in ("wide", "tiny"):
                    comps = await pool.generate(wg, requests(4, max_new))
                    seen[wg].append([t for c in comps for t in c.token_ids])
                    if dev == "cuda":
                        alloc_after.append(round(torch.cuda.memory_allocated() / 2**30, 3))
            stats = pool.stats()
        same = all(v[0] == v[1] for v in seen.values())
        ok = same and stats["wakes"] >= 2 and stats["sleeps"] >= 2 and not stats["errors"]
        return {"ok": ok, "wakes": stats["wakes"], "sleeps": stats["sleeps"], "wake_s": stats["wake_s"],
                "sleep_s": stats["sleep_s"], "same_tokens_after_wake": same, "peak_memory_gib":
                round((stats["peak_memory_bytes"] or 0) / 2**30, 3), "peak_memory_kind": stats["peak_memory_kind"],
                "cuda_allocated_after_each_round_gib": alloc_after, "seconds": round(time.perf_counter() - t0, 1),
                "errors": stats["errors"]}

    r = asyncio.run(go())
    report(**r)
    assert r["ok"], r


@pytest.mark.parametrize("offload", [False, True], ids=["adamw", "offload"])
def test_train(models: Path, offload: bool) -> None:
    """Three worker-group steps on the wide model (bf16 autocast, gradient checkpointing, chunked
    log-probs, hf engine sleeping during the update): update on synthetic rows, then weight sync.
    Figures: update tokens/s, step time, sync time, peak memory of the update (engine asleep; next
    to ``plan_update_gib``, the memory plan's estimate) and of the whole step; checks: finite loss
    and gradient norm, weights moved, the engine generates after every sync. ``offload``: the same
    with ``optimizer_offload: cpu``."""
    import torch

    from drmas_trainer.config.train import AgentConfig
    from drmas_trainer.logprobs import pack_rows, token_logprobs
    from drmas_trainer.worker import LossSettings, Row, WorkerGroup

    dev = device()
    rows_n, plen, rlen = (4, 16, 16) if CPU else (16, 512, 1536)
    settings = AgentConfig(lr=1e-5, micro_batch_size=4, dtype="bfloat16", gradient_checkpointing=True, engine="hf",
                           engine_options={"max_batch": 8}, sleep_engine=True,
                           optimizer_offload="cpu" if offload else "none")
    wg = WorkerGroup("solver", ["solver"], settings, str(models / "wide"), device=dev, seed=0)
    g = torch.Generator().manual_seed(0)
    vocab = len(wg.tokenizer)
    rows = []
    for i in range(rows_n):
        p = torch.randint(3, vocab, (plen,), generator=g).tolist()
        r = torch.randint(3, vocab, (rlen,), generator=g).tolist()
        rows.append(Row("solver", p, r, [0.0] * rlen, 1.0 if i % 2 == 0 else -1.0))
    with torch.no_grad(), wg._autocast():  # old log-probs = the current policy's (ratio 1 at the first step)
        for i in range(0, rows_n, 4):
            b = pack_rows([r.prompt_ids for r in rows[i:i + 4]], [r.response_ids for r in rows[i:i + 4]], wg.pad_id, wg.device)
            lp, _ = token_logprobs(wg.policy, b)
            for k, r in enumerate(rows[i:i + 4]):
                r.old_logprobs = lp[k, :rlen].float().tolist()
    before = wg.params[1].detach().float().clone()

    async def go() -> dict[str, Any]:
        await wg.start_engine()
        steps = []
        ok = True
        for k in range(3):
            reset_peak(dev)
            t0 = time.perf_counter()
            out = await wg.update(rows, loss=LossSettings(), seed=k)
            t1 = time.perf_counter()
            update_peak = peak_gib(dev)  # engine asleep: comparable with plan_update_gib
            sync_s = await wg.sync_weights()
            comps = await wg.generate(requests(2, 8, seed0=10 * k))
            step_s = time.perf_counter() - t0
            good = (out["optimizer_steps"] == 1 and math.isfinite(out["grad_norm"]) and math.isfinite(out["loss"])
                    and all(c.token_ids for c in comps))
            ok = ok and good
            steps.append({"step": k + 1, "ok": good, "loss": round(out["loss"], 5), "grad_norm": round(out["grad_norm"], 4),
                          "update_s": round(t1 - t0, 2), "sync_s": round(sync_s, 2), "step_s": round(step_s, 2),
                          "update_tokens_per_s": round(rows_n * (plen + rlen) / (t1 - t0), 1), "update_peak_gib": update_peak,
                          "step_peak_gib": peak_gib(dev)})
        await wg.close()
        moved = not torch.equal(before, wg.params[1].detach().float())
        params = sum(p.numel() for p in wg.params)
        return {"ok": ok and moved, "weights_moved": moved, "params": params, "rows": rows_n,
                "tokens_per_row": plen + rlen, "offload": settings.optimizer_offload,
                "plan_update_gib": plan_update_gib(settings, models / "wide", plen, rlen), "steps": steps}

    r = asyncio.run(go())
    report(**r)
    assert r["ok"], r


def test_train_tis(models: Path) -> None:
    """The recompute + TIS path on the wide model: the hf engine samples in bf16 with log-probs, the
    group recomputes the old log-probs with its own policy (bf16 autocast over fp32 weights: other
    kernels, a real mismatch), ``rollout.correction: tis_token`` weighs the rows, then one update.
    Figures: the ``rollout_corr/*`` metrics (engine vs trainer), the token check's count, the seconds
    of rollout, recompute and update, the peak memory of the recompute and of the update."""

    from drmas_trainer.config.train import AgentConfig, RolloutConfig
    from drmas_trainer.scoring import correct_rows
    from drmas_trainer.worker import LossSettings, Row, WorkerGroup

    dev = device()
    n, max_new = (4, 8) if CPU else (16, 256)
    settings = AgentConfig(lr=1e-5, micro_batch_size=4, dtype="bfloat16", gradient_checkpointing=True, engine="hf",
                           engine_options={"max_batch": 16, "dtype": "bfloat16"}, sleep_engine=True)
    rc = RolloutConfig(old_logprobs="recompute", correction="tis_token", correction_threshold=2.0)
    wg = WorkerGroup("solver", ["solver"], settings, str(models / "wide"), device=dev, seed=0)

    async def go() -> dict[str, Any]:
        await wg.start_engine()
        t0 = time.perf_counter()
        comps = await wg.generate(requests(n, max_new))
        gen_s = time.perf_counter() - t0
        rows = [Row("solver", c.prompt_ids, c.token_ids, c.logprobs or [], 1.0 if i % 2 == 0 else -1.0, text=c.text)
                for i, c in enumerate(comps)]
        reset_peak(dev)
        scored = await wg.score_rows(rows, recompute=True)
        recompute_peak = peak_gib(dev)
        rec = correct_rows({"solver": rows}, {"solver": scored}, rc)
        reset_peak(dev)
        t1 = time.perf_counter()
        out = await wg.update(rows, loss=LossSettings(), seed=0)
        update_s = time.perf_counter() - t1
        update_peak = peak_gib(dev)
        await wg.sync_weights()
        await wg.close()
        corr = {k.removeprefix("rollout_corr/"): round(v, 6) for k, v in rec.items() if k.startswith("rollout_corr/")}
        mismatch = sum(m is not None for m in scored["mismatch"])
        ok = (out["optimizer_steps"] == 1 and math.isfinite(out["loss"]) and mismatch == 0
              and all(r.is_weights is not None and max(r.is_weights) <= 2.0 for r in rows if r.response_ids)
              and corr.get("k3_kl", -1) >= 0 and abs(out["ppo_kl"]) < 1e-3)
        return {"ok": ok, "rows": n, "response_tokens": sum(len(r.response_ids) for r in rows), "token_mismatch": mismatch,
                "rollout_corr": corr, "ppo_kl_after_recompute": out["ppo_kl"], "gen_s": round(gen_s, 2),
                "old_log_prob_s": round(scored["old_logprob_s"], 3), "update_s": round(update_s, 2),
                "recompute_peak_gib": recompute_peak, "update_peak_gib": update_peak}

    r = asyncio.run(go())
    report(**r)
    assert r["ok"], r


def plan_update_gib(settings: Any, model_dir: Path, plen: int, rlen: int) -> float:
    """What ``drmas_trainer.forecast.memory`` predicts for this group's update (engine asleep, no CUDA
    context): to compare with the measured ``peak_gib`` of the steps."""
    from drmas_trainer.config.groups import WorkerGroupPlan
    from drmas_trainer.forecast.memory import GIB, group_memory
    from drmas_trainer.forecast.shapes import shape_from_config

    cfg = json.loads((model_dir / "config.json").read_text())
    m = group_memory("solver", WorkerGroupPlan("solver", ["solver"], settings), shape_from_config(cfg, "wide"),
                     seq=plen + rlen, response=rlen, gpu_bytes=140 * GIB)
    return round((sum(m.resident.values()) + sum(m.update.values())) / GIB, 3)


def test_train_lora(models: Path) -> None:
    """Per-agent LoRA: two agents on ONE frozen copy of the wide model (shared_base), each
    with its own rank-16 adapter and AdamW; three worker-group steps on rows of both agents (bf16,
    gradient checkpointing, hf engine serving both adapters and sleeping during the update), then
    an adapter-only sync. Figures as ``test_train`` (update peak next to the plan's estimate),
    plus the trainable share; checks: finite loss, only adapter weights moved (the base is
    bitwise unchanged), both adapters moved, each agent generates with its adapter after the sync."""
    import torch

    from drmas_trainer.config.groups import plan_worker_groups
    from drmas_trainer.config.train import load_config
    from drmas_trainer.worker import LossSettings, Row, WorkerGroup

    dev = device()
    rows_n, plen, rlen = (4, 16, 16) if CPU else (16, 512, 1536)
    cfg = load_config({"workflow": "toy", "model": str(models / "wide"), "shared_base": True,
                       "rollout": {"prompts_per_step": 2, "n": 2},
                       "agent_defaults": {"lr": 1e-4, "micro_batch_size": 4, "dtype": "bfloat16",
                                          "gradient_checkpointing": True, "engine": "hf",
                                          "engine_options": {"max_batch": 8}, "sleep_engine": True,
                                          "lora": {"rank": 16, "alpha": 32, "target_modules": "all-linear"}}})
    plan = plan_worker_groups(cfg, ("solver", "checker"))["shared"]
    wg = WorkerGroup("shared", plan.agents, plan.settings, str(models / "wide"), device=dev, seed=0,
                     adapters=plan.adapters, adapter_of=plan.adapter_of)
    g = torch.Generator().manual_seed(0)
    vocab = len(wg.tokenizer)
    rows = []
    for i in range(rows_n):
        p = torch.randint(3, vocab, (plen,), generator=g).tolist()
        r = torch.randint(3, vocab, (rlen,), generator=g).tolist()
        rows.append(Row(("solver", "checker")[i % 2], p, r, [0.0] * rlen, 1.0 if (i // 2) % 2 == 0 else -1.0))
    from drmas_trainer.logprobs import pack_rows, token_logprobs

    with torch.no_grad(), wg._autocast():  # old log-probs: each agent's current policy (ratio 1)
        for r in rows:
            wg._use_agent(r.agent)
            b = pack_rows([r.prompt_ids], [r.response_ids], wg.pad_id, wg.device)
            r.old_logprobs = token_logprobs(wg.policy, b)[0][0, :rlen].float().tolist()
    base0 = {n: p.detach().clone() for n, p in wg.policy.named_parameters() if "lora_" not in n}
    ad0 = {n: p.detach().float().clone() for n, p in wg.policy.named_parameters() if "lora_" in n}

    async def go() -> dict[str, Any]:
        await wg.start_engine()
        steps = []
        ok = True
        for k in range(3):
            reset_peak(dev)
            t0 = time.perf_counter()
            out = await wg.update(rows, loss=LossSettings(), seed=k)
            t1 = time.perf_counter()
            update_peak = peak_gib(dev)
            sync_s = await wg.sync_weights()
            solver_req, checker_req = requests(2, 8, seed0=10 * k)
            comps = await wg.generate([solver_req, dataclasses.replace(checker_req, agent="checker")])
            step_s = time.perf_counter() - t0
            good = (out["optimizer_steps"] == 1 and math.isfinite(out["grad_norm"]) and math.isfinite(out["loss"])
                    and all(c.token_ids for c in comps))
            ok = ok and good
            steps.append({"step": k + 1, "ok": good, "loss": round(out["loss"], 5), "grad_norm": round(out["grad_norm"], 4),
                          "agent_grad_norm": {a: round(v, 4) for a, v in out["agent_grad_norm"].items()},
                          "update_s": round(t1 - t0, 2), "sync_s": round(sync_s, 3), "step_s": round(step_s, 2),
                          "update_tokens_per_s": round(rows_n * (plen + rlen) / (t1 - t0), 1),
                          "update_peak_gib": update_peak, "step_peak_gib": peak_gib(dev)})
        await wg.close()
        base_same = all(torch.equal(base0[n], p) for n, p in wg.policy.named_parameters() if "lora_" not in n)
        moved = {a: any(not torch.equal(ad0[n], p.detach().float()) for n, p in wg.policy.named_parameters()
                        if f".{a}." in n and "lora_" in n) for a in ("solver", "checker")}
        trainable = sum(p.numel() for p in wg.params)
        total = sum(p.numel() for p in wg.policy.parameters())
        return {"ok": ok and base_same and all(moved.values()), "base_unchanged": base_same, "adapters_moved": moved,
                "trainable": trainable, "trainable_share": round(trainable / total, 4), "rows": rows_n,
                "tokens_per_row": plen + rlen, "plan_update_gib": plan_lora_update_gib(plan, models / "wide", plen, rlen),
                "steps": steps}

    r = asyncio.run(go())
    report(**r)
    assert r["ok"], r


def plan_lora_update_gib(plan: Any, model_dir: Path, plen: int, rlen: int) -> float:
    """The memory plan's estimate of the LoRA group's update (engine asleep), as plan_update_gib."""
    from drmas_trainer.forecast.memory import GIB, group_memory
    from drmas_trainer.forecast.shapes import shape_from_config

    cfg = json.loads((model_dir / "config.json").read_text())
    m = group_memory("shared", plan, shape_from_config(cfg, "wide"), seq=plen + rlen, response=rlen, gpu_bytes=140 * GIB)
    return round((sum(m.resident.values()) + sum(m.update.values())) / GIB, 3)


#: The paper row whose worker group the ``train-row`` step runs: the smallest of the reference's compute
#: table (search, one Qwen2.5-3B shared by the three agents, 4 x H100). The first of these recipes that
#: exists is read at run time (``GPU_SMOKE_ROW_RECIPE`` names another).
ROW_RECIPES = ("search_qwen2.5_3b_shared", "search_qwen2.5_3b", "gspo_search_qwen2.5_3b")
#: The dry run's trunk for the row's architecture (its vocabulary stays the real one).
ROW_CPU = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "head_dim": 0}


def row_recipe() -> str:
    from drmas_trainer.config.train import RECIPES_DIR

    name = os.environ.get("GPU_SMOKE_ROW_RECIPE")
    if name:
        return name
    found = [r for r in ROW_RECIPES if (RECIPES_DIR / f"{r}.yaml").is_file()]
    assert found, f"none of the row recipes {ROW_RECIPES} is in {RECIPES_DIR}"
    return found[0]


def config_from_shape(shape: Any, tok: Any) -> Any:
    """A transformers config of ``shape``'s architecture (drmas_trainer.forecast.shapes.ModelShape: the public
    config's numbers, no download): Qwen3 (q/k norms), Qwen2 (q/k/v biases) or Llama."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                  num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                  intermediate_size=shape.intermediate, tie_word_embeddings=shape.tied, max_position_embeddings=32768,
                  rms_norm_eps=1e-6, bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id)
    if shape.qk_norm:
        return Qwen3Config(**common, head_dim=shape.hd)
    if shape.qkv_bias:
        return Qwen2Config(**common, use_sliding_window=False, rope_theta=1_000_000.0)
    return LlamaConfig(**common, head_dim=shape.hd, rope_parameters={"rope_type": "default", "rope_theta": 500_000.0})


def build_row_model(root: Path, shape: Any) -> Path:
    """The row's architecture with random weights (bf16, initialised on the GPU), tiny's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    dest = root / "row"
    tok = AutoTokenizer.from_pretrained(root / "tiny")
    torch.manual_seed(0)
    with torch.device("cpu" if CPU else "cuda"):  # random init on the GPU: seconds, not minutes
        model = AutoModelForCausalLM.from_config(config_from_shape(shape, tok)).to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                                               bos_token_id=tok.pad_token_id)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    del model
    return dest


def row_plan(name: str, plan: Any, settings: Any, shape: Any, seq: int, response: int) -> dict[str, float | None]:
    """The memory plan's figure (GiB) of each phase of the row's group on one GPU, without the CUDA
    context (``drmas_trainer.forecast.memory.group_memory``): rollout = resident + engine, update = resident +
    its update extras (+ the engine unless it sleeps), sync = rollout + one bucket; the old log-prob
    pass has no phase of its own in the plan."""
    from drmas_trainer.forecast.memory import GIB, group_memory

    m = group_memory(name, dataclasses.replace(plan, settings=settings), shape, seq=seq, response=response,
                     gpu_bytes=140 * GIB)
    res, upd = sum(m.resident.values()), sum(m.update.values())
    awake = 0 if m.engine_sleeps else m.engine
    return {"rollout": round((res + m.engine) / GIB, 3), "old_log_prob": None,
            "update": round((res + upd + awake) / GIB, 3),
            "sync": round((res + m.engine + (settings.sync_bucket_mb << 20)) / GIB, 3)}


def test_train_row(models: Path) -> None:
    """The smallest paper row's worker group for two steps, with random weights of the real
    architecture (ROW_RECIPES; the recipe is read now: its group's dtype, micro-batch, gradient
    checkpointing, optimizer and offload, log-prob chunk, loss, mini-batches, sleep_engine), on one GPU
    (unsharded) with the hf engine in place of sglang. Each step: rollouts (engine awake), old
    log-probs, the update (engine asleep when the recipe sleeps it), the weight sync; the peak memory
    of each phase (``torch.cuda.max_memory_allocated``) is printed beside the plan's figure for the
    same group and sequence (``drmas_trainer.forecast.memory.group_memory``: resident + engine, resident +
    update extras, resident + engine + one sync bucket; no CUDA context). Step 1 allocates AdamW's
    state lazily; step 2 is the steady state. Checks: finite loss and gradient norm, weights moved,
    the engine generates after each sync."""
    import torch

    from drmas_bench.workflows import get_workflow
    from drmas_trainer.config.groups import plan_worker_groups
    from drmas_trainer.config.train import load_config
    from drmas_trainer.forecast.memory import GIB, group_memory
    from drmas_trainer.forecast.shapes import ModelShape, model_shape
    from drmas_trainer.worker import LossSettings, Row, WorkerGroup

    dev = device()
    recipe = row_recipe()
    cfg = load_config(recipe)
    name, plan = next(iter(plan_worker_groups(cfg, get_workflow(cfg.workflow).agents).items()))
    real = model_shape(str(plan.settings.model))  # the built-in table: the public config's numbers, offline
    shape = ModelShape(**{**real.__dict__, **ROW_CPU}) if CPU else real
    n, words, max_new = (4, 40, 8) if CPU else (16, 1200, min(cfg.rollout.max_new_tokens, 256))
    folder = build_row_model(models, shape)
    settings = plan.settings.model_copy(update={
        "engine": "hf", "engine_options": {"max_batch": n, "dtype": plan.settings.dtype}, "model": str(folder)})
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / GIB if dev == "cuda" else 140.0
    seq_guess = words * 2 + max_new  # ~2 tokens a word of the filler below (tiny's tokenizer), + the response
    note = ""
    if max(v or 0 for v in row_plan(name, plan, settings, shape, seq_guess, max_new).values()) > gpu_gib - 2:
        # the row runs sharded over 4 GPUs; unsharded on one it may not fit: AdamW to host memory, as the plan says
        settings = settings.model_copy(update={"optimizer_offload": "cpu"})
        note = f"optimizer_offload: cpu (the plan of the unsharded group does not fit {gpu_gib:.0f} GiB otherwise)"
    wg = WorkerGroup(name, plan.agents, settings, str(folder), device=dev, seed=0)
    a = cfg.algo
    loss = LossSettings(mode=a.loss, clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip, agg=a.agg,
                        entropy_coef=a.entropy_coef)
    filler = " ".join(f"passage {i} says the answer is in doc {i % 7}." for i in range(words // 8))

    def prompts(step: int) -> list[Any]:  # a search-sized prompt (retrieved passages), one call per agent in turn
        from drmas_bench.types import Request, Sampling

        return [Request(plan.agents[i % len(plan.agents)],
                        [{"role": "user", "content": f"Question {step}.{i}: {filler} Who wrote it?"}],
                        Sampling(temperature=1.0, top_p=1.0, max_new_tokens=max_new, seed=100 * step + i),
                        want_logprobs=True) for i in range(n)]

    def phase(peaks: dict[str, Any], key: str, t0: float) -> None:
        peaks[key] = {"peak_gib": peak_gib(dev), "s": round(time.perf_counter() - t0, 2)}

    async def go() -> dict[str, Any]:
        await wg.start_engine()
        before = wg.params[1].detach().float().clone()
        steps, ok, seq = [], True, 0
        for k in range(2):
            peaks: dict[str, Any] = {}
            reset_peak(dev)
            t0 = time.perf_counter()
            comps = await wg.generate(prompts(k))
            phase(peaks, "rollout", t0)
            rows = [Row(r.agent, c.prompt_ids, c.token_ids, c.logprobs or [], 1.0 if i % 2 == 0 else -1.0, text=c.text)
                    for i, (r, c) in enumerate(zip(prompts(k), comps))]
            seq = max(seq, max(len(r.prompt_ids) + len(r.response_ids) for r in rows))
            reset_peak(dev)
            t0 = time.perf_counter()
            scored = await wg.score_rows(rows, recompute=True)
            for r, lp in zip(rows, scored["logprobs"]):
                r.old_logprobs = lp
            phase(peaks, "old_log_prob", t0)
            reset_peak(dev)
            t0 = time.perf_counter()
            out = await wg.update(rows, loss=loss, mini_batches=min(a.mini_batches, n), seed=k)
            phase(peaks, "update", t0)
            reset_peak(dev)
            t0 = time.perf_counter()
            await wg.sync_weights()
            phase(peaks, "sync", t0)
            again = await wg.generate(prompts(k)[:2])
            good = (out["optimizer_steps"] >= 1 and math.isfinite(out["grad_norm"]) and math.isfinite(out["loss"])
                    and all(c.token_ids for c in again) and not any(scored["mismatch"]))
            ok = ok and good
            steps.append({"step": k + 1, "ok": good, "loss": round(out["loss"], 5),
                          "grad_norm": round(out["grad_norm"], 4), "phases": peaks})
        moved = not torch.equal(before, wg.params[1].detach().float())
        await wg.close()
        plan_gib = row_plan(name, plan, settings, shape, seq, max_new)
        m = group_memory(name, dataclasses.replace(plan, settings=settings), shape, seq=seq, response=max_new,
                         gpu_bytes=140 * GIB)
        for st in steps:  # measured beside planned, per phase
            for key, v in st["phases"].items():
                v["plan_gib"] = plan_gib[key]
        return {"ok": ok and moved, "recipe": recipe, "note": note, "gpu_gib": round(gpu_gib, 1), "model": f"{plan.settings.model} (random weights)", "group": name,
                "agents": plan.agents, "params": sum(p.numel() for p in wg.params), "shape": shape.__dict__,
                "rows": n, "seq": seq, "dtype": settings.dtype, "micro_batch_size": settings.micro_batch_size,
                "optimizer_offload": settings.optimizer_offload, "sleep_engine": settings.sleep_engine,
                "plan_items_gib": {k: round(v / GIB, 3) for k, v in {**m.resident, **m.update}.items()},
                "plan_engine_gib": round(m.engine / GIB, 3), "weights_moved": moved, "steps": steps}

    r = asyncio.run(go())
    report(**r)
    for st in r["steps"]:  # one readable line per phase: measured next to the plan
        print("  step {}: ".format(st["step"]) + ", ".join(
            f"{k} {v['peak_gib']} GiB (plan {v['plan_gib']})" for k, v in st["phases"].items()))
    assert r["ok"], r


def test_faiss() -> None:
    """faiss on the GPU: a flat inner-product index over random vectors, searched on GPU and CPU,
    placed by the dense retriever's own code (skips without faiss, or with a faiss-cpu build)."""
    try:
        import faiss
        import numpy as np
    except ImportError:
        pytest.skip("faiss is not importable")
    ngpu = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if ngpu < 1 and not CPU:
        pytest.skip(f"faiss {faiss.__version__} sees no GPU (faiss-cpu build)")
    n, d, q = (2000, 64, 16) if CPU else (200_000, 768, 256)
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((n, d), dtype=np.float32)
    xq = rng.standard_normal((q, d), dtype=np.float32)
    cpu = faiss.IndexFlatIP(d)
    cpu.add(xb)
    _, ref = cpu.search(xq, 3)
    if ngpu < 1:
        report(True, gpus=0, note="cpu dry run: CPU index only")
        return
    # the dense retriever's own path: gpu_placement decides (all visible GPUs, sharded), _to_gpus clones
    from drmas_retrieval.dense import FaissParams, _to_gpus, gpu_placement

    placement = gpu_placement("flat", ngpu, None)
    gpu = _to_gpus(faiss, cpu, placement, False, FaissParams())
    t0 = time.perf_counter()
    _, got = gpu.search(xq, 3)
    secs = time.perf_counter() - t0
    agree = float((got == ref).mean())
    report(agree >= 0.99, gpus=ngpu, placement=f"{placement[0]}:{placement[1]}", vectors=n, dim=d, queries=q,
           top3_agreement=agree, search_s=round(secs, 4))
    assert agree >= 0.99, agree
