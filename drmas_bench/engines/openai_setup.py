"""What the ``openai`` engine checks and loads when it is made, before anything is sent: its options
(one-line ``EngineError``s for values that cannot work) and the local prompt tokenizer (or why there is none)."""

from __future__ import annotations

from typing import Any

from drmas_bench.engines.base import EngineError, local_tokenizer_dir
from drmas_bench.engines.openai_wire import OWN_FIELDS, TOP_K_OFF, OpenAIOptions
from drmas_bench.log import squeeze


def load_tokenizer(model: str, o: OpenAIOptions) -> tuple[Any, str]:
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


def check_options(o: OpenAIOptions) -> None:
    """One-line EngineErrors for options that cannot work (before anything is sent)."""
    if o.max_concurrency < 1:
        raise EngineError(f"openai engine: max_concurrency must be >= 1, got {o.max_concurrency}")
    if o.max_retries < 0:
        raise EngineError(f"openai engine: max_retries must be >= 0, got {o.max_retries}")
    clash = sorted(set(o.extra_body or {}) & (set(OWN_FIELDS) | {o.max_tokens_field}))
    if clash:
        raise EngineError(
            f"openai engine: extra_body may not set {', '.join(clash)}: the engine sends them from each "
            "request's sampling (top_k, enable_thinking, seed, ...) and its options (served_model, "
            "chat_template_kwargs, return_token_ids)"
        )
    if o.max_response_chars is not None and o.max_response_chars < 1:
        raise EngineError(f"openai engine: max_response_chars must be >= 1, got {o.max_response_chars}")
    if o.top_k_off not in TOP_K_OFF or isinstance(o.top_k_off, bool):
        raise EngineError(f"openai engine: top_k_off must be auto, -1, 0 or omit, got {o.top_k_off!r}")
