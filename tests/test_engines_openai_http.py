"""The ``openai`` engine's HTTP client (aiohttp) and the shared retry policy with it: replies read
whole, failures without an answer retried, the session closed with its event loop. The server is
the real local one of tests/test_engines_openai.py (FastAPI + uvicorn on 127.0.0.1)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")
from test_engines_openai import FakeServer, req  # noqa: E402  (the repo's OpenAI-compatible test server)

from drmas_bench.engines import make_engine  # noqa: E402
from drmas_bench.engines.openai_http import Reply  # noqa: E402
from drmas_retrieval.retry import RetriesExhausted, RetryPolicy, TransportFailure, asend_with_retries  # noqa: E402


@pytest.fixture(scope="module")
def server():
    s = FakeServer()
    yield s
    s.stop()


def test_reply_parses_json_once_and_decodes_bad_bytes():
    r = Reply(200, {"content-type": "application/json"}, b'{"choices": [1]}')
    assert r.json() is r.json() and r.json() == {"choices": [1]}
    bad = Reply(502, {}, b"<html>\xff gateway</html>")
    assert bad.text == "<html>\ufffd gateway</html>"
    with pytest.raises(ValueError):
        bad.json()


def test_transport_failures_are_retried_then_reported_in_one_line():
    calls = []

    async def flaky():
        calls.append(1)
        if len(calls) <= 2:
            raise TransportFailure("TimeoutError", timeout=True)
        return Reply(200, {}, b"{}")

    policy = RetryPolicy(retries=3, backoff_s=0.001, backoff_max_s=0.002)
    assert asyncio.run(asend_with_retries(flaky, policy)).status_code == 200 and len(calls) == 3

    async def refused():
        raise TransportFailure("ConnectError", "Cannot connect to host 127.0.0.1:9\nsecond line")

    with pytest.raises(RetriesExhausted) as err:
        asyncio.run(asend_with_retries(refused, RetryPolicy(retries=1, backoff_s=0.001)))
    assert err.value.attempts == 2 and err.value.reason == "ConnectError: Cannot connect to host 127.0.0.1:9"


def test_a_first_attempt_made_by_the_caller_counts_as_attempt_one():
    """``first=``: the caller's own first outcome; a failure goes on from the second attempt (the
    same total), a non-retryable answer is returned without calling ``send``."""
    calls, counted = [], []

    async def send():
        calls.append(1)
        return Reply(200, {}, b"{}")

    policy = RetryPolicy(retries=2, backoff_s=0.001, backoff_max_s=0.002)
    out = asyncio.run(asend_with_retries(send, policy, on_attempt=lambda: counted.append(1),
                                         first=TransportFailure("TimeoutError", timeout=True)))
    assert out.status_code == 200 and len(calls) == 1 and len(counted) == 1
    calls.clear()
    assert asyncio.run(asend_with_retries(send, policy, first=Reply(404, {}, b"no"))).status_code == 404 and not calls

    async def down():
        calls.append(1)
        raise TransportFailure("ConnectError", "refused")

    calls.clear()
    with pytest.raises(RetriesExhausted) as err:
        asyncio.run(asend_with_retries(down, policy, first=Reply(503, {}, b"busy")))
    assert err.value.attempts == 3 and len(calls) == 2


def test_session_closes_with_its_event_loop(server):
    """One ``asyncio.run`` per call (as the tests and small scripts do): each loop's session is
    closed when that loop ends, and the next call opens a new one that works."""
    eng = make_engine("openai", "m", base_url=server.url("ok"), backoff_s=0.01)
    [a] = asyncio.run(eng.generate([req("first")]))
    first = eng._client
    assert a.text == "echo first" and first.session.closed
    [b] = asyncio.run(eng.generate([req("second")]))
    assert b.text == "echo second" and eng._client is not first

    async def kept_open():
        await eng.generate([req("third")])
        open_inside = not eng._client.session.closed
        await eng.close()
        return open_inside

    assert asyncio.run(kept_open()) and eng._client is None


def test_the_environment_proxy_is_looked_up_once_per_server(monkeypatch):
    from drmas_bench.engines.openai_http import env_proxy

    for var in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert env_proxy("https://api.example.com/v1") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    assert env_proxy("https://api.example.com/v1") == "http://proxy.internal:3128"
    assert env_proxy("http://127.0.0.1:8000/v1") is None and env_proxy("http://gpu-box:8000/v1") is None
