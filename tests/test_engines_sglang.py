"""The ``sglang`` engine: pure translations here; the real engine in a ``gpu`` test."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from drmas_bench.engines import EngineError, make_engine
from drmas_bench.engines.sglang import completion_from_output, generate_kwargs, sampling_params
from drmas_bench.types import Request, Sampling
from test_engines_fixtures import tiny_model_path


def test_sampling_params():
    assert sampling_params(Sampling(temperature=0.6, top_p=0.95, max_new_tokens=800, seed=7)) == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": -1,  # sent explicitly: the whole vocabulary (REFERENCE.md §2b)
        "max_new_tokens": 800,
        "skip_special_tokens": True,
        "sampling_seed": 7,
    }
    assert "sampling_seed" not in sampling_params(Sampling(seed=None))
    assert sampling_params(Sampling(temperature=0))["temperature"] == 0.0
    assert sampling_params(Sampling(top_k=20))["top_k"] == 20


def test_generate_kwargs():
    r1 = Request("a", [], Sampling(max_new_tokens=3, seed=1), want_logprobs=True)
    r2 = Request("b", [], Sampling(max_new_tokens=4), want_logprobs=False)
    kw = generate_kwargs([[1, 2], [3]], [r1, r2])
    assert kw["input_ids"] == [[1, 2], [3]]
    assert [p["max_new_tokens"] for p in kw["sampling_params"]] == [3, 4]
    assert kw["return_logprob"] == [True, False]


def test_input_ids_are_the_templated_prompt_cut_on_its_side(tmp_path):
    from drmas_bench.engines.base import truncate_ids
    from test_engines_fixtures import EMPTY_THINK, thinking_model_path

    path = thinking_model_path(tiny_model_path(tmp_path), tmp_path / "thinking")
    eng = make_engine("sglang", str(path))  # loads the tokenizer only; SGLang starts on first generate
    msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "long " * 40}]
    full, cut = eng.encode_request(Request("a", msgs))
    assert not cut and eng.tokenizer.decode(full).endswith("assistant\n" + EMPTY_THINK)  # thinking off by default
    on, _ = eng.encode_request(Request("a", msgs, Sampling(enable_thinking=True)))
    assert eng.tokenizer.decode(on).endswith("assistant\n")
    rs = [Request("a", msgs, Sampling(max_new_tokens=4), max_prompt_tokens=16, truncate=side) for side in ("left", "middle", "right")]
    encoded = [eng.encode_request(r) for r in rs]
    kw = generate_kwargs([ids for ids, _ in encoded], rs)
    for r, (ids, cut), sent, params in zip(rs, encoded, kw["input_ids"], kw["sampling_params"]):
        assert cut and len(sent) == 16 and sent == truncate_ids(full, 16, r.truncate)
        assert params["top_k"] == -1
    with pytest.raises(EngineError, match="may not set enable_thinking"):
        make_engine("sglang", str(path), chat_template_kwargs={"enable_thinking": False})


def test_completion_from_output():
    out = {
        "text": "hi there",
        "output_ids": [5, 6, 7],
        "meta_info": {
            "prompt_tokens": 4,
            "completion_tokens": 3,
            "finish_reason": {"type": "stop", "matched": 7},
            "output_token_logprobs": [(-0.1, 5, None), (-0.2, 6, None), (-0.3, 7, None)],
        },
    }
    c = completion_from_output(out, [1, 2, 3, 4], True)
    assert (c.text, c.token_ids, c.prompt_ids) == ("hi there", [5, 6, 7], [1, 2, 3, 4])
    assert (c.prompt_tokens, c.completion_tokens, c.finish) == (4, 3, "stop")
    assert c.logprobs == [-0.1, -0.2, -0.3]
    out["meta_info"]["finish_reason"] = {"type": "length", "length": 3}
    c = completion_from_output(out, [1], False)
    assert c.finish == "length" and c.logprobs is None
    out["meta_info"]["finish_reason"] = {"type": "abort", "message": "out of\nmemory"}
    with pytest.raises(EngineError, match="aborted a request: out of memory"):
        completion_from_output(out, [1], False)


def test_missing_sglang_names_the_extra(tmp_path):
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed")
    path = tiny_model_path(tmp_path)
    eng = make_engine("sglang", str(path), mem_fraction_static=0.3, engine_args={"random_seed": 0})
    args = eng.server_args()
    assert args["model_path"] == str(path) and args["mem_fraction_static"] == 0.3 and args["random_seed"] == 0
    assert args["enable_memory_saver"] is True
    with pytest.raises(EngineError, match=r"pip install 'drmas-bench\[sglang\]'"):
        asyncio.run(eng.generate([Request("a", [{"role": "user", "content": "hi"}])]))


@pytest.mark.gpu
def test_sglang_engine_on_gpu(tmp_path):
    pytest.importorskip("sglang")
    path = tiny_model_path(tmp_path)

    async def main():
        eng = make_engine("sglang", str(path), mem_fraction_static=0.2)
        rs = [Request("a", [{"role": "user", "content": f"q{i}"}], Sampling(temperature=0, max_new_tokens=8, seed=i), want_logprobs=True) for i in range(4)]
        a = await eng.generate(rs)
        assert all(c.completion_tokens == len(c.token_ids) == len(c.logprobs) for c in a)
        assert eng.footprint_bytes() > 0
        await eng.sleep()
        assert not eng.is_awake
        await eng.wake()
        b = await eng.generate(rs)
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        import torch
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(path)
        await eng.update_weights([(n, torch.zeros_like(p)) if n == "model.norm.weight" else (n, p) for n, p in m.named_parameters()])
        c = await eng.generate(rs)
        assert [x.token_ids for x in c] != [x.token_ids for x in a]
        await eng.close()

    asyncio.run(main())


@pytest.mark.gpu
def test_sglang_runs_the_cut_prompt_on_gpu(tmp_path):
    pytest.importorskip("sglang")
    path = tiny_model_path(tmp_path)

    async def main():
        eng = make_engine("sglang", str(path), mem_fraction_static=0.2)
        msgs = [{"role": "user", "content": "long " * 60}]
        rs = [Request("a", msgs, Sampling(temperature=0, max_new_tokens=4), max_prompt_tokens=24, truncate=side)
              for side in ("left", "middle")]
        outs = await eng.generate(rs)
        await eng.close()
        return outs

    for c in asyncio.run(main()):
        assert c.prompt_truncated and len(c.prompt_ids) == 24 == c.prompt_tokens  # SGLang counted 24 input ids
