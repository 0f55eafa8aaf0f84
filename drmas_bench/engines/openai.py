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
- ``tokenize_endpoint``: ask the server's ``/tokenize`` for the prompt ids of a limited request
  when no tokenizer is here (True).
- ``max_response_chars``: the longest reply text kept; ``None`` (default): 64 characters per
  requested token plus 4096 (a token is rarely longer than 16 characters).
- ``top_k_off``: how "no top-k" is sent: ``"auto"`` (default: -1, or what the server's schema or a
  refusal teaches), ``-1``, ``0``, or ``"omit"`` (no top_k field).
- ``server_schema``: read the server's ``/openapi.json`` once to learn its dialect (True).

``Completion.prompt_tokens`` / ``completion_tokens`` come from the response's ``usage`` (see above);
``latency_s`` is the request's own time on the wire, retries included (not its wait for a
concurrency slot). ``logprobs`` is ``None`` when the server returns none. Whether a server's
logprobs are raw (temperature 1) or after temperature depends on the server (vLLM: raw by default).
``sleep``/``wake`` are no-ops and ``footprint_bytes`` is 0: the server owns its memory.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from drmas_bench.engines.base import (
    EngineBase,
    EngineError,
    local_tokenizer_dir,
    parse_options,
)
from drmas_bench.engines.prompt import (
    check_request,
    encode_request,
    extra_template_kwargs,
    template_kwargs_for,
    truncate_ids,
)
from drmas_bench.log import squeeze
from drmas_bench.types import Completion, Request
from drmas_retrieval.retry import RetriesExhausted, RetryPolicy, asend_with_retries

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
CHARS_PER_TOKEN = 64  # the default reply cap: this many characters per requested token ...
CHARS_EXTRA = 4096  # ... plus this many
# answers of a server to the chat form of /tokenize that mean "no such endpoint / not this form"
_NO_TOKENIZE = (400, 404, 405, 415, 422, 501)


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
_OWN_FIELDS = ("model", "messages", "prompt", "temperature", "top_p", "top_k", "seed", "logprobs",
               "max_tokens", "return_token_ids", "chat_template_kwargs")


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


# sampling knobs some servers add with a default that is not "off" (llama.cpp: min_p 0.05,
# repeat_penalty 1.1), and the value that switches each off; a Sampling never asks for them
NEUTRAL_SAMPLING: dict[str, float] = {"min_p": 0.0, "repeat_penalty": 1.0, "repetition_penalty": 1.0,
                                      "typical_p": 1.0, "tfs_z": 1.0, "mirostat_mode": 0,
                                      "presence_penalty": 0.0, "frequency_penalty": 0.0}
TOP_K_OFF = {"auto": -1, -1: -1, 0: 0, "omit": None}  # option top_k_off -> what "no top-k" sends (None: nothing)
_VALIDATION = re.compile(r"validation error|input should|field required|greater than or equal|less than or equal|"
                         r"extra inputs|not permitted|unrecognized request argument|\bloc\b", re.I)


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


def looks_like_validation_error(resp: Any) -> bool:
    """A 500 whose body names a rejected request field (llama-cpp-python reports its pydantic
    validation errors as HTTP 500): the same request gets the same answer, retrying cannot help."""
    return getattr(resp, "status_code", 0) == 500 and bool(_VALIDATION.search(resp.text or ""))


def _schema_types(schema: Any, defs: dict[str, Any], depth: int = 0) -> set[str]:
    """Every JSON type a (sub)schema allows, items of arrays as ``array<T>``."""
    if not isinstance(schema, dict) or depth > 8:
        return set()
    if "$ref" in schema:
        return _schema_types(defs.get(schema["$ref"].rsplit("/", 1)[-1]), defs, depth + 1)
    out: set[str] = set()
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            out |= _schema_types(sub, defs, depth + 1)
    t = schema.get("type")
    for one in ([t] if isinstance(t, str) else list(t or [])):
        if one == "array":
            out |= {f"array<{x}>" for x in _schema_types(schema.get("items"), defs, depth + 1)} or {"array"}
        else:
            out.add(one)
    return out


