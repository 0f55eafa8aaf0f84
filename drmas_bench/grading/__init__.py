"""Grading: pure functions that score answers (DESIGN.md, "grading/").

- math: `GRADERS` (the registry of math graders: careful [default], reference_compat,
  math_verify; name + version), `extract_boxed`, `has_boxed_answer` (REFERENCE 2b solver
  validity), `grade_math`, `grade_math_many` (a process pool with a hard per-item timeout) ->
  `GradeResult`;
- QA: `grade_qa` -> `QAScore(em, f1, cover_em)`, `extract_answer_tag`, `normalize_qa`;
- toy: `grade_toy`.
"""

from drmas_bench.grading.extract import extract_answer_tag, extract_boxed, extract_boxed_strict, has_boxed_answer  # noqa: F401
from drmas_bench.grading.math import answers_equal, grade_math  # noqa: F401
from drmas_bench.grading.normalize import normalize_answer  # noqa: F401
from drmas_bench.grading.pool import (  # noqa: F401
    GradeResult,
    GradingPool,
    grade_math_many,
    grade_one,
    shutdown_shared_pools,
)
from drmas_bench.grading.qa import QAScore, grade_qa, normalize_qa  # noqa: F401
from drmas_bench.grading.registry import DEFAULT_GRADER, GRADERS, MathGrader, get_grader  # noqa: F401
from drmas_bench.grading.toy import grade_toy  # noqa: F401
