"""Grading of the built-in toy suite ("What is a + b?"), registered as the ``toy`` grading family."""

from __future__ import annotations

import re

from drmas_bench.grading.extract import extract_answer_tag
from drmas_bench.suite import Family, register_family

_INT = re.compile(r"[-+]?\d+")


def grade_toy(response: str | None, gold: str) -> bool:
    """True when the answer equals the integer `gold`.

    The answer is the content of the last `<answer>...</answer>` when the response has one
    (its last integer), else the last integer anywhere in the response (`\\boxed{12}` works too)."""
    if not response:
        return False
    tagged = extract_answer_tag(response)
    found = _INT.findall(tagged if tagged is not None else response)
    if not found:
        return False
    try:
        return int(found[-1]) == int(str(gold).strip())
    except ValueError:
        return False


def grade_toy_family(pairs, timeout_s: float, math_grader: str | None) -> list[tuple[bool, dict]]:
    """The toy family: :func:`grade_toy` on each (answer, golds) pair against the first gold."""
    return [(bool(grade_toy(answer or "", golds[0])), {}) for answer, golds in pairs]


register_family("toy", Family(grade_toy_family))
