"""Parity of `reference_compat` with the reference's math grader (RewardMathFn) on every
`math_grade` reference vector (../shared/reference_vectors/math_grade.jsonl, see its MANIFEST.md):
24,340 (gold, response) pairs from the math benchmarks' golds under many perturbations, each with
the reference's `is_correct`. Every case must agree; skipped with a reason where the folder is absent.

Graded the way runs grade: through the process pool with its per-item timeout, so a timeout is a
failure here (the reference has none). About 5 s on two cores."""

from __future__ import annotations

from collections import Counter

from conftest import assert_all_agree, load_reference_cases
from drmas_bench.grading import grade_math_many


def test_math_grade_reference_compat():
    cases = load_reference_cases("math_grade.jsonl", "math_grade")
    results = grade_math_many([(c["input"]["response"], c["input"]["gold"]) for c in cases],
                              timeout_s=60.0, backend="reference_compat")
    got = {id(c): r for c, r in zip(cases, results)}

    def check(c):
        r = got[id(c)]
        return r.status == "ok" and r.correct is c["reference"], (r.correct, r.status, r.extracted)

    kinds = Counter(c["input"]["kind"] for c in cases)
    assert len(kinds) > 50 and kinds["self"] > 1000  # the whole file, every perturbation kind
    assert_all_agree("math_grade (reference_compat vs RewardMathFn)", cases, check)
