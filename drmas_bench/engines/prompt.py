"""What a model is sent: the chat encoding and the prompt-length rule of REFERENCE.md §2b, for every
engine (hf, sglang, openai with a tokenizer) and the trainer's warm start.

The one home of ``TRUNCATE_SIDES`` (the protocol's options import it) and of the request checks no
engine can honour; pure functions over a tokenizer and a ``Request``.
"""

from __future__ import annotations

from typing import Any

from drmas_bench.engines.base import EngineError
from drmas_bench.log import squeeze
from drmas_bench.types import Request

TRUNCATE_SIDES = ("left", "middle", "right")


def encode_chat(tokenizer: Any, messages: list[dict[str, str]], template_kwargs: dict[str, Any], *, model: str) -> list[int]:
    """Chat messages -> prompt token ids: the tokenizer's chat template with the generation prompt
    (``add_generation_prompt=True``) and ``template_kwargs`` (e.g. ``enable_thinking=False``), then
    tokenized without adding special tokens again (the template already has them)."""
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)
    except Exception as exc:  # jinja errors: bad roles, missing content, ...
        raise EngineError(f"chat template of {model!r} failed: {squeeze(exc)}") from exc
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def default_template_kwargs(given: dict[str, Any] | None) -> dict[str, Any]:
    """Chat-template variables outside a Request (the trainer's SFT warm start): ``given`` on top of
    ``enable_thinking=False`` (Qwen3 without thinking, REFERENCE.md §3), so extra variables from an
    engine's ``chat_template_kwargs`` option do not turn thinking back on. Requests go through
    ``template_kwargs_for`` instead."""
    return {"enable_thinking": False, **(given or {})}


def truncate_ids(ids: list[int], limit: int | None, side: str) -> list[int]:
    """``ids`` cut to at most ``limit`` tokens (pure; a new list).

    Sides (REFERENCE.md §2b; the reference's data loader, verl ``truncation=``):

    - ``"left"``: drop the oldest tokens, keep the last ``limit`` (search: 4096).
    - ``"right"``: keep the first ``limit``.
    - ``"middle"``: keep the first ``limit // 2`` and the last ``limit - limit // 2`` tokens (an
      odd limit gives the extra token to the end, as verl does) (math: 8192).

    ``limit=None`` or a prompt that fits returns the ids unchanged. ``limit`` must be >= 1.
    """
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"truncate side must be one of {', '.join(TRUNCATE_SIDES)}, got {side!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"max_prompt_tokens must be a whole number >= 1 (or None for no limit), got {limit!r}")
    n = len(ids)
    if limit is None or n <= limit:
        return list(ids)
    if side == "left":
        return list(ids[n - limit :])
    if side == "right":
        return list(ids[:limit])
    head = limit // 2
    return list(ids[:head]) + list(ids[n - (limit - head) :])


def extra_template_kwargs(given: dict[str, Any] | None, *, kind: str) -> dict[str, Any]:
    """An engine's ``chat_template_kwargs`` option: extra chat-template variables sent with every
    prompt. ``enable_thinking`` is not one of them: it comes from each request's
    ``Sampling.enable_thinking`` (one switch for every engine), so setting it here is an error."""
    got = dict(given or {})
    if "enable_thinking" in got:
        raise EngineError(
            f"{kind} engine: chat_template_kwargs may not set enable_thinking; it comes from the sampling "
            "(eval --enable-thinking, or `enable_thinking: true` in a team file's sampling)"
        )
    return got


def template_kwargs_for(request: Request, extra: dict[str, Any]) -> dict[str, Any]:
    """The chat-template variables of one request: the engine's ``extra`` plus
    ``enable_thinking=request.sampling.enable_thinking`` (off by default; REFERENCE.md §2b)."""
    return {**extra, "enable_thinking": bool(request.sampling.enable_thinking)}


def check_request(request: Request, *, kind: str) -> None:
    """One-line ``EngineError`` for protocol fields no engine can honour: a bad prompt limit or
    truncation side, a ``top_k`` other than -1 (none) or >= 1."""
    try:
        truncate_ids([], request.max_prompt_tokens, request.truncate)
    except ValueError as exc:
        raise EngineError(f"{kind} engine: {exc}") from None
    k = request.sampling.top_k
    if isinstance(k, bool) or not isinstance(k, int) or not (k == -1 or k >= 1):
        raise EngineError(f"{kind} engine: top_k must be -1 (no top-k) or a whole number >= 1, got {k!r}")


def encode_request(tokenizer: Any, request: Request, extra: dict[str, Any], *, model: str, kind: str) -> tuple[list[int], bool]:
    """One request's prompt as the reference builds it: the chat template (with the generation
    prompt and ``enable_thinking`` from the sampling) tokenized, then cut to
    ``request.max_prompt_tokens`` on ``request.truncate``'s side. Returns ``(ids, truncated)``."""
    check_request(request, kind=kind)
    ids = encode_chat(tokenizer, request.messages, template_kwargs_for(request, extra), model=model)
    cut = truncate_ids(ids, request.max_prompt_tokens, request.truncate)
    return cut, len(cut) < len(ids)
