"""Grading: pure functions that score answers (DESIGN.md, "grading/").

- math: `extract_boxed`, `grade_math` (reference rules or math-verify), `grade_math_many` (a process
  pool with a hard per-item timeout) -> `GradeResult`;
- QA: `grade_qa` -> `QAScore(em, f1, cover_em)`, `extract_answer_tag`, `normalize_qa`;
- toy: `grade_toy`.
"""

from drmas_bench.grading.extract import extract_answer_tag, extract_boxed  # noqa: F401
from drmas_bench.grading.math import BACKENDS, answers_equal, grade_math  # noqa: F401
from drmas_bench.grading.normalize import normalize_answer  # noqa: F401
from drmas_bench.grading.pool import (  # noqa: F401
    GradeResult,
    GradingPool,
    grade_math_many,
    grade_one,
    shutdown_shared_pools,
)
from drmas_bench.grading.qa import QAScore, grade_qa, normalize_qa  # noqa: F401
from drmas_bench.grading.toy import grade_toy  # noqa: F401
