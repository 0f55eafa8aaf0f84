"""Grading families: which kind of grading a benchmark asks for (``Benchmark.family`` names one).

A family grades finished answers of one kind: ``(final answer or None, gold answers)`` pairs ->
``(correct, extra fields recorded beside it)``. The runner grades each trajectory by its benchmark's
family (a task whose benchmark is not registered, e.g. a trainer's task file: by the workflow's).
Adding a family = one function and one ``FAMILIES`` entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from drmas_bench.grading.pool import grade_math_many
from drmas_bench.grading.qa import grade_qa
from drmas_bench.grading.registry import DEFAULT_GRADER
from drmas_bench.grading.toy import grade_toy


def _math_family(pairs, timeout_s: float, math_grader: str | None) -> list[tuple[bool, dict]]:
    """Math: the boxed answer, by the ``--grader`` (default ``careful``), in a process pool with a hard
    per-item timeout; records the grade status and the extracted answer."""

    results = grade_math_many([(answer or "", golds[0]) for answer, golds in pairs], timeout_s=timeout_s,
                              backend=math_grader or DEFAULT_GRADER)
    return [(bool(r.correct), {"grade": r.status, "extracted": r.extracted}) for r in results]


def _qa_family(pairs, timeout_s: float, math_grader: str | None) -> list[tuple[bool, dict]]:
    """QA: SQuAD exact match against any gold (F1 and cover-EM recorded). No answer at all scores 0,
    as the reference's env does; a gold that normalises to "" (`The The`) is never matched (`grade_qa`)."""

    out = []
    for answer, golds in pairs:
        if answer is None:
            out.append((False, {"em": 0.0, "f1": 0.0, "cover_em": 0.0}))
            continue
        s = grade_qa(answer, golds)
        out.append((bool(s.em), {"em": float(s.em), "f1": float(s.f1), "cover_em": float(s.cover_em)}))
    return out


def _toy_family(pairs, timeout_s: float, math_grader: str | None) -> list[tuple[bool, dict]]:

    return [(bool(grade_toy(answer or "", golds[0])), {}) for answer, golds in pairs]


@dataclass(frozen=True)
class Family:
    """A grading family: ``grade(pairs, timeout_s, math_grader)`` and whether ``--grader`` picks how
    it grades (then the math grader's name and version enter the run's identity)."""

    grade: Callable[..., list[tuple[bool, dict]]]
    takes_grader: bool = False


FAMILIES: dict[str, Family] = {"math": Family(_math_family, takes_grader=True), "qa": Family(_qa_family),
                               "toy": Family(_toy_family)}


def takes_grader(family: str) -> bool:
    """Whether grading family ``family`` (unknown or mixed ones: no) takes ``--grader``."""
    return family in FAMILIES and FAMILIES[family].takes_grader


def grade_family(family: str, pairs, timeout_s: float = 5.0, math_grader: str | None = None) -> list[tuple[bool, dict]]:
    """Grade ``pairs`` ((final answer or None, gold answers), ...) by grading family ``family``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown grading family {family!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[family].grade(pairs, timeout_s, math_grader)
