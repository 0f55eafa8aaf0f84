"""The trainer's memory paths: chunked log-probs/entropy against the full-logits path (values and
gradients), entropy without gradients, the CPU-offloaded AdamW, the lazy weight sync in buckets, the
optional 8-bit optimiser's error, and the memory plan (parameter counts, `train --plan` exit codes)."""

from __future__ import annotations

import asyncio
import inspect
import json

import pytest
import torch

from drmas_bench.types import UserError
from drmas_trainer.config.train import AgentConfig, load_config
from drmas_trainer.config.groups import plan_worker_groups
from drmas_trainer.forecast.shapes import KNOWN_SHAPES, model_shape, shape_from_config
from drmas_trainer.logprobs import full_head_logprobs, head_logprobs, pack_rows, token_logprobs
from drmas_trainer.optim import CPUOffloadAdamW, make_optimizer
from drmas_trainer.worker import WorkerGroup

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_path() -> str:
    from drmas_bench.models import resolve_model

    return str(resolve_model("tiny-random"))


def _grads(fn, *leaves):
    for t in leaves:
        t.grad = None
    lp, ent = fn()
    g = torch.Generator().manual_seed(1)
    loss = (torch.randn(lp.shape, generator=g).to(lp.device) * lp).sum()
    if ent.requires_grad:
        loss = loss + (torch.randn(ent.shape, generator=g).to(ent.device) * ent).sum()
    loss.backward()
    return lp.detach(), ent.detach(), [t.grad.clone() for t in leaves]


@pytest.mark.parametrize("entropy_grad", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_head_matches_full_logits_values_and_gradients(entropy_grad, bias):
    g = torch.Generator().manual_seed(0)
    n, H, V = 45, 32, 997  # 45 tokens in chunks of 8: the last chunk is partial
    h = torch.randn(n, H, generator=g).requires_grad_()
    w = (torch.randn(V, H, generator=g) * 0.1).requires_grad_()
    b = (torch.randn(V, generator=g) * 0.1).requires_grad_() if bias else None
    t = torch.randint(0, V, (n,), generator=g)
    leaves = [h, w] + ([b] if bias else [])
    ours = _grads(lambda: head_logprobs(h, w, b, t, chunk=8, entropy_grad=entropy_grad), *leaves)
    ref = _grads(lambda: full_head_logprobs(h, w, b, t, entropy_grad=entropy_grad), *leaves)
    assert torch.allclose(ours[0], ref[0], atol=1e-5, rtol=0)
    assert torch.allclose(ours[1], ref[1], atol=1e-4, rtol=1e-5)
    for a, r in zip(ours[2], ref[2]):
        assert torch.allclose(a, r, atol=1e-5, rtol=1e-4)


def test_entropy_is_detached_when_its_coefficient_is_zero():
    h = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(50, 8, requires_grad=True)
    t = torch.randint(0, 50, (6,))
    lp, ent = head_logprobs(h, w, None, t, chunk=4, entropy_grad=False)
    assert lp.requires_grad and not ent.requires_grad
    lp2, ent2 = head_logprobs(h, w, None, t, chunk=4, entropy_grad=True)
    assert ent2.requires_grad and torch.allclose(ent, ent2.detach())


def _random_model(kind: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    common = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=3001, max_position_embeddings=256)
    if kind == "qwen3_tied":
        return Qwen3ForCausalLM(Qwen3Config(**common, head_dim=16, tie_word_embeddings=True))
    return Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False))


def _batch(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (k,), generator=g).tolist() for k in (7, 3, 11)]
    responses = [torch.randint(3, vocab, (k,), generator=g).tolist() for k in (5, 9, 1)]
    return pack_rows(prompts, responses, pad_id=0)


@pytest.mark.parametrize("which", ["tiny-random", "qwen3_tied", "qwen2"])
def test_token_logprobs_chunked_equals_full_path_on_models(which, tiny_path):
    if which == "tiny-random":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    else:
        model = _random_model(which)
    model.train()
    batch = _batch(model.config.vocab_size)
    params = [p for p in model.parameters() if p.requires_grad]

    def run(chunk):
        model.zero_grad(set_to_none=True)
        lp, ent = token_logprobs(model, batch, with_entropy=True, chunk=chunk)
        m = batch["mask"]
        ((lp * m).sum() + 0.1 * (ent * m).sum()).backward()
        return lp.detach() * m, ent.detach() * m, [p.grad.clone() for p in params]

    ours, ref = run(4), run(0)  # chunk 0 = the model's own full logits
    assert torch.allclose(ours[0], ref[0], atol=1e-5, rtol=0)
    assert torch.allclose(ours[1], ref[1], atol=1e-4, rtol=0)
    for a, r in zip(ours[2], ref[2]):
        assert torch.allclose(a, r, atol=1e-5, rtol=1e-4)


