"""``openai``: any OpenAI-compatible server (vLLM's or SGLang's server, a paid API).

    engine = make_engine("openai", "Qwen/Qwen3-4B", base_url="http://127.0.0.1:8000/v1")

Two ways to send a prompt, chosen once at engine start:

- **token ids** (when a tokenizer for the model is on this machine, see ``tokenizer``): the
  prompt is built here exactly as the ``hf`` and ``sglang`` engines build it (chat template with
  the generation prompt and ``enable_thinking`` from the sampling, tokenized, cut to
  ``Request.max_prompt_tokens`` on ``Request.truncate``'s side; ``base.encode_request``) and sent
  as ``POST {base_url}/completions`` with ``prompt: [ids]`` (vLLM and SGLang accept token ids).
  This keeps the reference's semantics: the limit applies to the *templated* prompt tokens, so a
  left cut may drop the system message, as it does in the reference. ``Completion.prompt_ids``
  are the ids sent.
- **chat** (no tokenizer): ``POST {base_url}/chat/completions`` with ``messages`` and
  ``chat_template_kwargs: {"enable_thinking": <Sampling.enable_thinking>}``; the server applies
  its template. A prompt limit cannot be applied this way: a request with
  ``max_prompt_tokens`` set is an ``EngineError`` (before anything is sent) naming the
  ``tokenizer`` option.

Both send ``temperature``, ``top_p``, ``top_k`` (always, -1 = none: vLLM/SGLang would otherwise
fill in the model's ``generation_config`` default, e.g. Qwen3's top_k=20), the length field,
``seed`` when set, and log-probs when ``Request.want_logprobs`` (chat: ``logprobs: true``;
completions: ``logprobs: 0``, the sampled token's only). Calls run concurrently, at most
``max_concurrency`` at a time. A 429, a 5xx, a timeout or a connection error is retried with
exponential backoff (honouring ``Retry-After``), the project's one retry policy
(``drmas_retrieval.retry``); after ``max_retries`` retries, or at once on another 4xx, the call
fails with a one-line ``EngineError`` naming the URL.

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
- ``timeout_s``: per-attempt HTTP timeout in seconds.
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

``Completion.prompt_tokens`` / ``completion_tokens`` come from the response's ``usage``;
``latency_s`` is the request's own time on the wire, retries included (not its wait for a
concurrency slot). ``logprobs`` is ``None`` when the server returns none. Whether a server's
logprobs are raw (temperature 1) or after temperature depends on the server (vLLM: raw by default).
``sleep``/``wake`` are no-ops and ``footprint_bytes`` is 0: the server owns its memory.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from drmas_bench.engines.base import (
    EngineBase,
    EngineError,
    check_request,
    encode_request,
    extra_template_kwargs,
    local_tokenizer_dir,
    one_line,
    parse_options,
    template_kwargs_for,
)
from drmas_bench.types import Completion, Request
from drmas_retrieval.retry import RetriesExhausted, RetryPolicy, asend_with_retries

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


@dataclass
class OpenAIOptions:
    """Options of the ``openai`` engine (see the module docstring for each one)."""

    base_url: str | None = None
    api_key: str | None = None
    served_model: str | None = None
    tokenizer: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    server_extras: bool = True
    max_concurrency: int = 64
    max_retries: int = 5
    timeout_s: float = 600.0
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    extra_body: dict[str, Any] | None = None
    return_token_ids: bool = False
    max_tokens_field: str = "max_tokens"


# body fields this engine fills from the Request / options; extra_body may not set them
_OWN_FIELDS = ("model", "messages", "prompt", "temperature", "top_p", "top_k", "seed", "logprobs",
               "max_tokens", "return_token_ids", "chat_template_kwargs")


def build_body(request: Request, model: str, o: OpenAIOptions, prompt_ids: list[int] | None = None) -> dict[str, Any]:
    """The JSON body of one call (pure; tested directly): a completions body with ``prompt_ids``
    (already templated and cut), else a chat body with the request's messages."""
    s = request.sampling
    body: dict[str, Any] = {"model": model}
    if prompt_ids is not None:
        body["prompt"] = list(prompt_ids)
    else:
        body["messages"] = request.messages
    body["temperature"] = s.temperature
    body["top_p"] = s.top_p
    if o.server_extras:
        body["top_k"] = s.top_k
    body["max_tokens" if prompt_ids is not None else o.max_tokens_field] = s.max_new_tokens
    if s.seed is not None:
        body["seed"] = s.seed
    if request.want_logprobs:
        body["logprobs"] = 0 if prompt_ids is not None else True
    if o.return_token_ids:
        body["return_token_ids"] = True
    if prompt_ids is None and o.server_extras:
        body["chat_template_kwargs"] = template_kwargs_for(request, o.chat_template_kwargs or {})
    if o.extra_body:
        body.update(o.extra_body)
    return body


