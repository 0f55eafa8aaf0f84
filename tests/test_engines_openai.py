"""The ``openai`` engine against a real local HTTP server (FastAPI + uvicorn on 127.0.0.1) that
fails on purpose; plus the pure request/response translation."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter

import pytest

from drmas_bench.engines import EngineError, make_engine
from drmas_bench.engines.openai import OpenAIOptions, build_body, parse_response
from drmas_bench.types import Request, Sampling

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
FReq = fastapi.Request  # module level: FastAPI resolves the (string) annotation from globals


def run(coro):
    return asyncio.run(coro)


def req(text: str, *, n: int = 8, seed: int | None = 1, lp: bool = False) -> Request:
    return Request("a", [{"role": "user", "content": text}], Sampling(temperature=0.6, top_p=0.95, max_new_tokens=n, seed=seed), want_logprobs=lp)


class FakeServer:
    """Chat completions under /<mode>/v1: ok, flaky (503 twice per prompt), down (always 503),
    bad (400), slow (sleeps 2 s), limited (429 + Retry-After once per prompt)."""

    def __init__(self) -> None:
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse

        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.hits: Counter = Counter()
        self.inflight = 0
        self.max_inflight = 0
        app = FastAPI()

        @app.post("/{mode}/v1/chat/completions")
        async def chat(mode: str, request: FReq):
            body = await request.json()
            prompt = body["messages"][-1]["content"]
            self.hits[(mode, prompt)] += 1
            self.bodies.append(body)
            self.headers.append(dict(request.headers))
            n = self.hits[(mode, prompt)]
            if mode == "down" or (mode == "flaky" and n <= 2):
                return JSONResponse({"error": "overloaded"}, status_code=503)
            if mode == "limited" and n == 1:
                return JSONResponse({"error": "slow down"}, status_code=429, headers={"Retry-After": "0"})
            if mode == "bad":
                return JSONResponse({"error": {"message": "model not found"}}, status_code=400)
            if mode == "slow":
                await asyncio.sleep(2.0)
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            await asyncio.sleep(0.05)
            self.inflight -= 1
            k = min(3, body.get("max_tokens", 16))
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": f"echo {prompt}"},
                "finish_reason": "length" if k == body.get("max_tokens") else "stop",
                "token_ids": list(range(10, 10 + k)),
            }
            if body.get("logprobs"):
                choice["logprobs"] = {"content": [{"token": "x", "logprob": -0.5 * (i + 1)} for i in range(k)]}
            return {
                "id": "c1",
                "object": "chat.completion",
                "choices": [choice],
                "prompt_token_ids": [1, 2, 3, 4],
                "usage": {"prompt_tokens": 4, "completion_tokens": k, "total_tokens": 4 + k},
            }

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.02)

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def server():
    s = FakeServer()
    yield s
    s.stop()


def fast(**kw):
    return {"backoff_s": 0.01, "backoff_max_s": 0.05, **kw}


def test_success_fields_and_body(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    eng = make_engine("openai", "served-name", base_url=server.url("ok"), **fast())
    c1, c2 = run(eng.generate([req("one", n=8, lp=True), req("two", n=2, seed=None)]))
    assert c1.text == "echo one" and c2.text == "echo two"
    assert c1.prompt_tokens == 4 and c1.completion_tokens == 3 and c1.finish == "stop"
    assert c2.completion_tokens == 2 and c2.finish == "length"
    assert c1.logprobs == [-0.5, -1.0, -1.5] and c2.logprobs is None
    assert c1.latency_s >= 0.05
    body = next(b for b in server.bodies if b["messages"][0]["content"] == "one")
    assert body["model"] == "served-name" and body["temperature"] == 0.6 and body["top_p"] == 0.95
    assert body["max_tokens"] == 8 and body["seed"] == 1 and body["logprobs"] is True
    assert "seed" not in next(b for b in server.bodies if b["messages"][0]["content"] == "two")
    hdr = next(h for h, b in zip(server.headers, server.bodies) if b["messages"][0]["content"] == "one")
    assert hdr["authorization"] == "Bearer sk-test"
    run(eng.close())


def test_retries_503_then_succeeds(server):
    eng = make_engine("openai", "m", base_url=server.url("flaky"), max_retries=3, **fast())
    outs = run(eng.generate([req(f"flaky {i}") for i in range(4)]))
    assert [c.text for c in outs] == [f"echo flaky {i}" for i in range(4)]
    assert all(server.hits[("flaky", f"flaky {i}")] == 3 for i in range(4))
    assert eng.attempts == 12


def test_429_retry_after(server):
    eng = make_engine("openai", "m", base_url=server.url("limited"), max_retries=1, **fast())
    [c] = run(eng.generate([req("limited")]))
    assert c.text == "echo limited" and server.hits[("limited", "limited")] == 2


def test_always_failing_server_gives_clear_error(server):
    eng = make_engine("openai", "m", base_url=server.url("down"), max_retries=2, **fast())
    t0 = time.perf_counter()
    with pytest.raises(EngineError) as err:
        run(eng.generate([req("down")]))
    msg = str(err.value)
    assert "\n" not in msg
    assert server.url("down") + "/chat/completions" in msg
    assert "3 attempts" in msg and "503" in msg
    assert server.hits[("down", "down")] == 3
    assert time.perf_counter() - t0 < 5


def test_client_error_is_not_retried(server):
    eng = make_engine("openai", "m", base_url=server.url("bad"), max_retries=5, **fast())
    with pytest.raises(EngineError, match="rejected the request.*400.*model not found"):
        run(eng.generate([req("bad")]))
    assert server.hits[("bad", "bad")] == 1


def test_timeouts_and_refused_connections_are_retried(server):
    eng = make_engine("openai", "m", base_url=server.url("slow"), max_retries=1, timeout_s=0.2, **fast())
    with pytest.raises(EngineError, match="failed after 2 attempts: timeout"):
        run(eng.generate([req("slow")]))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    eng = make_engine("openai", "m", base_url=f"http://127.0.0.1:{free}/v1", max_retries=2, **fast())
    with pytest.raises(EngineError, match=rf"127\.0\.0\.1:{free}/v1/chat/completions failed after 3 attempts: ConnectError"):
        run(eng.generate([req("nobody")]))
    assert eng.attempts == 3


def test_bounded_concurrency(server):
    server.max_inflight = 0
    eng = make_engine("openai", "m", base_url=server.url("ok"), max_concurrency=2, **fast())

    async def many():
        return await asyncio.gather(*(eng.generate([req(f"c{i}")]) for i in range(8)))

    outs = run(many())
    assert len(outs) == 8
    assert server.max_inflight == 2


def test_pure_translation():
    o = OpenAIOptions(extra_body={"chat_template_kwargs": {"enable_thinking": False}}, return_token_ids=True, max_tokens_field="max_completion_tokens")
    b = build_body(req("x", n=5, seed=None, lp=False), "m", o)
    assert b == {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "temperature": 0.6,
        "top_p": 0.95,
        "max_completion_tokens": 5,
        "return_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    c = parse_response({"choices": [{"message": {"content": None}, "finish_reason": "length", "token_ids": [5, 6]}], "prompt_token_ids": [1]}, True)
    assert c.text == "" and c.finish == "length" and c.token_ids == [5, 6] and c.prompt_ids == [1]
    assert c.completion_tokens == 2 and c.prompt_tokens == 1 and c.logprobs is None
    with pytest.raises(ValueError, match="no choices"):
        parse_response({"error": "x"}, False)


def test_options_and_lifecycle():
    with pytest.raises(EngineError, match="retries"):
        make_engine("openai", "m", retries=3)
    eng = make_engine("openai", "m", base_url="http://127.0.0.1:9/v1/")
    assert eng.url == "http://127.0.0.1:9/v1/chat/completions"
    assert eng.is_awake and eng.footprint_bytes() == 0
    run(eng.sleep())
    run(eng.wake())
    assert eng.is_awake
