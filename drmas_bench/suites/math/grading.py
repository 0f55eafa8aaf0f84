"""The math suite's grading family (``math``): the boxed answer, by the run's ``--grader``
(`grading.standard.MATH`)."""

from __future__ import annotations

from drmas_bench.suite import MATH_FAMILY, register_family

register_family("math", MATH_FAMILY)
