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
    """Chat-template variables: ``given``, or by default ``enable_thinking=False`` (Qwen3 without
    thinking, REFERENCE.md §3; templates that do not use the variable ignore it)."""
    return {"enable_thinking": False} if given is None else dict(given)
