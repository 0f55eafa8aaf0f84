"""Grading: pure functions that score answers (DESIGN.md, "grading/").

- math: `GRADERS` (the registry of math graders: careful [default], reference_compat,
  math_verify; name + version), `extract_boxed`, `has_boxed_answer` (REFERENCE 2b solver
  validity), `grade_math`, `grade_math_many` (a process pool with a hard per-item timeout) ->
  `GradeResult`;
- QA: `grade_qa` -> `QAScore(em, f1, cover_em)`, `extract_answer_tag`, `normalize_qa`;
- families: `FAMILIES` (each suite registers its own, `register_family`), `grade_family`.

Names are imported on first use (PEP 562), so `drmas_bench.grading.graders` (the CLI's `--grader`
choices) loads without sympy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "extract": ("extract_answer_tag", "extract_boxed", "extract_boxed_strict", "has_boxed_answer",
                "reference_boxed", "reference_graded_text"),
    "math": ("answers_equal",),
    "normalize": ("normalize_answer",),
    "grade_worker": ("GradeResult", "grade_one"),
    "grading_workers": ("GradingPool", "grade_math_many", "shutdown_shared_pools"),
    "qa": ("QAScore", "grade_qa", "normalize_qa"),
    "families": ("FAMILIES", "Family", "grade_family", "register_family", "takes_grader"),
    "graders": ("DEFAULT_GRADER", "GRADERS", "MathGrader", "get_grader", "grade_math"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
