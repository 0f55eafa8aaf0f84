"""drmas-bench: evaluate and train teams of LLM agents.

Layout (DESIGN.md): tasks/ (benchmark registry), workflows/ (multi-agent episodes as async code),
engines/ (hf, openai, sglang), pool/ (who is awake), grading/, metrics.py, pricing.py, store.py,
api.py (the library entry point: evaluate, EvalConfig), commands/ (the CLI). The trainer lives in ``drmas_trainer``,
retrieval in ``drmas_retrieval``.

    from drmas_bench import evaluate, EvalConfig
    summary = evaluate(EvalConfig(model="tiny-random", suite="toy", n=2, limit=3))

``evaluate``, ``EvalConfig`` and ``Summary`` are imported on first use, so ``import drmas_bench``
stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {"evaluate": "drmas_bench.api", "EvalConfig": "drmas_bench.api", "Summary": "drmas_bench.api"}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'drmas_bench' has no attribute {name!r}")