def request_properties(doc: Any, path_suffix: str, exclude: str | None = None) -> dict[str, Any] | None:
    """The request-body properties of ``POST ...{path_suffix}`` (not ``...{exclude}``) in an OpenAPI
    document (pure), None when the document does not describe that endpoint's body."""
    if not isinstance(doc, dict):
        return None
    defs = ((doc.get("components") or {}).get("schemas")) or {}
    for path, item in (doc.get("paths") or {}).items():
        path = str(path)
        if not path.endswith(path_suffix) or (exclude and path.endswith(exclude)) or not isinstance(item, dict):
            continue
        content = (((item.get("post") or {}).get("requestBody") or {}).get("content") or {})
        schema = (content.get("application/json") or {}).get("schema")
        for _ in range(8):  # follow $ref / a single anyOf wrapper to the object
            if isinstance(schema, dict) and "$ref" in schema:
                schema = defs.get(schema["$ref"].rsplit("/", 1)[-1])
            elif isinstance(schema, dict) and len(schema.get("anyOf") or schema.get("allOf") or []) == 1:
                schema = (schema.get("anyOf") or schema.get("allOf"))[0]
            else:
                break
        if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
            return {k: {**v, "_types": _schema_types(v, defs)} for k, v in schema["properties"].items()
                    if isinstance(v, dict)}
    return None


def dialect_from_schema(props_completions: dict | None, props_chat: dict | None, o: OpenAIOptions,
                        dialect: ServerDialect) -> None:
    """Fill ``dialect`` from a server's request schemas (pure; tested directly)."""
    props = {**(props_chat or {}), **(props_completions or {})}
    if not props:
        return
    if o.top_k_off == "auto" and o.server_extras:  # (server_extras=False sends no top_k at all)
        tk = props.get("top_k")
        if tk is None:
            dialect.top_k_off, dialect.has_top_k = None, False
            dialect.notes.append("the server's schema has no top_k: none is sent (it has no top-k sampling)")
        else:
            low = tk.get("minimum", tk.get("exclusiveMinimum"))
            if isinstance(low, (int, float)) and low >= 0:
                if low == 0 and "exclusiveMinimum" not in tk:
                    dialect.top_k_off = 0
                    dialect.notes.append("the server's schema takes top_k >= 0 only: \"no top-k\" is sent as top_k=0")
                else:
                    dialect.top_k_off = None
                    dialect.notes.append(f"the server's top_k must be > 0 (default {tk.get('default')}): top-k cannot "
                                         "be switched off there")
    prompt = (props_completions or {}).get("prompt")
    if prompt is not None and not any(t in prompt["_types"] for t in ("array<integer>", "array<array<integer>>")):
        dialect.token_prompt = False
    for name, off in NEUTRAL_SAMPLING.items():
        d = props.get(name, {}).get("default")
        if isinstance(d, (int, float)) and not isinstance(d, bool) and d != off:
            if o.server_extras:
                dialect.neutral[name] = off
                dialect.notes.append(f"server default {name}={d} switched off (sent {name}={off})")
            else:
                dialect.notes.append(f"server default {name}={d} APPLIES (server_extras=False sends no {name})")
    if not o.server_extras and "top_k" in props and props["top_k"].get("default") not in (None, -1, 0):
        dialect.notes.append(f"server default top_k={props['top_k']['default']} APPLIES (server_extras=False sends no top_k)")


