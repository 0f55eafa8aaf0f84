"""The grading families a suite may reuse as they are: `QA` (SQuAD exact match of the final answer)
and `MATH` (the boxed answer, by the run's ``--grader``). The search suite registers `QA` as ``qa``,
the math suite `MATH` as ``math`` (their ``grading.py``); a suite of one's own registers either under
its own name, or writes its own `families.Family` (``drmas_bench.suite`` exports all three)."""

from __future__ import annotations

from drmas_bench.grading.families import Family
from drmas_bench.grading.graders import DEFAULT_GRADER
from drmas_bench.grading.grading_workers import grade_math_many
from drmas_bench.grading.qa import grade_qa


def grade_qa_family(pairs, timeout_s: float, math_grader: str | None) -> list[tuple[bool, dict]]:
    """QA: SQuAD exact match against any gold (F1 and cover-EM recorded). No answer at all scores 0,
    as the reference's env does; a gold that normalises to "" (`The The`, `!!!`) is matched by its
    spelling only (`grade_qa`)."""

    out = []
    for answer, golds in pairs:
        if answer is None:
            out.append((False, {"em": 0.0, "f1": 0.0, "cover_em": 0.0}))
            continue
        s = grade_qa(answer, golds)
        out.append((bool(s.em), {"em": float(s.em), "f1": float(s.f1), "cover_em": float(s.cover_em)}))
    return out


def grade_math_family(pairs, timeout_s: float, math_grader: str | None) -> list[tuple[bool, dict]]:
    """Math: the boxed answer, by the ``--grader`` (default ``careful``), in a process pool with a hard
    per-item timeout; records the grade status and the extracted answer."""

    results = grade_math_many([(answer or "", golds[0]) for answer, golds in pairs], timeout_s=timeout_s,
                              backend=math_grader or DEFAULT_GRADER)
    return [(bool(r.correct), {"grade": r.status, "extracted": r.extracted}) for r in results]


QA = Family(grade_qa_family)
MATH = Family(grade_math_family, takes_grader=True)
