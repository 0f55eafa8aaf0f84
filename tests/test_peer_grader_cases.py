"""Other projects' grader tests as fixtures: Math-Verify's `tests/` and the MATH repository's
`is_equiv` tests, extracted into tests/data/peer_grader_cases/ (see SOURCES.md there). Every
in-scope case is graded by all three graders; careful must have no false positive except where a
suite encodes a convention we chose differently (named in CONVENTIONS and in docs/grading.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drmas_bench.grading import extract_boxed, grade_math_many
from drmas_bench.grading.normalize import normalize_answer, split_top_level

DATA = Path(__file__).parent / "data" / "peer_grader_cases"
SUITES = ("math_verify", "hendrycks_math")


def load(suite: str) -> list[dict]:
    with open(DATA / f"{suite}.jsonl", encoding="utf-8") as f:
        return [c for c in map(json.loads, f) if c["in_scope"]]


def as_pair(case: dict) -> tuple[str, str]:
    """(response, gold) for our graders: the prediction boxed unless it holds a box, the gold's box
    when it has one."""
    pred, gold = case["pred"], case["gold"]
    return (pred if "\\boxed" in pred else "\\boxed{" + pred + "}"), (extract_boxed(gold) if "\\boxed" in gold else gold)


def unordered_list(gold: str, pred: str) -> bool:
    """Our convention: a comma list is a set of answers (MATH's lists are solution sets); the MATH
    suite compares them in order."""
    g, p = (split_top_level(normalize_answer(x), ",") for x in (gold, pred))
    return len(g) > 1 and sorted(g) == sorted(p) and g != p


CONVENTIONS = {"unordered_list": unordered_list}


def _installed(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("suite", SUITES)
def test_careful_has_no_false_positive_on_peer_suites(suite):
    cases = load(suite)
    assert len(cases) > 10
    results = grade_math_many([as_pair(c) for c in cases], timeout_s=5.0, workers=2)
    assert all(r.status == "ok" for r in results)
    false_pos = [c for c, r in zip(cases, results) if r.correct and not c["expected"]]
    unexplained = [(c["gold"], c["pred"]) for c in false_pos
                   if not any(rule(c["gold"], c["pred"]) for rule in CONVENTIONS.values())]
    assert unexplained == []


@pytest.mark.parametrize("grader", ["careful", "reference_compat", "math_verify"])
def test_every_grader_runs_on_every_peer_case(grader):
    """The agreement figures in docs/grading.md come from this grading; a grader that cannot read
    a case records it as an error, never raises."""
    if grader == "math_verify" and not _installed("math_verify"):
        pytest.skip("math-verify not installed")
    cases = [c for s in SUITES for c in load(s)]
    results = grade_math_many([as_pair(c) for c in cases], timeout_s=5.0, workers=2, backend=grader)
    assert len(results) == len(cases) and all(r.status in ("ok", "timeout", "error") for r in results)
    agree = sum(r.correct == c["expected"] for r, c in zip(results, cases))
    assert agree >= {"careful": 115, "reference_compat": 90, "math_verify": 140}[grader]
