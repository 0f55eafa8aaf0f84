"""``openai``: any OpenAI-compatible chat server (vLLM's or SGLang's server, a paid API).

    engine = make_engine("openai", "Qwen/Qwen3-4B", base_url="http://127.0.0.1:8000/v1",
                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})

Each Request is one ``POST {base_url}/chat/completions`` with ``messages``, ``temperature``,
``top_p``, ``max_tokens`` and ``seed`` (when set), and ``logprobs: true`` when
``Request.want_logprobs``. Calls run concurrently, at most ``max_concurrency`` at a time. A 429,
a 5xx, a timeout or a connection error is retried with exponential backoff (honouring
``Retry-After``); after ``max_retries`` retries, or at once on another 4xx, the call fails with a
one-line ``EngineError`` naming the URL.

Options (``OpenAIOptions``):

- ``base_url``: the server's ``/v1`` root. Default: ``$OPENAI_BASE_URL`` or
  ``http://127.0.0.1:8000/v1``.
- ``api_key``: sent as ``Authorization: Bearer``. Default: ``$OPENAI_API_KEY``; none for local
  servers.
- ``served_model``: the ``model`` field sent to the server. Default: the engine's model name.
- ``max_concurrency``: most requests in flight at once.
- ``max_retries``: retries after the first attempt (0 = no retry).
- ``timeout_s``: per-attempt HTTP timeout in seconds.
- ``backoff_s``: wait before the first retry; doubled each retry, at most ``backoff_max_s``.
- ``backoff_max_s``: cap of one wait (also caps ``Retry-After``).
- ``extra_body``: extra JSON fields merged into every request body (e.g. vLLM/SGLang's
  ``chat_template_kwargs`` to disable Qwen3 thinking, or ``top_k``).
- ``return_token_ids``: ask for prompt/response token ids (vLLM >= 0.10.2 ``return_token_ids``);
  without it, ``token_ids``/``prompt_ids`` stay empty and only the ``usage`` counts are filled.
- ``max_tokens_field``: name of the length field (``"max_tokens"``; some APIs want
  ``"max_completion_tokens"``).

``Completion.prompt_tokens`` / ``completion_tokens`` come from the response's ``usage``;
``latency_s`` is the request's own time on the wire, retries included (not its wait for a
concurrency slot). ``logprobs`` is ``None`` when the server returns none. Whether a server's
logprobs are raw (temperature 1) or after temperature depends on the server (vLLM: raw by default).
``sleep``/``wake`` are no-ops and ``footprint_bytes`` is 0: the server owns its memory.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from drmas_bench.engines.base import EngineBase, EngineError, parse_options
from drmas_bench.types import Completion, Request

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


@dataclass
class OpenAIOptions:
    """Options of the ``openai`` engine (see the module docstring for each one)."""

    base_url: str | None = None
    api_key: str | None = None
    served_model: str | None = None
    max_concurrency: int = 64
    max_retries: int = 5
    timeout_s: float = 600.0
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    extra_body: dict[str, Any] | None = None
    return_token_ids: bool = False
    max_tokens_field: str = "max_tokens"


def build_body(request: Request, model: str, o: OpenAIOptions) -> dict[str, Any]:
    """The JSON body of one chat completion call (pure; tested directly)."""
    s = request.sampling
    body: dict[str, Any] = {
        "model": model,
        "messages": request.messages,
        "temperature": s.temperature,
        "top_p": s.top_p,
        o.max_tokens_field: s.max_new_tokens,
    }
    if s.seed is not None:
        body["seed"] = s.seed
    if request.want_logprobs:
        body["logprobs"] = True
    if o.return_token_ids:
        body["return_token_ids"] = True
    if o.extra_body:
        body.update(o.extra_body)
    return body


def parse_response(data: dict[str, Any], want_logprobs: bool) -> Completion:
    """A chat completion response body -> Completion (``latency_s`` left at 0; pure)."""
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"no choices in response: {str(data)[:200]}") from exc
    text = (choice.get("message") or {}).get("content") or ""
    usage = data.get("usage") or {}
    token_ids = list(choice.get("token_ids") or [])
    prompt_ids = list(data.get("prompt_token_ids") or [])
    logprobs = None
    if want_logprobs:
        content = (choice.get("logprobs") or {}).get("content")
        if content:
            logprobs = [float(t["logprob"]) for t in content]
    reason = choice.get("finish_reason")
    return Completion(
        text=text,
        token_ids=token_ids,
        prompt_ids=prompt_ids,
        logprobs=logprobs,
        prompt_tokens=int(usage.get("prompt_tokens") or len(prompt_ids)),
        completion_tokens=int(usage.get("completion_tokens") or len(token_ids)),
        finish="length" if reason == "length" else "stop",
    )


class OpenAIEngine(EngineBase):
    """An OpenAI-compatible HTTP server behind the engine protocol (see module docstring)."""

    name: ClassVar[str] = "openai"
    Options: ClassVar[type] = OpenAIOptions

    def __init__(self, model: str, **options: Any) -> None:
        self.model = model
        self.options: OpenAIOptions = parse_options(OpenAIOptions, options, kind=self.name)
        o = self.options
        if o.max_concurrency < 1:
            raise EngineError(f"openai engine: max_concurrency must be >= 1, got {o.max_concurrency}")
        if o.max_retries < 0:
            raise EngineError(f"openai engine: max_retries must be >= 0, got {o.max_retries}")
        base = o.base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        self.base_url = base.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.api_key = o.api_key if o.api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.served_model = o.served_model or model
        self.attempts = 0  # HTTP attempts made (for tests and benchmarks)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._sem: asyncio.Semaphore | None = None

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
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()

    async def generate(self, requests: list[Request]) -> list[Completion]:
        """One Completion per Request, in order; requests run concurrently (bounded)."""
        self._ensure_client()
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    # ------------------------------------------------------------------ internals

    def _ensure_client(self) -> None:
        import httpx

        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            limits = httpx.Limits(max_connections=self.options.max_concurrency, max_keepalive_connections=self.options.max_concurrency)
            self._client = httpx.AsyncClient(timeout=self.options.timeout_s, headers=headers, limits=limits)
            self._sem = asyncio.Semaphore(self.options.max_concurrency)
            self._loop = loop

    def _wait_s(self, retry: int, retry_after: str | None) -> float:
        o = self.options
        wait = min(o.backoff_max_s, o.backoff_s * (2**retry))
        wait *= 0.75 + 0.5 * random.random()  # jitter: concurrent callers do not retry in lockstep
        if retry_after:
            try:
                wait = max(wait, float(retry_after))
            except ValueError:
                pass
        return min(wait, o.backoff_max_s)

    async def _one(self, request: Request) -> Completion:
        import httpx

        assert self._sem is not None and self._client is not None
        body = build_body(request, self.served_model, self.options)
        async with self._sem:
            t0 = time.perf_counter()
            last = ""
            for attempt in range(self.options.max_retries + 1):
                retry_after = None
                self.attempts += 1
                try:
                    resp = await self._client.post(self.url, json=body)
                except httpx.TimeoutException as exc:
                    last = f"timeout after {self.options.timeout_s:g}s ({type(exc).__name__})"
                except httpx.TransportError as exc:
                    last = f"{type(exc).__name__}: {exc}".strip()
                else:
                    if resp.status_code == 200:
                        try:
                            c = parse_response(resp.json(), request.want_logprobs)
                        except ValueError as exc:
                            raise EngineError(f"openai engine: {self.url} returned a bad response: {exc}") from exc
                        c.latency_s = time.perf_counter() - t0
                        return c
                    snippet = " ".join(resp.text.split())[:200]
                    last = f"HTTP {resp.status_code}: {snippet}"
                    if resp.status_code != 429 and resp.status_code < 500:
                        raise EngineError(f"openai engine: {self.url} rejected the request ({last})")
                    retry_after = resp.headers.get("retry-after")
                if attempt < self.options.max_retries:
                    await asyncio.sleep(self._wait_s(attempt, retry_after))
            n = self.options.max_retries + 1
            raise EngineError(f"openai engine: {self.url} failed after {n} attempt{'s' if n > 1 else ''}: {last}")
