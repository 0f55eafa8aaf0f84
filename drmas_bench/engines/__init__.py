"""Engines: one protocol (``base.Engine``), several backends, one factory.

    from drmas_bench.engines import make_engine
    engine = make_engine("hf", "tiny-random", max_batch=16)          # in-process transformers
    engine = make_engine("openai", "gpt-4o-mini", base_url="https://.../v1")
    engine = make_engine("sglang", "Qwen/Qwen3-4B", mem_fraction_static=0.5)
    completions = await engine.generate([request, ...])

Adding a backend = one entry in ``ENGINES`` ("module:Class", imported only when asked for) and a
class that implements ``base.Engine`` with an ``Options`` dataclass.
"""

from __future__ import annotations

import importlib
from typing import Any

from drmas_bench.engines.base import Engine, EngineError

ENGINES: dict[str, str] = {
    "hf": "drmas_bench.engines.hf:HFEngine",
    "openai": "drmas_bench.engines.openai:OpenAIEngine",
    "sglang": "drmas_bench.engines.sglang:SGLangEngine",
}


def engine_class(kind: str) -> type:
    """The class registered under ``kind`` (imports its module)."""
    if kind not in ENGINES:
        raise EngineError(f"unknown engine {kind!r}; choose one of: {', '.join(sorted(ENGINES))}")
    module, _, cls = ENGINES[kind].partition(":")
    return getattr(importlib.import_module(module), cls)


def make_engine(kind: str, model: str, **options: Any) -> Engine:
    """Create an engine of backend ``kind`` serving ``model`` (alias, folder or hub id).

    ``options`` are the backend's options (see ``HFOptions``, ``OpenAIOptions``,
    ``SGLangOptions``); an unknown key is an ``EngineError`` naming it.
    """
    return engine_class(kind)(model, **options)


__all__ = ["ENGINES", "Engine", "EngineError", "engine_class", "make_engine"]
