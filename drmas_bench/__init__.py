"""drmas-bench: evaluate and train teams of LLM agents.

Layout (docs/architecture.md): suites/ (one folder per suite: benchmarks, workflows, format rules,
grading family, prompts; found by ``suites.discovery``, outside ones through ``$DRMAS_SUITES`` or the
``drmas_bench.suites`` entry point), ``suite`` (the one module a suite's author imports),
``registry`` (the one Registry type), tasks/ (benchmarks: loading and selecting), workflows/ (the
Episode API, format rules, the protocol every suite shares), engines/ (hf, openai, sglang), pool/
(who is awake), grading/, metrics.py, pricing.py, run_dir.py (run folders), api.py (the library
entry point: evaluate, EvalConfig), cli.py and commands/ (the CLI). The trainer lives in
``drmas_trainer``, retrieval in ``drmas_retrieval``.

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
