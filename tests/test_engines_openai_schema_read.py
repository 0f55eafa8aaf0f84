"""The ``openai`` engine reads a server's ``/openapi.json`` once however many calls start together,
and a caller cancelled while that read is under way does not cancel it. Against a real local HTTP
server (FastAPI + uvicorn on 127.0.0.1) whose schema answers slowly, so the calls pile up on it."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from threaded_server import ThreadedServer

from drmas_bench.engines import make_engine
from drmas_bench.types import Request, Sampling

fastapi = pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
SCHEMA_DELAY_S = 0.3


def req(text: str) -> Request:
    return Request("a", [{"role": "user", "content": text}], Sampling(temperature=0.6, top_p=0.95, max_new_tokens=8))


class SlowSchemaServer:
    """Chat completions under /v1 (a fixed reply with usage); ``/openapi.json`` answers a minimal
    schema after ``SCHEMA_DELAY_S``. ``hits`` counts both."""

    def __init__(self) -> None:
        from fastapi import FastAPI

        self.hits: Counter = Counter()
        app = FastAPI(openapi_url=None)

        @app.get("/openapi.json")
        async def schema():
            self.hits["schema"] += 1
            await asyncio.sleep(SCHEMA_DELAY_S)
            return {"openapi": "3.1.0", "paths": {}}

        @app.post("/v1/chat/completions")
        async def chat():
            self.hits["chat"] += 1
            return {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1}}

        self._http = ThreadedServer(app)
        self.url = f"http://127.0.0.1:{self._http.port}/v1"

    def stop(self) -> None:
        self._http.stop()


@pytest.fixture(scope="module")
def server():
    s = SlowSchemaServer()
    yield s
    s.stop()


def test_a_burst_of_first_calls_reads_the_schema_once(server):
    server.hits.clear()
    eng = make_engine("openai", "m", base_url=server.url, max_concurrency=16, tokenizer="none")

    async def burst():
        outs = await asyncio.gather(*(eng.generate([req(f"q{i}")]) for i in range(40)))
        await eng.close()
        return outs

    outs = asyncio.run(burst())
    assert [o[0].text for o in outs] == ["ok"] * 40
    assert server.hits == Counter({"schema": 1, "chat": 40})


def test_a_caller_cancelled_during_the_schema_read_does_not_restart_it(server):
    server.hits.clear()
    eng = make_engine("openai", "m", base_url=server.url, max_concurrency=4, tokenizer="none")

    async def cancel_then_call():
        first = asyncio.ensure_future(eng.generate([req("first")]))
        await asyncio.sleep(SCHEMA_DELAY_S / 3)  # the first call is waiting on the schema read
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        out = await eng.generate([req("second")])
        await eng.close()
        return out

    out = asyncio.run(cancel_then_call())
    assert out[0].text == "ok"
    assert server.hits == Counter({"schema": 1, "chat": 1})
