"""``openai``: any OpenAI-compatible server (vLLM's or SGLang's server, a paid API).

    engine = make_engine("openai", "Qwen/Qwen3-4B", base_url="http://127.0.0.1:8000/v1")

Two ways to send a prompt, chosen once at engine start:

- **token ids** (when a tokenizer for the model is on this machine, see ``tokenizer``): the
  prompt is built here exactly as the ``hf`` and ``sglang`` engines build it (chat template with
  the generation prompt and ``enable_thinking`` from the sampling, tokenized, cut to
  ``Request.max_prompt_tokens`` on ``Request.truncate``'s side; ``prompt.encode_request``) and sent
  as ``POST {base_url}/completions`` with ``prompt: [ids]`` (vLLM and SGLang accept token ids).
  This keeps the reference's semantics: the limit applies to the *templated* prompt tokens, so a
  left cut may drop the system message, as it does in the reference. ``Completion.prompt_ids``
  are the ids sent.
- **chat** (no tokenizer): ``POST {base_url}/chat/completions`` with ``messages`` and
  ``chat_template_kwargs: {"enable_thinking": <Sampling.enable_thinking>}``; the server applies
  its template. A request with a prompt limit (``max_prompt_tokens``) asks the server's own
  tokenizer first: ``POST {server root}/tokenize`` with the messages, ``add_generation_prompt``
  and the template variables (vLLM's chat form of ``/tokenize``; the server root is ``base_url``
  without its ``/v1``); the ids it answers are cut as in token mode and sent to ``/completions``,
  so the limit holds exactly. A server without a chat ``/tokenize`` (a paid API: 404; SGLang, whose
  ``/tokenize`` takes text only: 4xx) is asked once; from then on the chat goes out uncut, one
  warning says so, and each such reply has ``Completion.prompt_limit_unenforced`` set (summed in
  summary.json ``protocol.prompt_limit_unenforced_calls``). ``tokenize_endpoint=False`` skips the
  question (no limit is enforced without a local tokenizer).

Both send ``temperature``, ``top_p``, ``top_k`` (-1 = none: vLLM/SGLang would otherwise fill in
the model's ``generation_config`` default, e.g. Qwen3's top_k=20; how "none" is said is learned per
server, see below), the length field,
``seed`` when set, and log-probs when ``Request.want_logprobs`` (chat: ``logprobs: true``;
completions: ``logprobs: 0``, the sampled token's only). Calls run concurrently, at most
``max_concurrency`` at a time. A 429, a 5xx, a timeout or a connection error is retried with
exponential backoff (honouring ``Retry-After``), the project's one retry policy
(``drmas_retrieval.retry``); so is a 200 answer whose body is unusable (not JSON, an HTML page
from a proxy, no ``choices``). After ``max_retries`` retries, or at once on another 4xx, the call
fails with a one-line ``EngineError`` naming the URL.

The server's dialect (``ServerDialect``), learned once per engine before its first call: the
request schemas of ``{server root}/openapi.json`` when the server publishes one (``server_schema``),
else the first refusal (a 400/422/500 validation error naming ``top_k`` or ``prompt``; the call is
then sent again). It fixes how "no top-k" is sent (-1; 0 where ``top_k`` must be >= 0, llama.cpp's
"off"; nothing where the server has no ``top_k``, and then a requested top-k is an ``EngineError``),
whether token ids can be the prompt (else the prompt templated and cut here goes as text), and which
sampling defaults of the server's own (``NEUTRAL_SAMPLING``: llama.cpp's min_p 0.05, repeat_penalty
1.1) are sent switched off (with ``server_extras=False`` they are named as applying instead). Each
fact is one warning and one line of ``server_notes`` (summary.json ``pool.groups.<wg>.engine_notes``).
A 500 that repeats the same validation error is the server's answer, not retried further.

What a server reports is checked, not trusted (``settle_usage``): a reply without ``usage`` is
counted here with the local tokenizer when there is one (``Completion.usage = "counted"``), else
its counts are marked unknown (``usage = "unknown"``; reports then show unknown dollars, never $0);
negative or non-integer usage is an ``EngineError``; completion tokens far above the request's
``max_new_tokens`` (more than ``usage_slack``) are kept but flagged in ``Completion.notes``; a
reply longer than ``max_response_chars`` is cut to it (finish "length", with a note), so one
runaway answer cannot fill the run directory.

Options (``OpenAIOptions``):

- ``base_url``: the server's ``/v1`` root. Default: ``$OPENAI_BASE_URL`` or
  ``http://127.0.0.1:8000/v1``.
- ``api_key``: sent as ``Authorization: Bearer``. Default: ``$OPENAI_API_KEY``; none for local
  servers.
- ``served_model``: the ``model`` field sent to the server. Default: the engine's model name.
- ``tokenizer``: where the prompt tokenizer comes from. ``None`` (default): the model's own when
  ``model`` is a prepared alias, a local folder or a hub id in the Hugging Face cache (never
  downloaded), else none (chat). A path, alias or cached hub id: that tokenizer (an error at start
  when it cannot be loaded or has no chat template). ``"none"``: always chat.
- ``chat_template_kwargs``: extra chat-template variables (applied here, or sent in chat mode);
  ``enable_thinking`` is not one of them (it comes from ``Sampling.enable_thinking``).
- ``server_extras``: send the vLLM/SGLang fields ``top_k`` and ``chat_template_kwargs`` (True).
  False for APIs that reject unknown fields (api.openai.com); a request with ``top_k`` != -1 or
  ``enable_thinking`` on is then an ``EngineError``.
- ``max_concurrency``: most requests in flight at once.
- ``max_retries``: retries after the first attempt (0 = no retry).
- ``timeout_s``: the longest one attempt may take, in seconds (connect, send, wait for and read
  the whole answer); then it counts as a timeout and is retried.
- ``backoff_s``: wait before the first retry; doubled each retry, at most ``backoff_max_s``.
- ``backoff_max_s``: cap of one wait (also caps ``Retry-After``).
- ``extra_body``: extra JSON fields merged into every request body (e.g. ``min_p``); a field this
  engine sets itself (``top_k``, ``seed``, ``chat_template_kwargs``, ...) is an error naming the
  option that sets it.
- ``return_token_ids``: ask for prompt/response token ids (vLLM >= 0.10.2 ``return_token_ids``);
  without it, ``token_ids`` stay empty (and ``prompt_ids`` too in chat mode) and only the ``usage``
  counts are filled.
- ``max_tokens_field``: name of the length field in chat mode (``"max_tokens"``; some APIs want
  ``"max_completion_tokens"``); the completions endpoint always takes ``max_tokens``.
- ``tokenize_endpoint``: ask the server's ``/tokenize`` for the prompt ids of a limited request
  when no tokenizer is here (True).
- ``max_response_chars``: the longest reply text kept; ``None`` (default): 64 characters per
  requested token plus 4096 (a token is rarely longer than 16 characters).
- ``top_k_off``: how "no top-k" is sent: ``"auto"`` (default: -1, or what the server's schema or a
  refusal teaches), ``-1``, ``0``, or ``"omit"`` (no top_k field).
- ``server_schema``: read the server's ``/openapi.json`` once to learn its dialect (True).

HTTP goes through one ``aiohttp`` session per event loop (``openai_http``: a keep-alive pool of
``max_concurrency`` connections, replies read whole, JSON parsed once); the engine's own work per
call is the body, the checks and the reply's parsing (``openai_wire``), about 0.16 ms of CPU
(``scripts/bench_openai.py``). What a server takes is learned in ``openai_dialect``.

``Completion.prompt_tokens`` / ``completion_tokens`` come from the response's ``usage`` (see above);
``latency_s`` is the request's own time on the wire, retries included (not its wait for a
concurrency slot). ``logprobs`` is ``None`` when the server returns none. Whether a server's
logprobs are raw (temperature 1) or after temperature depends on the server (vLLM: raw by default).
``sleep``/``wake`` are no-ops and ``footprint_bytes`` is 0: the server owns its memory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from functools import partial
from typing import Any, ClassVar

from drmas_bench.engines.base import EngineBase, EngineError, parse_options
from drmas_bench.engines.openai_dialect import (
    adapt_to_refusal,
    dialect_from_schema,
    looks_like_validation_error,
    request_properties,
)
from drmas_bench.engines.openai_setup import check_options as _check_options
from drmas_bench.engines.openai_setup import load_tokenizer as _load_tokenizer
from drmas_bench.engines.openai_wire import (
    TOP_K_OFF,
    BadUsage,
    OpenAIOptions,
    ServerDialect,
    build_body,
    parse_response,
    response_cap,
    response_problem,
    server_root,
    settle_usage,
    tokenize_body,
    tokenize_problem,
    usage_slack,
)
from drmas_bench.engines.prompt import check_request, encode_request, extra_template_kwargs, truncate_ids
from drmas_bench.types import Completion, Request
from drmas_retrieval.retry import RetriesExhausted, RetryPolicy, TransportFailure, asend_with_retries

__all__ = ["OpenAIEngine", "OpenAIOptions", "ServerDialect", "build_body", "dialect_from_schema", "parse_response",
           "request_properties", "response_cap", "settle_usage", "usage_slack"]

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
# answers of a server to the chat form of /tokenize that mean "no such endpoint / not this form"
_NO_TOKENIZE = (400, 404, 405, 415, 422, 501)


class OpenAIEngine(EngineBase):
    """An OpenAI-compatible HTTP server behind the engine protocol (see module docstring)."""

    name: ClassVar[str] = "openai"
    Options: ClassVar[type] = OpenAIOptions
    remote: ClassVar[bool] = True  # a server elsewhere serves the model
    output_neutral_options: ClassVar[tuple[str, ...]] = ("api_key", "max_concurrency", "max_retries", "timeout_s",
                                                         "backoff_s", "backoff_max_s")

    def __init__(self, model: str, **options: Any) -> None:
        self.model = model
        self.options: OpenAIOptions = parse_options(OpenAIOptions, options, kind=self.name)
        o = self.options
        _check_options(o)
        o.chat_template_kwargs = extra_template_kwargs(o.chat_template_kwargs, kind=self.name)
        base = o.base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        self.base_url = base.rstrip("/")
        self.tokenizer, self._no_tokenizer_why = _load_tokenizer(model, o)
        self.mode = "tokens" if self.tokenizer is not None else "chat"
        self.url = f"{self.base_url}/completions" if self.mode == "tokens" else f"{self.base_url}/chat/completions"
        self.api_key = o.api_key if o.api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.served_model = o.served_model or model
        self.completions_url = f"{self.base_url}/completions"
        self.tokenize_url = f"{server_root(self.base_url)}/tokenize"
        self.dialect = ServerDialect(top_k_off=TOP_K_OFF[o.top_k_off])
        if o.top_k_off == "omit":
            self.dialect.notes.append("top_k_off=omit: no top_k is sent for \"no top-k\" (the server's own default applies)")
        self._dialect_known = not o.server_schema  # the server's schema read (or not to be read)
        self._dialect_read: asyncio.Future[None] | None = None  # the one read of the schema under way
        self._dialect_ready = asyncio.Event()  # set when that read ends; every call made meanwhile waits on it
        self._warned_notes = 0
        # chat mode: does the server answer the chat form of /tokenize? None = not asked yet
        self.server_tokenize: bool | None = None if o.tokenize_endpoint else False
        self._tokenize_lock: asyncio.Lock | None = None
        self._warned_unenforced = False
        self._tokenize_why = ""  # why the server's /tokenize is not used, when it answered something else
        self.attempts = 0  # HTTP attempts made (for tests and benchmarks)
        self.fingerprints: set[str] = set()  # the system_fingerprint values the server's answers carried
        self.retry_policy = RetryPolicy(retries=o.max_retries, backoff_s=o.backoff_s, backoff_max_s=o.backoff_max_s)
        self._client: Any = None  # an openai_http.HttpClient, bound to the event loop it was made in
        self._sem: asyncio.Semaphore | None = None

    @classmethod
    def declared_determinism(cls, options: dict[str, Any]) -> dict[str, Any]:
        """A server's batching and kernels are its own: whether its answers are batch-invariant is not known here."""
        return {"batch_invariant": False, "dtype": "unknown (the server's)",
                "why": "the server's determinism is not known (its batching and kernels are its own)"}

    def determinism(self) -> dict[str, Any]:
        """``declared_determinism`` with the ``system_fingerprint`` values seen so far (sorted)."""
        return {**self.declared_determinism({}), "fingerprints": sorted(self.fingerprints)}

    # ------------------------------------------------------------------ protocol

    @property
    def is_awake(self) -> bool:
        return True

    def footprint_bytes(self) -> int:
        return 0

    async def sleep(self) -> None:
        """No-op: the server manages its own memory."""

    async def wake(self) -> None:
        """No-op: the server manages its own memory."""

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and client.loop is asyncio.get_running_loop():
            await client.close()  # (a client of an ended loop was closed with it)

    def encode_request(self, request: Request) -> tuple[list[int] | None, bool]:
        """What is sent as the prompt of ``request``: ``(ids, truncated)`` in token mode
        (``prompt.encode_request``), ``(None, False)`` in chat mode (a limit is applied in ``_one``,
        through the server's ``/tokenize``). Bad requests (a bad limit or side, fields the server
        cannot take) are one-line ``EngineError``s."""
        check_request(request, kind=self.name)
        s = request.sampling
        if not self.options.server_extras and (s.top_k != -1 or (s.enable_thinking and self.mode == "chat")):
            raise EngineError(
                "openai engine: server_extras=False sends no top_k / chat_template_kwargs, so a request with "
                f"top_k={s.top_k}, enable_thinking={s.enable_thinking} cannot be honoured"
            )
        if self.mode == "chat":  # a limit is applied in _one, through the server's /tokenize when it has one
            return None, False
        return encode_request(self.tokenizer, request, self.options.chat_template_kwargs or {}, model=self.model, kind=self.name)

    async def generate(self, requests: list[Request]) -> list[Completion]:
        """One Completion per Request, in order; requests run concurrently (bounded). Every
        request is checked and encoded before any is sent."""
        if len(requests) == 1:  # how episodes call: no list of encodings, no gather
            ids, cut = self.encode_request(requests[0])
            if self._client is None or self._client.loop is not asyncio.get_running_loop():
                await self._ensure_client()
            return [await self._one(requests[0], ids, cut)]
        encoded = list(map(self.encode_request, requests))
        await self._ensure_client()
        return list(await asyncio.gather(*map(self._one, requests, *zip(*encoded))))  # no closure: self stays a plain local

    # ------------------------------------------------------------------ internals

    async def _ensure_client(self) -> None:
        """An HTTP client of the running event loop (a new one when the loop changed: one
        ``asyncio.run`` per call; the old loop closed its own)."""
        if self._client is not None and self._client.loop is asyncio.get_running_loop():
            return
        from drmas_bench.engines.openai_http import HttpClient

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = await HttpClient.open(self.options.max_concurrency, self.options.timeout_s, headers, self.base_url)
        self._sem = asyncio.Semaphore(self.options.max_concurrency)
        self._tokenize_lock = asyncio.Lock()
        self._dialect_read = None

    async def _post(self, url: str, body: dict[str, Any], check: Any) -> Any:
        """POST under the shared retry policy; retries exhausted -> one-line EngineError. The first
        attempt is made here: a 200 that ``check`` accepts returns at once (the success path makes no
        retry loop, partial or further coroutine); any other outcome goes on in the policy's loop."""
        client = self._client
        self.attempts += 1
        try:
            first: Any = await client.request("POST", url, body)
        except TransportFailure as e:
            first = e
        else:
            if first.status_code == 200 and (check is None or check(first) is None):
                return first
        try:
            return await asend_with_retries(partial(client.request, "POST", url, body), self.retry_policy,
                                            on_attempt=self._count_attempt, check=check,
                                            final=looks_like_validation_error, first=first)
        except RetriesExhausted as e:
            n = e.attempts
            raise EngineError(f"openai engine: {url} failed after {n} attempt{'s' if n > 1 else ''}: {e.reason}") from None

    async def _server_prompt_ids(self, request: Request) -> list[int] | None:
        """The templated prompt ids from the server's ``/tokenize`` (chat mode, a limited request);
        None when the server has no chat ``/tokenize``. The first call asks alone (under a lock), so
        a server without one is asked once, not once per concurrent request."""
        if self.server_tokenize is None:
            assert self._tokenize_lock is not None
            async with self._tokenize_lock:
                if self.server_tokenize is None:
                    return await self._tokenize(request, first=True)
        if not self.server_tokenize:
            return None
        return await self._tokenize(request, first=False)

    async def _tokenize(self, request: Request, first: bool) -> list[int] | None:
        # no check= here: a 200 that is not a tokenizer's answer (llama.cpp's /tokenize takes text
        # in another field and answers an empty list) is final, not retried
        resp = await self._post(self.tokenize_url, tokenize_body(request, self.served_model, self.options), None)
        if resp.status_code == 200:
            bad = tokenize_problem(resp)
            if bad is None:
                self.server_tokenize = True
                return list(resp.json()["tokens"])
            self.server_tokenize = False  # answers, but not the chat form of /tokenize: asked no more
            self._tokenize_why = f"{self.tokenize_url} answered {bad}"
            return None
        if first and resp.status_code in _NO_TOKENIZE:  # no such endpoint, or not its chat form (SGLang)
            self.server_tokenize = False
            return None
        snippet = " ".join(resp.text.split())[:200]
        raise EngineError(f"openai engine: {self.tokenize_url} rejected the request (HTTP {resp.status_code}: {snippet})")

    def _warn_unenforced(self, request: Request) -> None:
        if not self._warned_unenforced:
            self._warned_unenforced = True
            logger.warning(
                f"[eval] warning: openai engine: {self._no_tokenizer_why}, and "
                + ((self._tokenize_why or f"{self.tokenize_url} does not tokenize chats") if self.options.tokenize_endpoint
                   else "the option tokenize_endpoint=False") + ", so prompts go out uncut (limit "
                f"max_prompt_tokens={request.max_prompt_tokens} not enforced); such calls are counted in summary.json "
                "protocol.prompt_limit_unenforced_calls (pass tokenizer=PATH|ALIAS|HUB_ID, eval --tokenizer, to enforce it)")

    @property
    def server_notes(self) -> list[str]:
        """What this engine learned about its server and any sampling the server applies that the
        request did not ask for (one line each; the run summary lists them per worker group)."""
        return list(self.dialect.notes)

    def _note(self, line: str) -> None:
        if line not in self.dialect.notes:
            self.dialect.notes.append(line)
        self._flush_notes()

    def _flush_notes(self) -> None:
        for line in self.dialect.notes[self._warned_notes:]:
            logger.warning(f"[eval] warning: openai engine ({self.base_url}): {line}")
        self._warned_notes = len(self.dialect.notes)

    async def _learn_dialect(self) -> None:
        """Read the server's OpenAPI schema once (``{server root}/openapi.json``: vLLM, SGLang and
        llama-cpp-python publish one; a paid API does not, and that is fine): which request fields
        it takes, how "no top-k" is said there, whether ``/completions`` takes token ids, and the
        sampling defaults it would add (switched off). No schema: the defaults stand, and a request
        the server refuses for one of these fields teaches the same (``adapt_to_refusal``).

        The first call starts the read; calls made meanwhile wait on that same read and are all
        woken together when it ends (a lock would let them through one per turn of the event loop,
        which throttles a burst of thousands of calls). A read that failed is started again by the
        next call; a caller cancelled while waiting does not cancel the read (it is a task of its own)."""
        read = self._dialect_read
        if read is None or (read.done() and not self._dialect_known):
            self._dialect_ready = asyncio.Event()
            read = self._dialect_read = asyncio.ensure_future(self._read_dialect(self._dialect_ready))
        await self._dialect_ready.wait()
        if not self._dialect_known:
            read.result()  # the read's own error (a read that failed), raised to each caller that waited on it

    async def _read_dialect(self, ready: asyncio.Event) -> None:
        try:
            await self._read_schema()
        finally:
            ready.set()

    async def _read_schema(self) -> None:
        assert self._client is not None
        try:
            resp = await self._client.get(f"{server_root(self.base_url)}/openapi.json",
                                          timeout_s=min(10.0, self.options.timeout_s))
            doc = resp.json() if resp.status_code == 200 else None
        except (TransportFailure, ValueError):
            doc = None
        if doc is not None:
            had = len(self.dialect.notes)
            dialect_from_schema(request_properties(doc, "/completions", exclude="/chat/completions"),
                                request_properties(doc, "/chat/completions"), self.options, self.dialect)
            if not self.dialect.token_prompt and self.tokenizer is not None:
                self.dialect.notes.append(
                    "the server's /completions takes no token ids: the prompt templated and cut here is sent as "
                    "text (the server tokenizes it again)")
            if len(self.dialect.notes) > had:
                logger.debug(f"openai engine: learned from {server_root(self.base_url)}/openapi.json")
        self._dialect_known = True
        self._flush_notes()

    def _prompt_text(self, ids: list[int]) -> str:
        """Token ids as the text a server tokenizes back (special tokens kept: the chat template's markers)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def _limited_chat(self, request: Request) -> tuple[list[int] | None, bool, bool]:
        """Chat mode, a request with a prompt limit: ``(ids, truncated, unenforced)``, the ids the
        server's ``/tokenize`` gave, cut; ``(None, False, True)`` when it has no chat /tokenize."""
        assert request.max_prompt_tokens is not None
        full = await self._server_prompt_ids(request)
        if full is None:
            self._warn_unenforced(request)
            return None, False, True
        ids = truncate_ids(full, request.max_prompt_tokens, request.truncate)
        return ids, len(ids) < len(full), False

    def _body(self, request: Request, prompt_ids: list[int] | None) -> dict[str, Any]:
        """The call's JSON body in the server's dialect as known now."""
        as_text = None
        if prompt_ids is not None and not self.dialect.token_prompt and self.tokenizer is not None:
            as_text = self._prompt_text(prompt_ids)
        return build_body(request, self.served_model, self.options, prompt_ids, self.dialect, as_text)

    async def _refused(self, request: Request, url: str, prompt_ids: list[int] | None, body: dict[str, Any],
                       resp: Any) -> Any:
        """A final non-200 answer to the call's first body: each refusal naming a field the server does
        not take teaches the dialect one fact and the call goes again (top_k -1, 0; token ids), four
        bodies at most; the 200 answer, or a one-line EngineError with the last refusal."""
        for sent in range(1, 5):
            if not adapt_to_refusal(self.dialect, self.options, resp, body, request, url, self.tokenizer is not None,
                                    self._note) or sent == 4:
                break
            body = self._body(request, prompt_ids)
            resp = await self._post(url, body, response_problem)
            if resp.status_code == 200:
                return resp
        snippet = " ".join(resp.text.split())[:200]  # a final answer that is not a success: the request's fault
        raise EngineError(f"openai engine: {url} rejected the request (HTTP {resp.status_code}: {snippet})")

    async def _one(self, request: Request, prompt_ids: list[int] | None, truncated: bool) -> Completion:
        assert self._sem is not None and self._client is not None
        unenforced = False
        url = self.url
        sem = self._sem
        await sem.acquire()  # (acquire/release: no context-manager coroutine per call)
        try:
            # the schema read is awaited with a slot held: a burst of calls at an engine's start waits
            # on the semaphore (which it does anyway), and at most max_concurrency of them on the read
            if not self._dialect_known:
                await self._learn_dialect()
            if request.sampling.top_k != -1 and not self.dialect.has_top_k:
                raise EngineError(f"openai engine: the server at {self.base_url} has no top_k field (its schema), so "
                                  f"top_k={request.sampling.top_k} cannot be honoured")
            t0 = time.perf_counter()
            if self.mode == "chat" and request.max_prompt_tokens is not None:
                prompt_ids, truncated, unenforced = await self._limited_chat(request)
                if prompt_ids is not None:
                    url = self.completions_url
            body = self._body(request, prompt_ids)
            resp = await self._post(url, body, response_problem)
            if resp.status_code != 200:
                resp = await self._refused(request, url, prompt_ids, body, resp)
            latency = time.perf_counter() - t0
        finally:
            sem.release()
        try:
            c = parse_response(resp.json(), request.want_logprobs)
        except BadUsage as exc:
            raise EngineError(f"openai engine: {url} returned impossible usage: {exc}") from None
        except ValueError as exc:
            raise EngineError(f"openai engine: {url} returned a bad response: {exc}") from exc
        c.latency_s = latency
        if c.system_fingerprint:
            self.fingerprints.add(c.system_fingerprint)
        if prompt_ids is not None:
            c.prompt_ids = list(prompt_ids)
            if c.usage == "server" and not c.prompt_tokens:
                c.prompt_tokens = len(prompt_ids)
        c.prompt_truncated = truncated
        c.prompt_limit_unenforced = unenforced
        cap = response_cap(request.sampling.max_new_tokens, self.options.max_response_chars)
        return settle_usage(c, request, cap, self._count_tokens if self.tokenizer is not None else None)

    def _count_tokens(self, text: str) -> int:
        """Completion tokens of a reply text, with the local tokenizer (a reply without usage)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _count_attempt(self) -> None:
        self.attempts += 1
