"""The search suite's grading family (``qa``): SQuAD exact match of the final answer."""

from __future__ import annotations

from drmas_bench.grading.families import Family, register_family
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


register_family("qa", Family(grade_qa_family))
