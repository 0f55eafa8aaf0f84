"""The ``sglang`` engine: pure translations; lifecycle, weight-update sessions, footprint, child-process
hosting and the trainer's path against the FAKE sglang API double (``tests/fake_sglang``, CPU); the
real engine in a ``gpu`` test."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from pathlib import Path

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
    from drmas_bench.engines.prompt import truncate_ids
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


# ---------------------------------------------------------------------- against the FAKE sglang

FAKE_ROOT = Path(__file__).resolve().parent / "fake_sglang"


def _drop_sglang_modules() -> None:
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]


@pytest.fixture
def fake_sglang(monkeypatch):
    """The FAKE sglang package importable as ``sglang`` here and in spawned children (sys.path)."""
    _drop_sglang_modules()
    monkeypatch.syspath_prepend(str(FAKE_ROOT))
    import sglang

    assert sglang.__version__.endswith("+fake")
    sglang.CALLS.clear()
    yield sglang
    _drop_sglang_modules()


def _reqs(n=3, tokens=5):
    return [Request("a", [{"role": "user", "content": f"q{i}"}], Sampling(max_new_tokens=tokens, seed=i), want_logprobs=True)
            for i in range(n)]


def _weights(path, zero=None):
    from safetensors.torch import load_file

    w = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        w.update(load_file(str(f)))
    if zero:
        import torch

        w[zero] = torch.zeros_like(w[zero])
    return w


def test_footprint_is_known_before_start(tmp_path):
    from drmas_bench.engines.footprint import config_param_count, param_count, read_config, safetensors_param_count
    from transformers import AutoModelForCausalLM

    path = tiny_model_path(tmp_path)
    numel = sum(t.numel() for t in AutoModelForCausalLM.from_pretrained(path).state_dict().values())
    assert safetensors_param_count(path) == config_param_count(read_config(path)) == param_count(path) == numel
    eng = make_engine("sglang", str(path), dtype="bfloat16", mem_fraction_static=0.5, tp_size=2)
    assert eng.estimated_footprint(gpu_total_bytes=0) == numel * 2  # weights only without a GPU
    assert eng.estimated_footprint(gpu_total_bytes=80 << 30) == int(0.5 * (80 << 30) * 2)  # KV pool, 2 GPUs
    assert eng.footprint_bytes() > 0 and not eng.is_awake  # before start: the pool can budget it
    auto = make_engine("sglang", str(path))  # dtype auto: float32 checkpoint -> float16, like SGLang
    assert auto.estimated_footprint(gpu_total_bytes=0) == numel * 2
    f32 = make_engine("sglang", str(path), dtype="float32")
    assert f32.estimated_footprint(gpu_total_bytes=0) == numel * 4
    with pytest.raises(EngineError, match="unknown dtype 'fp7'"):
        make_engine("sglang", str(path), dtype="fp7")


def test_options_fit_each_engine_kind(tmp_path):
    from drmas_bench.engines.hosting import fit_options

    generic = {"max_batch": 64, "device": "cpu", "dtype": "bfloat16"}
    assert fit_options("hf", generic) == generic
    assert fit_options("sglang", generic) == {"dtype": "bfloat16"}
    assert fit_options("openai", generic) == {}
    assert fit_options("sglang", generic, {"dtype": "float16", "mem-fraction-static": 0.3}) == {
        "dtype": "float16", "mem-fraction-static": 0.3}
    mixed = fit_options("sglang", generic, {"max_batch": 8})  # written by the user: still an error
    with pytest.raises(EngineError, match="unknown option 'max_batch' for engine 'sglang'"):
        make_engine("sglang", str(tiny_model_path(tmp_path)), **mixed)


def test_fake_is_strict_and_process_wide(fake_sglang, tmp_path):
    path = str(tiny_model_path(tmp_path))
    with pytest.raises(TypeError, match="max_batch"):
        fake_sglang.Engine(model_path=path, max_batch=4)
    a = fake_sglang.Engine(model_path=path)
    b = fake_sglang.Engine(model_path=path)  # the last one created wins: `a` is broken now
    with pytest.raises(RuntimeError, match="one engine's configuration per process"):
        asyncio.run(a.async_generate(input_ids=[[1, 2]], sampling_params=[{"max_new_tokens": 2}]))
    with pytest.raises(TypeError, match="max_tokens"):
        asyncio.run(b.async_generate(input_ids=[[1, 2]], sampling_params=[{"max_tokens": 2}]))
    b.shutdown()  # kills every engine of the process
    with pytest.raises(RuntimeError, match="dead"):
        asyncio.run(b.async_generate(input_ids=[[1, 2]], sampling_params=[{"max_new_tokens": 2}]))


def test_update_weights_runs_in_one_session(fake_sglang, tmp_path):
    path = tiny_model_path(tmp_path)

    async def main():
        eng = make_engine("sglang", str(path), dtype="float32")
        before = [c.token_ids for c in await eng.generate(_reqs())]
        await eng.sleep()
        assert not eng.is_awake
        await eng.wake()
        assert [c.token_ids for c in await eng.generate(_reqs())] == before
        fake_sglang.CALLS.clear()
        pulled = []

        def stream():  # a generator: consumed lazily, bucket by bucket
            for name, t in _weights(path, zero="model.norm.weight").items():
                pulled.append(name)
                yield name, t

        await eng.update_weights(stream(), bucket_bytes=1 << 20)
        ops = [op for op, _ in fake_sglang.CALLS]
        updates = [d for op, d in fake_sglang.CALLS if op == "update_weights_from_tensor"]
        assert ops[0] == "begin_weight_update" and ops[-1] == "end_weight_update"
        assert ops.count("begin_weight_update") == 1 and len(updates) > 1  # several buckets, ONE session
        assert [u["flush_cache"] for u in updates] == [False] * (len(updates) - 1) + [True]
        assert sum(len(u["names"]) for u in updates) == len(pulled)
        changed = [c.token_ids for c in await eng.generate(_reqs())]
        assert changed != before
        await eng.update_weights(_weights(path).items())  # back to the checkpoint: same outputs again
        assert [c.token_ids for c in await eng.generate(_reqs())] == before
        await eng.close()

    asyncio.run(main())


def test_refused_update_is_an_error_and_the_session_ends(fake_sglang, tmp_path):
    import torch

    path = tiny_model_path(tmp_path)

    async def main():
        eng = make_engine("sglang", str(path))
        await eng.start()
        fake_sglang.CALLS.clear()
        with pytest.raises(EngineError, match="update_weights_from_tensor failed: .*no parameter named 'nope'"):
            await eng.update_weights([("nope", torch.zeros(2))])
        assert [op for op, _ in fake_sglang.CALLS][-1] == "end_weight_update"
        await eng.update_weights(_weights(path).items())  # the session was closed: a new one opens
        # without a session (what the engine did before): SGLang 0.5.21+ refuses, and we say so
        tm, io = eng._tm_and_io()
        obj = io.UpdateWeightsFromTensorReqInput(serialized_named_tensors=eng._serialize([("lm_head.weight", _weights(path)["lm_head.weight"])]))
        ok, msg = await tm.update_weights_from_tensor(obj, None)
        assert not ok and "must run between begin_weight_update() and end_weight_update()" in msg
        await eng.close()

    asyncio.run(main())


def test_older_sglang_without_session_or_private_serializer(fake_sglang, monkeypatch, tmp_path):
    path = tiny_model_path(tmp_path)
    monkeypatch.delattr(fake_sglang.TokenizerManager, "begin_weight_update")  # < 0.5.21
    monkeypatch.delattr(fake_sglang.Engine, "_serialize_tensors_per_rank")  # renamed/removed private API

    async def main():
        eng = make_engine("sglang", str(path), tp_size=2)
        before = [c.token_ids for c in await eng.generate(_reqs())]
        await eng.update_weights(_weights(path, zero="model.norm.weight").items())
        assert "begin_weight_update" not in [op for op, _ in fake_sglang.CALLS]
        assert [c.token_ids for c in await eng.generate(_reqs())] != before  # 2 payloads (TP 2) accepted
        await eng.close()

    asyncio.run(main())


@pytest.mark.slow
def test_two_sglang_groups_share_a_local_pool(fake_sglang, tmp_path):
    """Each sglang worker group in its own child process: both serve under budget 1 (sleeps and
    wakes happen), the footprint is known at load, and closing one engine leaves the other serving."""
    from drmas_bench.pool import EngineSpec, LocalPool
    from drmas_bench.engines.hosting import ChildEngine

    path = str(tiny_model_path(tmp_path))
    specs = {wg: EngineSpec("sglang", path, {"dtype": "float32"}) for wg in ("a", "b")}

    async def main():
        async with LocalPool(specs, budget_models=1) as pool:
            a, b = pool.engine("a"), pool.engine("b")
            assert isinstance(a, ChildEngine) and isinstance(b, ChildEngine)
            assert len({a.pid, b.pid, os.getpid()}) == 3
            assert pool.stats()["groups"]["a"]["footprint_bytes"] == make_engine("sglang", path, dtype="float32").footprint_bytes() > 0
            for _ in range(2):
                ra, rb = await asyncio.gather(pool.generate("a", _reqs()), pool.generate("b", _reqs()))
                assert [c.token_ids for c in ra] == [c.token_ids for c in rb]  # same model, same seeds
                assert all(len(c.logprobs) == len(c.token_ids) > 0 for c in ra)
            st = pool.stats()
            assert st["sleeps"] >= 2 and st["wakes"] >= 1 and st["peak_resident_bytes"] <= st["budget_bytes"]
            await pool.warm("b")
            await b.update_weights(_weights(path, zero="model.norm.weight").items(), bucket_bytes=1 << 20)
            changed = await pool.generate("b", _reqs())
            assert [c.token_ids for c in changed] != [c.token_ids for c in rb]

            def broken():  # the sender fails half-way: the child ends its session, nothing is left open
                items = list(_weights(path).items())
                yield from items[:5]
                raise ValueError("sender broke")

            with pytest.raises(ValueError, match="sender broke"):
                await b.update_weights(broken(), bucket_bytes=1 << 10)
            import torch

            with pytest.raises(EngineError, match="no parameter named 'nope'"):  # SGLang's refusal, from the child
                await b.update_weights([("nope", torch.zeros(3))])
            await b.update_weights(_weights(path, zero="model.norm.weight").items())  # a new session opens
            await a.close()  # SGLang's shutdown kills its process's children: only a's
            assert a._proc.exitcode is not None
            again = await pool.generate("b", _reqs())
            assert [c.token_ids for c in again] == [c.token_ids for c in changed]

    asyncio.run(main())


@pytest.mark.slow
def test_child_start_failure_is_one_clear_error(fake_sglang, tmp_path):
    from drmas_bench.engines.hosting import ChildEngine

    with pytest.raises(EngineError, match="unknown option 'max_batch' for engine 'sglang'"):
        ChildEngine("sglang", str(tiny_model_path(tmp_path)), {"max_batch": 4})


@pytest.mark.slow
def test_trainer_worker_on_sglang(fake_sglang, tmp_path):
    """The trainer's start / generate / sleep / wake / update / sync path with engine sglang: the
    engine gets the compute dtype and no max_batch, runs in a child, and takes new weights (the
    fake refuses updates outside a begin/end session, so success means the session was used)."""
    from drmas_bench.engines.hosting import ChildEngine
    from drmas_trainer.config.train import AgentConfig
    from drmas_trainer.worker import LossSettings, Row, WorkerGroup

    path = str(tiny_model_path(tmp_path))
    wg = WorkerGroup("solver", ["solver"], AgentConfig(lr=1e-2, micro_batch_size=4, engine="sglang"), path, device="cpu")
    assert wg.engine_options == {"dtype": "float32"}

    async def main():
        await wg.start_engine()
        assert isinstance(wg.engine, ChildEngine) and wg.engine.is_awake
        first = await wg.generate(_reqs(4, tokens=6))
        await wg.engine.sleep()
        assert not wg.engine.is_awake
        again = await wg.generate(_reqs(4, tokens=6))  # auto-wakes
        assert [c.token_ids for c in again] == [c.token_ids for c in first]
        rows = [Row("solver", c.prompt_ids, c.token_ids, c.logprobs, 1.0 if i % 2 else -1.0) for i, c in enumerate(first)]
        await wg.update(rows, epochs=1, mini_batches=1, loss=LossSettings())
        await wg.engine.sleep()
        await wg.sync_weights()  # wakes, then one weight-update session in the child
        after = await wg.generate(_reqs(4, tokens=6))
        assert [c.token_ids for c in after] != [c.token_ids for c in first]
        await wg.close()

    asyncio.run(main())


@pytest.mark.slow
def test_eval_with_two_sglang_groups_under_local_pool(fake_sglang, tmp_path):
    """``drmas-bench eval --engine sglang`` with two worker groups (two model folders) and a pool
    budget of one model: both groups serve from their own child processes, the pool sleeps them in
    turn, and no engine process outlives the run."""
    import json
    import shutil

    from drmas_bench.cli import main

    tiny = tiny_model_path(tmp_path)
    other = tmp_path / "tiny-copy"
    shutil.copytree(tiny, other)
    run = tmp_path / "run"
    assert main(["eval", "--model-for", f"solver={tiny}", "--model-for", f"checker={other}", "--engine", "sglang",
                 "--suite", "toy", "--n", "2", "--limit", "3", "--pool-budget", "1", "--out", str(run),
                 "--no-progress"]) == 0
    pool = json.loads((run / "summary.json").read_text())["pool"]
    assert pool["loads"] == 2 and pool["sleeps"] >= 1 and pool["wakes"] >= 1
    assert all(g["requests"] > 0 and g["footprint_bytes"] > 0 for g in pool["groups"].values())
    assert pool["budget_bytes"] == max(g["footprint_bytes"] for g in pool["groups"].values())
    assert len((run / "samples.jsonl").read_text().splitlines()) == 6
    import multiprocessing

    # no engine host left running (the grading pool keeps its warm workers between calls by design)
    assert not [p for p in multiprocessing.active_children() if p.name != "drmas-grader"]
