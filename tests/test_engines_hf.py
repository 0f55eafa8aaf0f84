"""The ``hf`` engine on a tiny random Qwen2 checkpoint (CPU, float32)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from test_engines_fixtures import tiny_model_path

from drmas_bench.engines import EngineError, make_engine
from drmas_bench.engines.decoding import sample
from drmas_bench.types import Request, Sampling

torch = pytest.importorskip("torch")


def run(coro):
    return asyncio.run(coro)


def req(text: str, *, seed: int | None = 0, t: float = 1.0, p: float = 1.0, n: int = 12, lp: bool = False) -> Request:
    return Request(
        agent="a",
        messages=[{"role": "user", "content": text}],
        sampling=Sampling(temperature=t, top_p=p, max_new_tokens=n, seed=seed),
        want_logprobs=lp,
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_model_path(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def engine(tiny):
    eng = make_engine("hf", str(tiny), device="cpu", max_batch=16, max_wait_ms=50)
    yield eng
    run(eng.close())


def test_counts_text_and_length_finish(engine):
    r = req("hello there", t=0.0, n=7)
    [c] = run(engine.generate([r]))
    assert c.prompt_ids == engine.encode_prompt(r.messages)
    assert c.prompt_tokens == len(c.prompt_ids) > 0
    assert c.completion_tokens == len(c.token_ids)
    assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert c.latency_s > 0
    assert c.logprobs is None
    if c.finish == "length":
        assert len(c.token_ids) == 7
    else:
        assert c.finish == "stop" and c.token_ids[-1] in engine.eos_ids and len(c.token_ids) <= 7
    outs = run(engine.generate([req(f"prompt {i}", seed=i, n=5) for i in range(6)]))
    assert all(len(o.token_ids) <= 5 for o in outs)
    assert any(o.finish == "length" and len(o.token_ids) == 5 for o in outs)
    for o in outs:
        assert (o.finish == "stop") == (o.token_ids[-1] in engine.eos_ids)


def test_chat_template_has_generation_prompt(engine):
    ids = engine.encode_prompt([{"role": "user", "content": "hi"}])
    text = engine.tokenizer.decode(ids)
    assert text.rstrip().endswith("assistant")


def test_stops_on_generation_config_eos(tiny, tmp_path):
    # greedy output of the original model; then declare one of its tokens an EOS id in a copy
    base = make_engine("hf", str(tiny), device="cpu")
    [c] = run(base.generate([req("stop here", t=0.0, n=20)]))
    run(base.close())
    ids = c.token_ids
    cut = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    stop_tok = ids[cut]
    model2 = tmp_path / "m"
    shutil.copytree(tiny, model2)
    gc_path = model2 / "generation_config.json"
    gcfg = json.loads(gc_path.read_text()) if gc_path.exists() else {}
    eos = gcfg.get("eos_token_id", [])
    eos = eos if isinstance(eos, list) else [eos]
    gcfg["eos_token_id"] = eos + [stop_tok]
    gc_path.write_text(json.dumps(gcfg))
    eng = make_engine("hf", str(model2), device="cpu")
    assert stop_tok in eng.eos_ids
    [d] = run(eng.generate([req("stop here", t=0.0, n=20, lp=True)]))
    run(eng.close())
    assert d.finish == "stop"
    assert d.token_ids == ids[: cut + 1]
    assert d.completion_tokens == cut + 1 == len(d.logprobs)


def test_seed_reproducible_and_seeds_differ(engine):
    a = run(engine.generate([req("tell me", seed=7, n=16)]))[0]
    b = run(engine.generate([req("tell me", seed=7, n=16)]))[0]
    c = run(engine.generate([req("tell me", seed=8, n=16)]))[0]
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_tiny_top_p_is_greedy(engine):
    greedy = run(engine.generate([req("nucleus", t=0.0, n=10)]))[0]
    for top_p in (1e-6, 0.0):
        narrow = run(engine.generate([req("nucleus", seed=9, t=1.0, p=top_p, n=10)]))[0]
        assert narrow.token_ids == greedy.token_ids


def test_batch_invariance(engine):
    target = [req("the same question", seed=3, t=0.8, p=0.9, n=16, lp=True), req("greedy one", t=0.0, n=16, lp=True)]
    others = [req("x" * k, seed=100 + k, t=1.0, n=4 + k) for k in (1, 9, 30, 55)]
    alone = [run(engine.generate([r]))[0] for r in target]
    mixed = run(engine.generate([others[0], target[0], others[1], others[2], target[1], others[3]]))
    together = [mixed[1], mixed[4]]
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert a.text == b.text
        assert a.finish == b.finish
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_logprobs_match_a_forward_pass(engine):
    for r in (req("score me", seed=11, t=0.7, p=0.8, n=10, lp=True), req("greedy", t=0.0, n=10, lp=True)):
        [c] = run(engine.generate([r]))
        assert c.logprobs is not None and len(c.logprobs) == c.completion_tokens
        full = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            logits = engine._hf_model(input_ids=full).logits[0].float()
        n = len(c.prompt_ids)
        ref_all = torch.log_softmax(logits[n - 1 : -1], dim=-1)
        ref = ref_all.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4), (c.logprobs, ref.tolist())
        if r.sampling.temperature == 0:
            assert c.token_ids == ref_all.argmax(-1).tolist()


def test_micro_batcher_batches_concurrent_calls(tiny):
    eng = make_engine("hf", str(tiny), device="cpu", max_batch=16, max_wait_ms=300)

    async def main():
        return await asyncio.gather(*(eng.generate([req(f"q{i} " * (i % 5 + 1), seed=i, n=6)]) for i in range(16)))

    outs = run(main())
    assert len(outs) == 16 and all(len(o) == 1 and o[0].completion_tokens >= 1 for o in outs)
    assert eng.stats.items == 16
    assert eng.stats.batches <= 2, eng.stats
    assert eng.stats.largest >= 8
    # each prompt is prefilled alone (batch-invariant decoding), the decode steps are shared:
    # a lone call per coroutine would take 16 * 6
    assert eng.forward_calls <= 16 + 2 * 5
    run(eng.close())


def test_sleep_wake_round_trip(tiny):
    eng = make_engine("hf", str(tiny), device="cpu", auto_wake=False)
    rs = [req("before and after", seed=5, n=10), req("greedy", t=0.0, n=10)]
    before = run(eng.generate(rs))
    size = eng.footprint_bytes()
    assert size > 0 and eng.is_awake
    run(eng.sleep())
    assert not eng.is_awake and eng._hf_model is None and eng.footprint_bytes() == size
    with pytest.raises(EngineError, match="asleep"):
        run(eng.generate(rs))
    run(eng.wake())
    assert eng.is_awake
    after = run(eng.generate(rs))
    assert [c.token_ids for c in before] == [c.token_ids for c in after]
    run(eng.close())


def test_updated_weights_survive_sleep(tiny):
    eng = make_engine("hf", str(tiny), device="cpu")  # auto_wake=True
    r = req("weights", t=0.0, n=8)
    [orig] = run(eng.generate([r]))
    name = "model.norm.weight"
    new = torch.linspace(0.5, 2.0, eng._hf_model.state_dict()[name].numel())
    run(eng.update_weights([(name, new)]))
    [changed] = run(eng.generate([r]))
    assert changed.token_ids != orig.token_ids
    run(eng.sleep())
    [again] = run(eng.generate([r]))  # wakes itself
    assert eng.is_awake and again.token_ids == changed.token_ids
    with pytest.raises(EngineError, match="unknown weight"):
        run(eng.update_weights([("no.such.weight", new)]))
    run(eng.close())


def test_update_weights_converts_to_the_engines_dtype_as_torch_rounds(tiny):
    """An fp32 trainer's weights land in a bf16 engine rounded as ``Tensor.to(bfloat16)`` rounds
    them, bit for bit, whatever path the copy takes."""
    eng = make_engine("hf", str(tiny), device="cpu", dtype="bfloat16")
    run(eng.wake())
    name = "model.layers.0.mlp.up_proj.weight"
    shape = eng._hf_model.state_dict()[name].shape
    new = torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=torch.float32)
    run(eng.update_weights([(name, new)]))
    got = eng._hf_model.state_dict()[name]
    assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), new.to(torch.bfloat16).view(torch.int16))
    run(eng.close())


def test_zero_budget(engine):
    [zero] = run(engine.generate([req("hi", n=0)]))
    assert zero.finish == "length" and zero.token_ids == [] and not zero.prompt_truncated


def test_prompt_limit_cuts_the_templated_prompt_on_its_side(engine):
    from drmas_bench.engines.prompt import truncate_ids

    msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "a long prompt " * 20}]
    full = engine.encode_prompt(msgs)
    limit = 25
    assert len(full) > limit
    for side in ("left", "middle", "right"):
        r = Request("a", msgs, Sampling(temperature=0.7, max_new_tokens=6, seed=4), want_logprobs=True,
                    max_prompt_tokens=limit, truncate=side)
        [c] = run(engine.generate([r]))
        assert c.prompt_truncated and c.prompt_tokens == len(c.prompt_ids) == limit
        assert c.prompt_ids == truncate_ids(full, limit, side)
        # the model ran on exactly these ids: its log-probs match a forward pass over cut prompt + response
        with torch.no_grad():
            logits = engine._hf_model(input_ids=torch.tensor([c.prompt_ids + c.token_ids])).logits[0].float()
        ref = torch.log_softmax(logits[limit - 1 : -1], -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)
    [fits] = run(engine.generate([Request("a", msgs, Sampling(max_new_tokens=2), max_prompt_tokens=len(full))]))
    assert not fits.prompt_truncated and fits.prompt_ids == full
    with pytest.raises(EngineError, match="hf engine: truncate side must be"):
        run(engine.generate([Request("a", msgs, max_prompt_tokens=5, truncate="both")]))


def test_top_k_one_is_greedy_and_minus_one_is_off(engine):
    greedy = run(engine.generate([req("top k", t=0.0, n=10)]))[0]
    k1 = run(engine.generate([Request("a", [{"role": "user", "content": "top k"}], Sampling(temperature=1.0, top_p=1.0, top_k=1, max_new_tokens=10, seed=5))]))[0]
    assert k1.token_ids == greedy.token_ids
    # -1 (the default) and a k as large as the vocabulary draw the same tokens from the same seed
    off = [Request("a", [{"role": "user", "content": "top k"}], Sampling(temperature=1.0, top_p=1.0, top_k=k, max_new_tokens=10, seed=5)) for k in (-1, len(engine.tokenizer) + 10)]
    a, b = run(engine.generate(off))
    assert a.token_ids == b.token_ids
    with pytest.raises(EngineError, match="top_k must be -1"):
        run(engine.generate([Request("a", [{"role": "user", "content": "x"}], Sampling(top_k=0))]))


def test_enable_thinking_reaches_the_chat_template(tiny, tmp_path):
    from test_engines_fixtures import EMPTY_THINK, thinking_model_path

    eng = make_engine("hf", str(thinking_model_path(tiny, tmp_path / "thinking")), device="cpu")
    msgs = [{"role": "user", "content": "think?"}]
    off, on = run(eng.generate([Request("a", msgs, Sampling(max_new_tokens=1)),
                                Request("a", msgs, Sampling(max_new_tokens=1, enable_thinking=True))]))
    run(eng.close())
    assert eng.tokenizer.decode(off.prompt_ids).endswith("<|im_start|>assistant\n" + EMPTY_THINK)  # the default: off
    assert eng.tokenizer.decode(on.prompt_ids).endswith("<|im_start|>assistant\n")
    assert len(off.prompt_ids) > len(on.prompt_ids)
    with pytest.raises(EngineError, match="chat_template_kwargs may not set enable_thinking"):
        make_engine("hf", str(tiny), device="cpu", chat_template_kwargs={"enable_thinking": True})


def test_options_are_checked(tiny):
    with pytest.raises(EngineError, match="max_batchh"):
        make_engine("hf", str(tiny), max_batchh=3)
    with pytest.raises(EngineError, match="unknown engine 'nope'"):
        make_engine("nope", str(tiny))
    with pytest.raises(EngineError, match="dtype"):
        make_engine("hf", str(tiny), dtype="float8")


def test_sampler_frequencies_match_probabilities():

    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    n = 4000

    def freqs(t: float, p: float) -> torch.Tensor:
        picks = [
            int(sample(logits, torch.tensor([t]), torch.tensor([p]), [g])[0]) for _ in range(n)
        ]
        return torch.bincount(torch.tensor(picks), minlength=5).float() / n

    probs = torch.softmax(logits[0] / 0.7, -1)
    assert torch.allclose(freqs(0.7, 1.0), probs, atol=0.03)
    # top_p = 0.8 at temperature 1 keeps tokens 0,1,2 (mass before token 2 is < 0.8, before token 4 is >= 0.8)
    p1 = torch.softmax(logits[0], -1)
    order = torch.argsort(p1, descending=True)
    before = torch.cumsum(p1[order], 0) - p1[order]
    keep = torch.zeros(5, dtype=torch.bool)
    keep[order[before < 0.8]] = True
    want = torch.where(keep, p1, torch.zeros(5))
    want = want / want.sum()
    got = freqs(1.0, 0.8)
    assert torch.all(got[~keep] == 0)
    assert torch.allclose(got, want, atol=0.03)
    assert int(sample(logits, torch.tensor([0.0]), torch.tensor([1.0]), [g])[0]) == 0


def test_sampler_top_k_and_top_p_keep_the_tokens_in_both_sets():

    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])  # order by probability: 0, 1, 2, 4, 3
    n = 4000
    gens = [torch.Generator().manual_seed(i) for i in range(n)]

    def freqs(k: int, p: float) -> torch.Tensor:  # n rows at once, one generator each
        picks = sample(logits.repeat(n, 1), torch.ones(n), torch.full((n,), p), gens, torch.full((n,), k))
        return torch.bincount(picks, minlength=5).float() / n

    p1 = torch.softmax(logits[0], -1)
    top2 = torch.tensor([p1[0], p1[1], 0, 0, 0]) / (p1[0] + p1[1])
    assert torch.allclose(freqs(2, 1.0), top2, atol=0.03)
    assert torch.allclose(freqs(-1, 1.0), p1, atol=0.03)
    # top_p = 0.8 alone keeps 0, 1, 2; with top_k = 2 only 0, 1 survive; with top_k = 4 the nucleus rules
    assert torch.allclose(freqs(2, 0.8), top2, atol=0.03)
    three = torch.tensor([p1[0], p1[1], p1[2], 0, 0]) / p1[:3].sum()
    assert torch.allclose(freqs(4, 0.8), three, atol=0.03)
    # rows with different k in one call
    two = sample(logits.repeat(2, 1), torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0]),
                           [torch.Generator().manual_seed(s) for s in (0, 1)], torch.tensor([1, -1]))
    assert int(two[0]) == 0


@pytest.mark.gpu
def test_prompt_protocol_and_top_k_on_cuda(tiny, tmp_path):
    """The same prompt ids and sampling rules on CUDA: a cut prompt, top_k = 1 equal to greedy,
    several k in one batch, the thinking switch."""
    from test_engines_fixtures import EMPTY_THINK, thinking_model_path

    from drmas_bench.engines.prompt import truncate_ids

    eng = make_engine("hf", str(thinking_model_path(tiny, tmp_path / "thinking")), device="cuda", dtype="float32")
    msgs = [{"role": "user", "content": "a long prompt " * 20}]
    full = eng.encode_prompt(msgs)
    rs = [Request("a", msgs, Sampling(temperature=0, max_new_tokens=8), max_prompt_tokens=25, truncate="middle"),
          Request("a", msgs, Sampling(temperature=1.0, top_p=1.0, top_k=1, max_new_tokens=8, seed=3), max_prompt_tokens=25, truncate="middle"),
          Request("a", msgs, Sampling(temperature=1.0, top_p=0.9, top_k=5, max_new_tokens=8, seed=4), max_prompt_tokens=25, truncate="left"),
          Request("a", msgs, Sampling(temperature=0.6, max_new_tokens=8, seed=5, enable_thinking=True))]
    greedy, k1, k5, thinking = run(eng.generate(rs))
    run(eng.close())
    assert greedy.prompt_ids == k1.prompt_ids == truncate_ids(full, 25, "middle") and greedy.prompt_truncated
    assert k1.token_ids == greedy.token_ids
    assert k5.prompt_ids == truncate_ids(full, 25, "left") and len(k5.token_ids) >= 1
    assert eng.tokenizer.decode(full).endswith(EMPTY_THINK) and not eng.tokenizer.decode(thinking.prompt_ids).endswith(EMPTY_THINK)


def test_concurrent_loads_leave_the_default_dtype_alone():
    """transformers' from_pretrained sets and restores torch's process-wide default dtype; loads in
    several threads (the pool wakes worker groups concurrently) used to leave bf16 as the default,
    so fp32 matmuls later failed with "mat1 and mat2 must have the same dtype"."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from drmas_bench.engines.base import resolve_model_path
    from drmas_bench.models.loading import load_causal_lm

    path = str(resolve_model_path("tiny-random"))
    with ThreadPoolExecutor(4) as ex:
        models = list(ex.map(lambda i: load_causal_lm(path, dtype=torch.bfloat16 if i % 2 else torch.float32), range(12)))
    assert torch.get_default_dtype() == torch.float32
    assert {m.dtype for m in models} == {torch.bfloat16, torch.float32}
