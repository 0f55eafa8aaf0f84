"""The engine protocol: what every backend (hf, openai, sglang, ...) offers to workflows and pools.

An engine serves ONE model. Workflows call ``await engine.generate([request, ...])`` from as many
coroutines as they like; in-process backends gather concurrent calls into batches (see
``batcher.py``). The pool drives the lifecycle with ``sleep()`` / ``wake()`` / ``is_awake`` /
``footprint_bytes()`` and ends it with ``close()``.

Options are a dataclass per backend (``Engine.Options``); ``parse_options`` turns keyword
arguments into it and rejects unknown keys with an error that names the key.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from drmas_bench.types import Completion, Request, UserError


class EngineError(UserError):
    """An engine could not serve requests (server unreachable after retries, model missing, a
    missing optional dependency). One line, printable as is."""


@runtime_checkable
class Engine(Protocol):
    """The protocol every backend implements.

    - ``generate(requests)``: one ``Completion`` per ``Request``, in order.
    - ``sleep()``: free the accelerator (or host) memory the weights occupy; state needed to come
      back is kept (a path, a host copy).
    - ``wake()``: bring the weights back; ``generate`` works again.
    - ``is_awake``: True between ``wake()`` (or construction) and ``sleep()``.
    - ``footprint_bytes()``: bytes the engine occupies when awake (parameters + buffers for
      in-process backends, 0 for remote ones); constant across sleep/wake, so a pool can budget.
    - ``close()``: release everything (threads, clients, processes). The engine is unusable after.
    """

    name: str  # backend kind, e.g. "hf"
    model: str  # what it was created with (alias, path or hub id)

    async def generate(self, requests: list[Request]) -> list[Completion]: ...

    async def sleep(self) -> None: ...

    async def wake(self) -> None: ...

    @property
    def is_awake(self) -> bool: ...

    def footprint_bytes(self) -> int: ...

    async def close(self) -> None: ...


class EngineBase:
    """Shared plumbing for backends: options parsing and ``async with`` support.

    Subclasses set ``name`` and ``Options`` (a dataclass) and implement the protocol methods.
    """

    name: ClassVar[str] = "base"
    Options: ClassVar[type] = object
    # Traits: what code outside engines/ asks of a backend instead of comparing its name (see
    # engines.traits). A new backend sets the ones that differ from these defaults.
    remote: ClassVar[bool] = False  # the model runs on a server elsewhere: no weights here, nothing to train,
    # no local folder to resolve, check or hash; its worker groups may carry base_url / api_key_env
    process_wide: ClassVar[bool] = False  # process-wide state: hosted in a child process (engines.hosting)
    gpu_memory_fraction: ClassVar[tuple[str, float] | None] = None  # (option, default): a static share of
    # GPU memory it reserves when it starts (the trainer's memory estimate reads it)

    model: str

    async def __aenter__(self) -> "EngineBase":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r})"


def one_line(exc: BaseException | str) -> str:
    """An exception (or text) squeezed onto one line, for ``EngineError`` messages."""
    return " ".join(str(exc).split())


def parse_options(options_cls: type, given: dict[str, Any], *, kind: str) -> Any:
    """Build the options dataclass ``options_cls`` from keyword arguments.

    Keys may use dashes (``max-batch``) or underscores. An unknown key is an ``EngineError`` that
    names it and lists the valid ones.
    """
    names = {f.name for f in dataclasses.fields(options_cls)}
    clean: dict[str, Any] = {}
    for key, value in given.items():
        k = key.replace("-", "_")
        if k not in names:
            raise EngineError(
                f"unknown option {key!r} for engine {kind!r}; valid options: {', '.join(sorted(names))}"
            )
        clean[k] = value
    return options_cls(**clean)


def resolve_model_path(model: str) -> str:
    """Turn a model alias (``tiny-random``), a local folder or a hub id into what
    ``from_pretrained`` accepts, through ``drmas_bench.models.resolve_model`` (its ``UserError``
    names the fix). Without that module, the name is returned unchanged (a path or a hub id)."""
    try:
        from drmas_bench.models import resolve_model
    except ImportError:  # pragma: no cover - only while models.py is being written
        return str(Path(model).expanduser()) if Path(model).expanduser().is_dir() else model
    got = resolve_model(model)
    return str(getattr(got, "path", got))


def encode_chat(tokenizer: Any, messages: list[dict[str, str]], template_kwargs: dict[str, Any], *, model: str) -> list[int]:
    """Chat messages -> prompt token ids: the tokenizer's chat template with the generation prompt
    (``add_generation_prompt=True``) and ``template_kwargs`` (e.g. ``enable_thinking=False``), then
    tokenized without adding special tokens again (the template already has them)."""
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)
    except Exception as exc:  # jinja errors: bad roles, missing content, ...
        raise EngineError(f"chat template of {model!r} failed: {one_line(exc)}") from exc
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def default_template_kwargs(given: dict[str, Any] | None) -> dict[str, Any]:
    """Chat-template variables outside a Request (the trainer's SFT warm start): ``given`` on top of
    ``enable_thinking=False`` (Qwen3 without thinking, REFERENCE.md §3), so extra variables from an
    engine's ``chat_template_kwargs`` option do not turn thinking back on. Requests go through
    ``template_kwargs_for`` instead."""
    return {"enable_thinking": False, **(given or {})}


# ---------------------------------------------------------------------- the prompt protocol (§2b)

TRUNCATE_SIDES = ("left", "middle", "right")


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


def local_tokenizer_dir(name: str) -> Path | None:
    """Where a tokenizer for ``name`` already lies on this machine; never downloads.

    Looks for: a prepared model alias (``tiny-random``, ...), a local folder holding
    ``tokenizer_config.json`` or ``tokenizer.json``, a hub id ``org/name`` whose tokenizer is in the
    Hugging Face cache. ``None`` when there is none.
    """
    from drmas_bench import models

    if name in models.ALIASES:
        return models.alias_path(name) if models.is_prepared(name) else None
    path = Path(name).expanduser()
    if path.is_dir():
        return path if any((path / f).is_file() for f in ("tokenizer_config.json", "tokenizer.json")) else None
    if "/" in name and not path.exists() and name.count("/") == 1 and not name.startswith((".", "/", "~")):
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(name, "tokenizer_config.json")
        except Exception:  # noqa: BLE001 - a malformed id or cache means "not cached"
            return None
        return Path(hit).parent if isinstance(hit, str) else None
    return None