def test_cpu_offloaded_adamw_steps_like_adamw():
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    kw = dict(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01)
    plain = make_optimizer(a, lr=kw["lr"], betas=kw["betas"], weight_decay=kw["weight_decay"])
    off = make_optimizer(b, offload="cpu", lr=kw["lr"], betas=kw["betas"], weight_decay=kw["weight_decay"])
    assert isinstance(off, CPUOffloadAdamW) and isinstance(plain, torch.optim.AdamW)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        grads = [torch.randn(p.shape, generator=g) for p in a]
        for opt, ps in ((plain, a), (off, b)):
            opt.zero_grad(set_to_none=True)
            for p, gr in zip(ps, grads):
                p.grad = gr.clone()
            opt.step()
    for p, q in zip(a, b):
        assert torch.allclose(p, q, atol=1e-6)
    sd = off.state_dict()
    assert sd["state"][0]["exp_avg"].device.type == "cpu"
    assert all(q.grad is None for q in off.host)  # the host copies of the gradients are dropped after the step


def test_adamw_8bit_without_bitsandbytes_is_one_clear_line(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_bnb(name, *a, **k):
        if name.split(".")[0] == "bitsandbytes":
            raise ImportError("No module named 'bitsandbytes'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_bnb)
    with pytest.raises(UserError, match="bitsandbytes") as e:
        make_optimizer([torch.nn.Parameter(torch.zeros(2))], kind="adamw_8bit", lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
    assert "\n" not in str(e.value)
    for key, bad in (("optimizer", "sgd"), ("optimizer_offload", "disk")):
        with pytest.raises(UserError, match=key):
            plan_worker_groups(load_config("tiny", {f"agent_defaults.{key}": bad}), ("solver", "checker"))


class FakeBucketEngine:
    """A fake engine (orchestration test only): records what update_weights received."""

    is_awake = True

    def __init__(self) -> None:
        self.calls: list[tuple[bool, int | None, int]] = []

    async def update_weights(self, named_tensors, bucket_bytes: int | None = None) -> None:
        lazy = inspect.isgenerator(named_tensors)
        self.calls.append((lazy, bucket_bytes, sum(1 for _ in named_tensors)))

    async def close(self) -> None:
        pass


def test_weight_sync_is_lazy_and_bucketed(tiny_path):
    wg = WorkerGroup("solver", ["solver"], AgentConfig(sync_bucket_mb=64), tiny_path, device="cpu")
    wg.engine = FakeBucketEngine()
    asyncio.run(wg.sync_weights())
    [(lazy, bucket, n)] = wg.engine.calls
    assert lazy and bucket == 64 << 20 and n == len(wg.policy.state_dict())


# ----------------------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("kind", ["qwen2", "qwen3_tied"])
def test_plan_parameter_count_matches_transformers(kind):
    model = _random_model(kind)
    shape = shape_from_config(model.config.to_dict(), "test")
    assert shape.params == sum(p.numel() for p in model.parameters())


def test_known_shapes_give_the_published_sizes():
    assert abs(KNOWN_SHAPES["qwen/qwen3-4b"].params / 1e9 - 4.02) < 0.01
    assert abs(KNOWN_SHAPES["qwen/qwen2.5-7b-instruct"].params / 1e9 - 7.62) < 0.01
    assert "built-in table" in model_shape("Qwen/Qwen3-4B").source


def _plan(argv, capsys):
    from drmas_bench.cli import main

    rc = main(["train", *argv])
    return rc, capsys.readouterr()


def test_train_plan_fits_one_h200_and_fails_on_80gb(capsys):
    rc, out = _plan(["--recipe", "math_qwen3_4b_1gpu", "--plan"], capsys)
    assert rc == 0, out.err
    assert "worker group solver" in out.out and "worker group verifier" in out.out and "fits" in out.out
    rc, out = _plan(["--recipe", "math_qwen3_4b_1gpu", "--plan", "--gpu-memory", "79"], capsys)
    assert rc == 1
    [line] = [ln for ln in out.err.splitlines() if ln.startswith("plan:")]
    assert "does not fit" in line and "79 GiB" in line
    rc, out = _plan(["--recipe", "math_qwen3_1.7b_80gb", "--plan", "--gpu-memory", "79"], capsys)
    assert rc == 0, out.err


def test_plan_reads_a_local_config(tiny_path):
    s = model_shape(tiny_path)
    assert s.source.endswith("config.json")
    cfg = json.loads((__import__("pathlib").Path(tiny_path) / "config.json").read_text())
    assert s.vocab == cfg["vocab_size"] and s.hidden == cfg["hidden_size"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_head_on_cuda_matches_full_logits_and_saves_memory(dtype):
    dev = "cuda"
    g = torch.Generator().manual_seed(0)
    n, H, V = 4096, 256, 151_936
    h = torch.randn(n, H, generator=g).to(dev).requires_grad_()
    w = (torch.randn(V, H, generator=g) * 0.02).to(dev).requires_grad_()
    t = torch.randint(0, V, (n,), generator=g).to(dev)
    peaks, outs = [], []
    for fn in (lambda: head_logprobs(h, w, None, t, chunk=512, entropy_grad=False, cdtype=dtype),
               lambda: full_head_logprobs(h, w, None, t, entropy_grad=True, cdtype=dtype)):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        outs.append(_grads(fn, h, w))
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(outs[0][0], outs[1][0], atol=tol, rtol=0)
    assert peaks[1] > 4 * peaks[0], peaks
