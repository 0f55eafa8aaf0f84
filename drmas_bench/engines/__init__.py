"""Engines: one protocol (``base.Engine``), several backends, one factory.

    from drmas_bench.engines import make_engine
    engine = make_engine("hf", "tiny-random", max_batch=16)          # in-process transformers
    engine = make_engine("openai", "gpt-4o-mini", base_url="https://.../v1")
    engine = make_engine("sglang", "Qwen/Qwen3-4B", mem_fraction_static=0.5)
    completions = await engine.generate([request, ...])

Adding a backend = one entry in ``ENGINES`` (a lazy "module:Class", imported only when asked for) and a
class that implements ``base.Engine`` with an ``Options`` dataclass and declares its traits
(``base.EngineBase``: ``remote``, ``process_wide``, ``gpu_memory_fraction``, ``serves_adapters``). Code outside this
package asks :func:`traits` or the options (``hosting.option_names``), never an engine's name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from drmas_bench.engines.base import Engine, EngineError, parse_options
from drmas_bench.registry import Registry

ENGINES: Registry[type] = Registry("engine", error=EngineError)
ENGINES.register("hf", "drmas_bench.engines.hf:HFEngine")
ENGINES.register("openai", "drmas_bench.engines.openai:OpenAIEngine")
ENGINES.register("sglang", "drmas_bench.engines.sglang:SGLangEngine")


def engine_class(kind: str) -> type:
    """The class registered under ``kind`` (imports its module); an unknown kind is an EngineError."""
    return ENGINES.get(kind)


DEFAULT_ENGINE = "hf"  # what a worker group runs on when nothing names an engine


@dataclass(frozen=True)
class Traits:
    """What the rest of the program may know about a backend (its class attributes; defaults for a
    class that does not set them, see ``base.EngineBase``)."""

    remote: bool
    process_wide: bool
    gpu_memory_fraction: tuple[str, float] | None
    serves_adapters: bool = False


def traits(kind: str) -> Traits:
    """Backend ``kind``'s traits (imports its module); an unknown kind is an EngineError."""
    cls = engine_class(kind)
    return Traits(bool(getattr(cls, "remote", False)), bool(getattr(cls, "process_wide", False)),
                  getattr(cls, "gpu_memory_fraction", None), bool(getattr(cls, "serves_adapters", False)))


def output_options(kind: str, options: dict[str, Any], *, here: bool = True) -> dict[str, Any]:
    """The options of a ``kind`` engine that can change its completions, for the call cache's key:
    every option (its default where not given, so "not set" and "set to the default" are one call)
    but those the backend calls neutral given the rest (``neutral_options``). ``here``: the engine
    runs in this process (or on this machine), so an ``"auto"`` is resolved as it will act
    (``resolved_options``); engines on other nodes (a Ray pool) keep ``"auto"`` as written. An
    unknown option is an EngineError."""

    cls = engine_class(kind)
    full = dataclasses.asdict(parse_options(cls.Options, dict(options), kind=kind))
    if here:
        full = cls.resolved_options(full)
    neutral = set(cls.neutral_options(full))
    return {k: v for k, v in sorted(full.items()) if k not in neutral}


def make_engine(kind: str, model: str, **options: Any) -> Engine:
    """Create an engine of backend ``kind`` serving ``model`` (alias, folder or hub id).

    ``options`` are the backend's options (see ``HFOptions``, ``OpenAIOptions``,
    ``SGLangOptions``); an unknown key is an ``EngineError`` naming it.
    """
    return engine_class(kind)(model, **options)


__all__ = ["DEFAULT_ENGINE", "ENGINES", "Engine", "EngineError", "Traits", "engine_class", "make_engine", "output_options", "traits"]
