"""Grading families: which kind of grading a benchmark asks for (``Benchmark.family`` names one).

A family grades finished answers of one kind: ``(final answer or None, gold answers)`` pairs ->
``(correct, extra fields recorded beside it)``. The runner grades each trajectory by its benchmark's
family (a task whose benchmark is not registered, e.g. a trainer's task file: by the workflow's).
Each suite registers its family in its own folder (``register_family``, when the suite is
discovered: ``drmas_bench/suites/<suite>/``); the grading functions they call live in ``grading/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from drmas_bench.registry import Registry
from drmas_bench.suites.discovery import discover


@dataclass(frozen=True)
class Family:
    """A grading family: ``grade(pairs, timeout_s, math_grader)`` and whether ``--grader`` picks how
    it grades (then the math grader's name and version enter the run's identity)."""

    grade: Callable[..., list[tuple[bool, dict]]]
    takes_grader: bool = False


FAMILIES: Registry[Family] = Registry("grading family", filled_by_suites=True)


def register_family(name: str, family: Family) -> Family:
    """Register grading family ``name`` (a suite's ``grading.py`` does, once)."""
    FAMILIES.register(name, family)
    return family


def takes_grader(family: str) -> bool:
    """Whether grading family ``family`` (unknown or mixed ones: no) takes ``--grader``."""
    discover()
    return family in FAMILIES and FAMILIES.get(family).takes_grader


def grade_family(family: str, pairs, timeout_s: float = 5.0, math_grader: str | None = None) -> list[tuple[bool, dict]]:
    """Grade ``pairs`` ((final answer or None, gold answers), ...) by grading family ``family``."""
    discover()
    return FAMILIES.get(family).grade(pairs, timeout_s, math_grader)
