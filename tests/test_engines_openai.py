"""The ``openai`` engine against a real local HTTP server (FastAPI + uvicorn on 127.0.0.1) that
fails on purpose; plus the pure request/response translation."""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter

import pytest
from threaded_server import ThreadedServer

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


def fake_tokens(messages: list[dict]) -> list[int]:
    """The fake server's "chat template": 3 ids around each message plus one id per word, so a test
    knows the templated prompt's ids without a tokenizer (ids 1000.. count the words)."""
    ids, w = [], 1000
    for m in messages:
        ids += [1, 2 if m.get("role") == "system" else 3]
        for _ in str(m.get("content", "")).split():
            ids.append(w)
            w += 1
        ids.append(4)
    return ids + [5]  # the generation prompt


class FakeServer:
    """Chat completions under /<mode>/v1: ok, flaky (503 twice per prompt), down (always 503),
    bad (400), slow (sleeps 2 s), limited (429 + Retry-After once per prompt); the bad servers of
    tests/test_bad_servers.py: nousage (no usage), negusage, huge (a 5 MB reply counted as
    1,250,000 tokens), html / nochoices (a 200 HTML page / empty choices twice per prompt, then ok),
    alwayshtml / alwaysnochoices, late (negative usage after its first 4 calls). ``/<mode>/tokenize``: vLLM's chat form for modes starting with
    "tok" (see fake_tokens), SGLang's text-only form (422 without ``prompt``) for "sgl", 200 answers that are no tokenizer's
    for "emptytok" (llama.cpp's ``{"tokens": []}``) and "counttok", else 404."""

    def __init__(self) -> None:
        from fastapi import FastAPI
        from fastapi.responses import HTMLResponse, JSONResponse

        self.bodies: list[dict] = []
        self.tokenize_bodies: list[tuple[str, dict]] = []
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
            if mode in ("alwayshtml", "html") and (mode == "alwayshtml" or n <= 2):
                return HTMLResponse("<html><body>502 Bad Gateway</body></html>")
            if mode in ("alwaysnochoices", "nochoices") and (mode == "alwaysnochoices" or n <= 2):
                return {"id": "c0", "object": "chat.completion", "choices": []}
            if mode == "huge":
                return {"choices": [{"index": 0, "message": {"content": "x" * 5_000_000}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 4, "completion_tokens": 1_250_000, "total_tokens": 1_250_004}}
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
            out = {
                "id": "c1",
                "object": "chat.completion",
                "choices": [choice],
                "prompt_token_ids": [1, 2, 3, 4],
                "usage": {"prompt_tokens": 4, "completion_tokens": k, "total_tokens": 4 + k},
            }
            if mode == "nousage":
                del out["usage"], out["prompt_token_ids"], choice["token_ids"]
            self.hits[(mode, "*")] += 1
            if mode == "negusage" or (mode == "late" and self.hits[(mode, "*")] > 4):
                out["usage"] = {"prompt_tokens": 4, "completion_tokens": -3, "total_tokens": 1}
            return out

        @app.post("/{mode}/tokenize")
        async def tokenize(mode: str, request: FReq):
            body = await request.json()
            self.tokenize_bodies.append((mode, body))
            if mode.startswith("tok") and "messages" in body:
                toks = fake_tokens(body["messages"])
                return {"count": len(toks), "max_model_len": 32768, "tokens": toks}
            if mode == "emptytok":  # llama.cpp's /tokenize: text in "content"; a chat body gets an empty list
                return {"tokens": []}
            if mode == "counttok":  # a 200 that is no tokenizer's answer
                return {"count": 7}
            if mode == "sgl" and "prompt" not in body:
                return JSONResponse({"detail": [{"loc": ["body", "prompt"], "msg": "Field required"}]}, status_code=422)
            return JSONResponse({"detail": "Not Found"}, status_code=404)

        @app.post("/{mode}/v1/completions")
        async def completions(mode: str, request: FReq):
            body = await request.json()
            self.bodies.append(body)
            self.hits[(mode, str(body["prompt"]))] += 1
            k = min(3, body.get("max_tokens", 16))
            choice = {"index": 0, "text": f"echo {len(body['prompt'])} ids",
                      "finish_reason": "length" if k == body.get("max_tokens") else "stop"}
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"tokens": ["x"] * k, "token_logprobs": [-0.25 * (i + 1) for i in range(k)]}
            out = {"id": "c2", "object": "text_completion", "choices": [choice],
                   "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": k, "total_tokens": len(body["prompt"]) + k}}
            if mode.endswith("nousage"):
                del out["usage"]
            return out

        self._http = ThreadedServer(app)
        self.port = self._http.port

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    def stop(self) -> None:
        self._http.stop()


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
    assert body["top_k"] == -1 and body["chat_template_kwargs"] == {"enable_thinking": False}  # REFERENCE.md §2b
    assert eng.mode == "chat" and eng.url.endswith("/chat/completions")  # no local tokenizer for "served-name"
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
    o = OpenAIOptions(extra_body={"min_p": 0.05}, return_token_ids=True, max_tokens_field="max_completion_tokens",
                      chat_template_kwargs={"custom": 1})
    b = build_body(req("x", n=5, seed=None, lp=False), "m", o)
    assert b == {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": -1,
        "max_completion_tokens": 5,
        "return_token_ids": True,
        "chat_template_kwargs": {"custom": 1, "enable_thinking": False},
        "min_p": 0.05,
    }
    think = Request("a", [], Sampling(enable_thinking=True, top_k=20, seed=3), want_logprobs=True)
    b = build_body(think, "m", OpenAIOptions())
    assert b["chat_template_kwargs"] == {"enable_thinking": True} and b["top_k"] == 20 and b["logprobs"] is True
    b = build_body(think, "m", OpenAIOptions(), prompt_ids=[7, 8, 9])
    assert b["prompt"] == [7, 8, 9] and "messages" not in b and "chat_template_kwargs" not in b
    assert b["max_tokens"] == 512 and b["logprobs"] == 0 and b["top_k"] == 20 and b["seed"] == 3
    plain = build_body(req("x"), "m", OpenAIOptions(server_extras=False))
    assert "top_k" not in plain and "chat_template_kwargs" not in plain
    c = parse_response({"choices": [{"text": "hi", "finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0, -2.0]},
                                     "token_ids": [4, 5], "prompt_token_ids": [1, 2]}]}, True)
    assert (c.text, c.logprobs, c.token_ids, c.prompt_ids, c.finish) == ("hi", [-1.0, -2.0], [4, 5], [1, 2], "stop")
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