def parse_response(data: dict[str, Any], want_logprobs: bool) -> Completion:
    """A chat or completions response body -> Completion (``latency_s`` left at 0; pure).

    Text: ``choices[0].message.content`` (chat) or ``choices[0].text`` (completions). Log-probs:
    ``logprobs.content[i].logprob`` (chat) or ``logprobs.token_logprobs`` (completions). Token
    ids (``return_token_ids``): ``choices[0].token_ids``; prompt ids at the top level (chat) or in
    the choice (completions). Usage: ``usage.prompt_tokens`` / ``completion_tokens`` (``usage =
    "server"``); without them the id lists' lengths when both came back, else ``usage = "unknown"``
    (``settle_usage`` may count it). Impossible usage raises :class:`BadUsage`.
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
            raise EngineError(f"openai engine: cannot load the tokenizer {o.tokenizer!r} ({where}): {squeeze(exc)}") from exc
        return None, f"the tokenizer at {where} did not load: {squeeze(exc)}"
    if not getattr(tok, "chat_template", None):
        if o.tokenizer:
            raise EngineError(f"openai engine: the tokenizer {o.tokenizer!r} ({where}) has no chat template")
        return None, f"the tokenizer at {where} has no chat template"
    return tok, ""


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
        self.completions_url = f"{self.base_url}/completions"
        self.tokenize_url = f"{server_root(self.base_url)}/tokenize"
        if o.max_response_chars is not None and o.max_response_chars < 1:
            raise EngineError(f"openai engine: max_response_chars must be >= 1, got {o.max_response_chars}")
        if o.top_k_off not in TOP_K_OFF or isinstance(o.top_k_off, bool):
            raise EngineError(f"openai engine: top_k_off must be auto, -1, 0 or omit, got {o.top_k_off!r}")
        self.dialect = ServerDialect(top_k_off=TOP_K_OFF[o.top_k_off])
        if o.top_k_off == "omit":
            self.dialect.notes.append("top_k_off=omit: no top_k is sent for \"no top-k\" (the server's own default applies)")
        self._dialect_known = not o.server_schema  # the server's schema read (or not to be read)
        self._dialect_lock: asyncio.Lock | None = None
        self._warned_notes = 0
        # chat mode: does the server answer the chat form of /tokenize? None = not asked yet
        self.server_tokenize: bool | None = None if o.tokenize_endpoint else False
        self._tokenize_lock: asyncio.Lock | None = None
        self._warned_unenforced = False
        self._tokenize_why = ""  # why the server's /tokenize is not used, when it answered something else
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
        encoded = [self.encode_request(r) for r in requests]
        self._ensure_client()
        return list(await asyncio.gather(*(self._one(r, ids, cut) for r, (ids, cut) in zip(requests, encoded))))

    # ------------------------------------------------------------------ internals

    def _ensure_client(self) -> None:

        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            limits = httpx.Limits(max_connections=self.options.max_concurrency, max_keepalive_connections=self.options.max_concurrency)
            self._client = httpx.AsyncClient(timeout=self.options.timeout_s, headers=headers, limits=limits)
            self._sem = asyncio.Semaphore(self.options.max_concurrency)
            self._tokenize_lock = asyncio.Lock()
            self._dialect_lock = asyncio.Lock()
            self._loop = loop

    @property
    def retry_policy(self) -> RetryPolicy:
        """The shared HTTP retry policy (drmas_retrieval.retry) with this engine's options."""
        o = self.options
        return RetryPolicy(retries=o.max_retries, backoff_s=o.backoff_s, backoff_max_s=o.backoff_max_s)

    async def _post(self, url: str, body: dict[str, Any], check: Any) -> Any:
        """POST under the shared retry policy; retries exhausted -> one-line EngineError."""
        assert self._client is not None
        try:
            return await asend_with_retries(lambda: self._client.post(url, json=body), self.retry_policy,
                                            on_attempt=self._count_attempt, check=check,
                                            final=looks_like_validation_error)
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
        the server refuses for one of these fields teaches the same (``_adapt``)."""
        if self._dialect_known:
            return
        assert self._dialect_lock is not None and self._client is not None
        async with self._dialect_lock:
            if self._dialect_known:
                return
            try:
                resp = await self._client.get(f"{server_root(self.base_url)}/openapi.json",
                                              timeout=min(10.0, self.options.timeout_s))
                doc = resp.json() if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
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

    def _adapt(self, resp: Any, body: dict[str, Any], request: Request, url: str) -> bool:
        """A refusal that names a field this engine can do without: learn it for the server and say
        to send again (True); anything else is the caller's error (False). Concurrent calls refused
        for a field another call has already learned are sent again too."""
        text = resp.text or ""
        if resp.status_code not in (400, 422, 500) or not _VALIDATION.search(text):
            return False
        snippet = " ".join(text.split())[:200]
        changed = False
        if "top_k" in text and "top_k" in body:
            sent = body["top_k"]
            if request.sampling.top_k != -1:
                raise EngineError(f"openai engine: {url} refused top_k={sent} (HTTP {resp.status_code}: {snippet}); "
                                  "this server cannot honour the requested top-k")
            if sent != self.dialect.top_k_off:
                changed = True  # learned meanwhile by another call
            elif self.options.top_k_off == "auto" and sent == -1:
                self.dialect.top_k_off = 0
                self._note(f"the server refused top_k=-1 (HTTP {resp.status_code}): \"no top-k\" is sent as top_k=0")
                changed = True
            elif self.options.top_k_off == "auto" and sent == 0:
                self.dialect.top_k_off = None
                self._note(f"the server refused top_k=-1 and top_k=0 (HTTP {resp.status_code}): no top_k is sent; "
                           "a top-k default of the server's own, if it has one, APPLIES")
                changed = True
        if "prompt" in text and isinstance(body.get("prompt"), list) and self.tokenizer is not None:
            if self.dialect.token_prompt:
                self.dialect.token_prompt = False
                self._note(f"the server refused a prompt of token ids (HTTP {resp.status_code}: {snippet[:120]}): the "
                           "prompt templated and cut here is sent as text from now on (the server tokenizes it again)")
            changed = True
        return changed

    def _prompt_text(self, ids: list[int]) -> str:
        """Token ids as the text a server tokenizes back (special tokens kept: the chat template's markers)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def _one(self, request: Request, prompt_ids: list[int] | None, truncated: bool) -> Completion:
        assert self._sem is not None and self._client is not None
        unenforced = False
        url = self.url
        await self._learn_dialect()
        if request.sampling.top_k != -1 and not self.dialect.has_top_k:
            raise EngineError(f"openai engine: the server at {self.base_url} has no top_k field (its schema), so "
                              f"top_k={request.sampling.top_k} cannot be honoured")
        async with self._sem:
            t0 = time.perf_counter()
            if self.mode == "chat" and request.max_prompt_tokens is not None:
                full = await self._server_prompt_ids(request)
                if full is None:
                    unenforced = True
                    self._warn_unenforced(request)
                else:
                    prompt_ids = truncate_ids(full, request.max_prompt_tokens, request.truncate)
                    truncated = len(prompt_ids) < len(full)
                    url = self.completions_url
            for _ in range(4):  # each pass may learn one more field the server refuses (top_k -1, 0; token ids)
                as_text = None
                if prompt_ids is not None and not self.dialect.token_prompt and self.tokenizer is not None:
                    as_text = self._prompt_text(prompt_ids)
                body = build_body(request, self.served_model, self.options, prompt_ids, self.dialect, as_text)
                resp = await self._post(url, body, response_problem)
                if resp.status_code == 200 or not self._adapt(resp, body, request, url):
                    break
            if resp.status_code != 200:  # a final answer that is not a success: the request's fault
                snippet = " ".join(resp.text.split())[:200]
                raise EngineError(f"openai engine: {url} rejected the request (HTTP {resp.status_code}: {snippet})")
            try:
                c = parse_response(resp.json(), request.want_logprobs)
            except BadUsage as exc:
                raise EngineError(f"openai engine: {url} returned impossible usage: {exc}") from None
            except ValueError as exc:
                raise EngineError(f"openai engine: {url} returned a bad response: {exc}") from exc
            c.latency_s = time.perf_counter() - t0
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
