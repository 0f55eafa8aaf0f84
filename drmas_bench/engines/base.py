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

from drmas_bench import models
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
    output_neutral_options: ClassVar[tuple[str, ...]] = ()  # options that never change a completion (batching,
    # timeouts, sleep, secrets): left out of the call cache's key (drmas_bench.call_cache); every other option is in it

    @classmethod
    def neutral_options(cls, options: dict[str, Any]) -> tuple[str, ...]:
        """The options that cannot change a completion given the others (``options``: every option,
        resolved). The default: ``output_neutral_options``; a backend whose batching shapes its
        completions in one mode and not in another says so (the hf engine's padded batch)."""
        return cls.output_neutral_options

    @classmethod
    def resolved_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` as they will act in this process (an ``"auto"`` replaced by what it means here),
        for the call cache's key. The default: unchanged. A backend whose "auto" depends on the machine
        (the hf engine's device and dtype) says what it resolves to."""
        return dict(options)
    serves_adapters: ClassVar[bool] = False  # serves LoRA adapter folders (drmas_bench.models.adapters), the
    # request's agent choosing the adapter, and takes adapter updates: update_adapter(name, config, tensors)

    # options that decide which requests share a forward pass (not what any one request asks for): a run
    # may resume or split under other values of them only where the engine is batch-invariant (run_dir)
    batching_options: ClassVar[tuple[str, ...]] = ("max_batch", "max_wait_ms")

    model: str

    @classmethod
    def declared_determinism(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Whether an engine of this kind started with ``options`` gives a request the same tokens and
        log-probs whatever shares its batch, known before it starts (a resume is checked with it):
        ``{"batch_invariant": bool, "why": str, "dtype": str}``. The default knows nothing; a backend
        that can say more overrides it (and ``determinism``)."""
        dtype = options.get("dtype")
        return {"batch_invariant": False, "why": "unknown for this engine", "dtype": str(dtype) if dtype else "unknown"}

    def determinism(self) -> dict[str, Any]:
        """``declared_determinism`` of this engine's options, as it runs (a server engine adds what it
        saw: ``fingerprints``). Every run's summary states it per worker group (drmas_bench.reproducibility)."""
        opts = getattr(self, "options", None)
        given = dataclasses.asdict(opts) if dataclasses.is_dataclass(opts) and not isinstance(opts, type) else {}
        return type(self).declared_determinism(type(self).resolved_options(given))

    async def __aenter__(self) -> "EngineBase":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r})"


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
    names the fix)."""
    got = models.resolve_model(model)
    return str(getattr(got, "path", got))


def local_tokenizer_dir(name: str) -> Path | None:
    """Where a tokenizer for ``name`` already lies on this machine; never downloads.

    Looks for: a prepared model alias (``tiny-random``, ...), a local folder holding
    ``tokenizer_config.json`` or ``tokenizer.json``, a hub id ``org/name`` whose tokenizer is in the
    Hugging Face cache. ``None`` when there is none.
    """

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
