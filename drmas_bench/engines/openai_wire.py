"""The ``openai`` engine's wire format (pure, tested directly): its options, the JSON body of a
call, the reading of a reply, and the checks of what a server reports (``settle_usage``).

See :mod:`drmas_bench.engines.openai` for what each option and check means to a user."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from drmas_bench.engines.prompt import template_kwargs_for
from drmas_bench.types import Completion, Request

CHARS_PER_TOKEN = 64  # the default reply cap: this many characters per requested token ...
CHARS_EXTRA = 4096  # ... plus this many

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
    tokenize_endpoint: bool = True
    max_response_chars: int | None = None
    top_k_off: Any = "auto"
    server_schema: bool = True


# body fields this engine fills from the Request / options; extra_body may not set them
OWN_FIELDS = ("model", "messages", "prompt", "temperature", "top_p", "top_k", "seed", "logprobs",
               "max_tokens", "return_token_ids", "chat_template_kwargs")


# sampling knobs some servers add with a default that is not "off" (llama.cpp: min_p 0.05,
# repeat_penalty 1.1), and the value that switches each off; a Sampling never asks for them
NEUTRAL_SAMPLING: dict[str, float] = {"min_p": 0.0, "repeat_penalty": 1.0, "repetition_penalty": 1.0,
                                      "typical_p": 1.0, "tfs_z": 1.0, "mirostat_mode": 0,
                                      "presence_penalty": 0.0, "frequency_penalty": 0.0}
TOP_K_OFF = {"auto": -1, -1: -1, 0: 0, "omit": None}  # option top_k_off -> what "no top-k" sends (None: nothing)


@dataclass
class ServerDialect:
    """What one server takes, learned once (its OpenAPI schema, or a request it refused):
    ``top_k_off`` how "no top-k" is sent (-1, 0, or None: no top_k field at all), ``token_prompt``
    whether ``/completions`` takes token ids, ``neutral`` server-default knobs sent switched off, and
    ``notes``: one line per fact learned or per sampling the server applies that cannot be switched
    off (the run summary lists them per worker group)."""

    top_k_off: int | None = -1
    has_top_k: bool = True  # False: the server's schema has no top_k (a requested top-k cannot be honoured)
    token_prompt: bool = True
    neutral: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)



def build_body(request: Request, model: str, o: OpenAIOptions, prompt_ids: list[int] | None = None,
               dialect: "ServerDialect | None" = None, prompt_text: str | None = None) -> dict[str, Any]:
    """The JSON body of one call (pure; tested directly): a completions body with ``prompt_ids``
    (already templated and cut; sent as ``prompt_text`` instead when given: a server that takes no
    token ids), else a chat body with the request's messages. ``dialect``: what this server takes
    (how "no top-k" is sent, the server defaults switched off); None = the defaults."""
    s = request.sampling
    d = dialect or ServerDialect()
    body: dict[str, Any] = {"model": model}
    if prompt_ids is not None:
        body["prompt"] = prompt_text if prompt_text is not None else list(prompt_ids)
    else:
        body["messages"] = request.messages
    body["temperature"] = s.temperature
    body["top_p"] = s.top_p
    if o.server_extras:
        top_k = d.top_k_off if s.top_k == -1 else s.top_k
        if top_k is not None:
            body["top_k"] = top_k
        body.update(d.neutral)
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
    the choice (completions). Usage: ``usage.prompt_tokens`` / ``completion_tokens`` (``usage =
    "server"``); without them the id lists' lengths when both came back, else ``usage = "unknown"``
    (``settle_usage`` may count it). Impossible usage raises :class:`BadUsage`. ``system_fingerprint``:
    the body's, when it is a non-empty string.
    """
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"no choices in response: {str(data)[:200]}") from exc
    if "message" in choice:
        text = (choice.get("message") or {}).get("content") or ""
    else:
        text = choice.get("text") or ""
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
    counts = _usage_counts(data.get("usage"))
    if counts is not None:
        prompt_n, completion_n, source = counts[0], counts[1], "server"
    elif token_ids and prompt_ids:  # no usage, but the server sent both id lists: their lengths are exact
        prompt_n, completion_n, source = len(prompt_ids), len(token_ids), "server"
    else:
        prompt_n, completion_n, source = len(prompt_ids), len(token_ids), "unknown"
    return Completion(
        text=text,
        token_ids=token_ids,
        prompt_ids=prompt_ids,
        logprobs=logprobs,
        prompt_tokens=prompt_n,
        completion_tokens=completion_n,
        finish="length" if reason == "length" else "stop",
        usage=source,
        system_fingerprint=fingerprint if isinstance(fingerprint := data.get("system_fingerprint"), str) and fingerprint
        else None,
    )