def parse_response(data: dict[str, Any], want_logprobs: bool) -> Completion:
    """A chat or completions response body -> Completion (``latency_s`` left at 0; pure).

    Text: ``choices[0].message.content`` (chat) or ``choices[0].text`` (completions). Log-probs:
    ``logprobs.content[i].logprob`` (chat) or ``logprobs.token_logprobs`` (completions). Token
    ids (``return_token_ids``): ``choices[0].token_ids``; prompt ids at the top level (chat) or in
    the choice (completions).
    """
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"no choices in response: {str(data)[:200]}") from exc
    if "message" in choice:
        text = (choice.get("message") or {}).get("content") or ""
    else:
        text = choice.get("text") or ""
    usage = data.get("usage") or {}
    token_ids = list(choice.get("token_ids") or [])
    prompt_ids = list(data.get("prompt_token_ids") or choice.get("prompt_token_ids") or [])
    logprobs = None
    if want_logprobs:
        lp = choice.get("logprobs") or {}
        if lp.get("content"):
            logprobs = [float(t["logprob"]) for t in lp["content"]]
        elif lp.get("token_logprobs"):
            logprobs = [float(x) for x in lp["token_logprobs"]]
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


def _load_tokenizer(model: str, o: OpenAIOptions) -> tuple[Any, str]:
    """The local prompt tokenizer (or None) and, when None, why (for the limit error)."""
    if o.tokenizer == "none":
        return None, "the option tokenizer='none' turned local templating off"
    name = o.tokenizer or model
    where = local_tokenizer_dir(name)
    if where is None:
        if o.tokenizer:
            raise EngineError(
                f"openai engine: no local tokenizer at {o.tokenizer!r} (a folder, a prepared alias, or a hub id "
                "in the Hugging Face cache; nothing is downloaded)"
            )
        return None, f"no local tokenizer for {model!r} (not a prepared alias, a local folder or a cached hub id)"
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
    except (OSError, ValueError) as exc:
        if o.tokenizer:
            raise EngineError(f"openai engine: cannot load the tokenizer {o.tokenizer!r} ({where}): {one_line(exc)}") from exc
        return None, f"the tokenizer at {where} did not load: {one_line(exc)}"
    if not getattr(tok, "chat_template", None):
        if o.tokenizer:
            raise EngineError(f"openai engine: the tokenizer {o.tokenizer!r} ({where}) has no chat template")
        return None, f"the tokenizer at {where} has no chat template"
    return tok, ""


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
        clash = sorted(set(o.extra_body or {}) & (set(_OWN_FIELDS) | {o.max_tokens_field}))
        if clash:
            raise EngineError(
                f"openai engine: extra_body may not set {', '.join(clash)}: the engine sends them from each "
                "request's sampling (top_k, enable_thinking, seed, ...) and its options (served_model, "
                "chat_template_kwargs, return_token_ids)"
            )
        o.chat_template_kwargs = extra_template_kwargs(o.chat_template_kwargs, kind=self.name)
        base = o.base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        self.base_url = base.rstrip("/")
        self.tokenizer, self._no_tokenizer_why = _load_tokenizer(model, o)
        self.mode = "tokens" if self.tokenizer is not None else "chat"
        self.url = f"{self.base_url}/completions" if self.mode == "tokens" else f"{self.base_url}/chat/completions"
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

    def encode_request(self, request: Request) -> tuple[list[int] | None, bool]:
        """What is sent as the prompt of ``request``: ``(ids, truncated)`` in token mode
        (``base.encode_request``), ``(None, False)`` in chat mode. Bad requests (a limit without a
        tokenizer, fields the server cannot take) are one-line ``EngineError``s."""
        check_request(request, kind=self.name)
        s = request.sampling
        if not self.options.server_extras and (s.top_k != -1 or (s.enable_thinking and self.mode == "chat")):
            raise EngineError(
                "openai engine: server_extras=False sends no top_k / chat_template_kwargs, so a request with "
                f"top_k={s.top_k}, enable_thinking={s.enable_thinking} cannot be honoured"
            )
        if self.mode == "chat":
            if request.max_prompt_tokens is not None:
                raise EngineError(
                    f"openai engine: a prompt limit (max_prompt_tokens={request.max_prompt_tokens}) needs the model's "
                    f"tokenizer here, and {self._no_tokenizer_why}; pass the engine option tokenizer=PATH|ALIAS|HUB_ID "
                    "(eval --tokenizer, or a team file's worker_groups.<name>.options.tokenizer), or lift the limit "
                    "(eval --max-prompt-tokens 0)"
                )
            return None, False
        return encode_request(self.tokenizer, request, self.options.chat_template_kwargs or {}, model=self.model, kind=self.name)

    async def generate(self, requests: list[Request]) -> list[Completion]:
        """One Completion per Request, in order; requests run concurrently (bounded). Every
        request is checked and encoded before any is sent."""
        encoded = [self.encode_request(r) for r in requests]
        self._ensure_client()
        return list(await asyncio.gather(*(self._one(r, ids, cut) for r, (ids, cut) in zip(requests, encoded))))

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

    @property
    def retry_policy(self) -> RetryPolicy:
        """The shared HTTP retry policy (drmas_retrieval.retry) with this engine's options."""
        o = self.options
        return RetryPolicy(retries=o.max_retries, backoff_s=o.backoff_s, backoff_max_s=o.backoff_max_s)

    async def _one(self, request: Request, prompt_ids: list[int] | None, truncated: bool) -> Completion:
        assert self._sem is not None and self._client is not None
        body = build_body(request, self.served_model, self.options, prompt_ids)
        async with self._sem:
            t0 = time.perf_counter()
            try:
                resp = await asend_with_retries(lambda: self._client.post(self.url, json=body), self.retry_policy,
                                                on_attempt=self._count_attempt)
            except RetriesExhausted as e:
                n = e.attempts
                raise EngineError(f"openai engine: {self.url} failed after {n} attempt{'s' if n > 1 else ''}: "
                                  f"{e.reason}") from None
            if resp.status_code != 200:  # a final answer that is not a success: the request's fault
                snippet = " ".join(resp.text.split())[:200]
                raise EngineError(f"openai engine: {self.url} rejected the request (HTTP {resp.status_code}: {snippet})")
            try:
                c = parse_response(resp.json(), request.want_logprobs)
            except ValueError as exc:
                raise EngineError(f"openai engine: {self.url} returned a bad response: {exc}") from exc
            c.latency_s = time.perf_counter() - t0
            if prompt_ids is not None:
                c.prompt_ids = list(prompt_ids)
                c.prompt_tokens = c.prompt_tokens or len(prompt_ids)
            c.prompt_truncated = truncated
            return c

    def _count_attempt(self) -> None:
        self.attempts += 1