@pytest.fixture(scope="module")
def thinking_tok(tmp_path_factory):
    from test_engines_fixtures import thinking_model_path, tiny_model_path

    tmp = tmp_path_factory.mktemp("tok")
    return thinking_model_path(tiny_model_path(tmp), tmp / "thinking")


def test_token_mode_sends_the_cut_templated_prompt(server, thinking_tok):
    from test_engines_fixtures import EMPTY_THINK
    from transformers import AutoTokenizer

    from drmas_bench.engines.prompt import truncate_ids

    tok = AutoTokenizer.from_pretrained(thinking_tok)
    eng = make_engine("openai", "served", base_url=server.url("ok"), tokenizer=str(thinking_tok), **fast())
    assert eng.mode == "tokens" and eng.url == server.url("ok") + "/completions"
    msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "words " * 40}]
    full = tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=False),
               add_special_tokens=False)["input_ids"]
    assert tok.decode(full).endswith(EMPTY_THINK)
    rs = [Request("a", msgs, Sampling(max_new_tokens=8, seed=2), want_logprobs=True, max_prompt_tokens=30, truncate=side)
          for side in ("left", "middle", "right")]
    rs.append(Request("a", msgs, Sampling(max_new_tokens=2, enable_thinking=True)))
    n0 = len(server.bodies)
    outs = run(eng.generate(rs))
    bodies = server.bodies[n0:]
    for r, c in zip(rs[:3], outs):
        body = next(b for b in bodies if b["prompt"] == c.prompt_ids)
        assert c.prompt_truncated and len(body["prompt"]) == 30 == c.prompt_tokens
        assert body["prompt"] == truncate_ids(full, 30, r.truncate)
        assert body["top_k"] == -1 and body["model"] == "served" and body["logprobs"] == 0
        assert "messages" not in body and "chat_template_kwargs" not in body  # templated here, not on the server
        assert c.text == "echo 30 ids" and c.logprobs == [-0.25, -0.5, -0.75]
    thinking = outs[3]
    assert not thinking.prompt_truncated and tok.decode(thinking.prompt_ids).endswith("<|im_start|>assistant\n")
    run(eng.close())


def test_a_prompt_limit_without_a_tokenizer_goes_out_uncut_and_counted(server):
    """No tokenizer here and no /tokenize there (a paid API): the chat is sent unchanged and the reply
    says its limit was not enforced (the detailed cases: tests/test_bad_servers.py)."""
    eng = make_engine("openai", "gpt-4o-mini", base_url=server.url("ok"), **fast())
    limited = Request("a", [{"role": "user", "content": "q"}], max_prompt_tokens=4096, truncate="left")
    fine, out = run(eng.generate([req("fine"), limited]))
    assert out.prompt_limit_unenforced and not fine.prompt_limit_unenforced
    assert eng.server_tokenize is False
    with pytest.raises(EngineError, match="no local tokenizer at '/no/such/tokenizer'"):
        make_engine("openai", "m", tokenizer="/no/such/tokenizer")


def test_option_checks():
    with pytest.raises(EngineError, match="extra_body may not set chat_template_kwargs, top_k"):
        make_engine("openai", "m", extra_body={"top_k": 5, "chat_template_kwargs": {"enable_thinking": True}})
    with pytest.raises(EngineError, match="may not set enable_thinking"):
        make_engine("openai", "m", chat_template_kwargs={"enable_thinking": True})
    eng = make_engine("openai", "m", server_extras=False)
    with pytest.raises(EngineError, match="server_extras=False.*top_k=5"):
        run(eng.generate([Request("a", [{"role": "user", "content": "x"}], Sampling(top_k=5))]))