class BadUsage(ValueError):
    """A ``usage`` block no count can be taken from (negative or not whole numbers): a server bug,
    reported at once rather than retried or priced."""


def _usage_counts(usage: Any) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) of a response's ``usage``; None when it is missing or
    lacks one of them. Negative or non-integer counts are :class:`BadUsage`."""
    if not isinstance(usage, dict) or usage.get("prompt_tokens") is None or usage.get("completion_tokens") is None:
        return None
    out = []
    for key in ("prompt_tokens", "completion_tokens"):
        v = usage[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
            raise BadUsage(f"usage.{key} is not a whole number: {v!r}")
        if v < 0:
            raise BadUsage(f"usage.{key} is negative: {v!r}")
        out.append(int(v))
    return out[0], out[1]


def response_problem(resp: Any) -> str | None:
    """Why a 200 answer cannot be used (not JSON, an HTML page, no choices), else None. The shared
    retry policy retries such answers (``drmas_retrieval.retry``, ``check=``)."""
    try:
        data = resp.json()
    except ValueError:
        kind = resp.headers.get("content-type", "no content type")
        return f"a 200 answer that is not JSON ({kind}): {' '.join(resp.text.split())[:120]!r}"
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return f"a 200 answer without choices: {' '.join(str(data).split())[:160]}"
    return None


def usage_slack(max_new_tokens: int) -> int:
    """How far above the requested length a server's completion count may go before it is flagged
    (a few tokens of stop strings or special tokens are normal; a hundred times is not)."""
    return max(16, max_new_tokens // 10)


def response_cap(max_new_tokens: int, option: int | None) -> int:
    """The longest reply text kept (``max_response_chars``, else by the requested length)."""
    return option if option is not None else CHARS_PER_TOKEN * max_new_tokens + CHARS_EXTRA


def settle_usage(c: Completion, request: Request, cap: int, count: Any = None) -> Completion:
    """Check and complete a parsed reply in place (pure but for ``count``; tested directly).

    ``count(text) -> int`` counts tokens with the model's tokenizer when one is here: an unknown
    usage becomes ``"counted"`` (the prompt from ``c.prompt_ids``, the completion from the text).
    A completion count more than :func:`usage_slack` above the request's ``max_new_tokens`` is
    flagged in ``c.notes``; a text (and token lists) longer than the cap are cut, with a note."""
    limit = request.sampling.max_new_tokens
    if len(c.text) > cap:
        c.notes.append(f"reply of {len(c.text)} characters cut to {cap} (max_response_chars)")
        c.text = c.text[:cap]
        c.finish = "length"
    keep = limit + usage_slack(limit)
    if len(c.token_ids) > keep or (c.logprobs is not None and len(c.logprobs) > keep):
        c.notes.append(f"reply of {max(len(c.token_ids), len(c.logprobs or []))} tokens: token lists cut to {keep}")
        c.token_ids = c.token_ids[:keep]
        c.logprobs = None if c.logprobs is None else c.logprobs[:keep]
    if c.usage == "unknown" and c.prompt_ids and (c.token_ids or count is not None):
        c.prompt_tokens = len(c.prompt_ids)  # the ids sent (token mode) or returned
        c.completion_tokens = len(c.token_ids) if c.token_ids else int(count(c.text))
        c.usage = "counted"
    if c.usage == "unknown":
        c.prompt_tokens = c.completion_tokens = 0  # never a number that looks measured
    elif c.completion_tokens > keep:
        c.notes.append(f"server reports {c.completion_tokens} completion tokens for a request of at most {limit}")
    return c


def server_root(base_url: str) -> str:
    """The server's root URL from its ``/v1`` base (vLLM serves ``/tokenize`` there)."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def tokenize_body(request: Request, model: str, o: OpenAIOptions) -> dict[str, Any]:
    """The chat form of ``/tokenize`` (vLLM's ``TokenizeChatRequest``): the messages templated with
    the generation prompt and the request's template variables, no extra special tokens."""
    body: dict[str, Any] = {"model": model, "messages": request.messages, "add_generation_prompt": True,
                            "add_special_tokens": False}
    if o.server_extras:
        body["chat_template_kwargs"] = template_kwargs_for(request, o.chat_template_kwargs or {})
    return body


def tokenize_problem(resp: Any) -> str | None:
    """Why a 200 answer of ``/tokenize`` is unusable (no ``tokens`` list of ints), else None."""
    try:
        data = resp.json()
    except ValueError:
        return f"a /tokenize answer that is not JSON: {' '.join(resp.text.split())[:120]!r}"
    toks = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(toks, list) or not toks or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
        # an empty list too: a templated chat is never zero tokens (llama.cpp's /tokenize answers
        # {"tokens": []} to a body without its "content" field)
        return f"a /tokenize answer without a token id list: {' '.join(str(data).split())[:160]}"
    return None
