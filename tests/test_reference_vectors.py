"""Parity with the reference's own code, family by family (../shared/reference_vectors, see its
MANIFEST.md). Each test runs our function on every case's input and compares with what the
reference returned; every family must agree 100%. Skipped with a reason where the folder is absent.

Families here: the boxed extraction (math_extract). Protocol rules, the grader and the estimators
have their own modules beside this one (test_reference_vectors_*.py)."""

from __future__ import annotations

import pytest

from conftest import assert_all_agree, load_reference_cases
from drmas_bench.grading.extract import extract_boxed_strict, reference_boxed


@pytest.mark.parametrize("rule,ours", [
    ("math_extract/whole_response", reference_boxed),   # the solver's validity reads this
    ("math_extract/grader", extract_boxed_strict),      # what reference_compat grades
])
def test_math_extract(rule, ours):
    cases = load_reference_cases("math_extract.jsonl", rule)

    def check(c):
        got = ours(c["input"]["response"])
        return got == c["reference"], got

    assert_all_agree(rule, cases, check)
