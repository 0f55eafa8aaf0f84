"""The math suite's grading family (``math``): the boxed answer, by the run's ``--grader``."""

from __future__ import annotations

from drmas_bench.grading.families import Family, register_family
from drmas_bench.grading.graders import DEFAULT_GRADER
from drmas_bench.grading.grading_workers import grade_math_many


def grade_math_family(pairs, timeout_s: float, math_grader: str | None) -> list[tuple[bool, dict]]:
    """Math: the boxed answer, by the ``--grader`` (default ``careful``), in a process pool with a hard
    per-item timeout; records the grade status and the extracted answer."""

    results = grade_math_many([(answer or "", golds[0]) for answer, golds in pairs], timeout_s=timeout_s,
                              backend=math_grader or DEFAULT_GRADER)
    return [(bool(r.correct), {"grade": r.status, "extracted": r.extracted}) for r in results]


register_family("math", Family(grade_math_family, takes_grader=True))
