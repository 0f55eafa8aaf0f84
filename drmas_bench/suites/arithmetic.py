"""Warm-start arithmetic the toy suite's and the math suite's example makers share ("What is a + b?"
questions and near-miss answers): beside the suites, a module and not a suite, so that no suite
imports another."""

from __future__ import annotations

import random


def near_miss(rng: random.Random, right: int, avoid: int | None = None) -> int:
    """right + a nonzero offset in -3..3, never negative, never `avoid`."""
    while True:
        v = right + rng.choice((-3, -2, -1, 1, 2, 3))
        if v >= 0 and v != avoid:
            return v


def sum_question(rng: random.Random, max_operand: int) -> tuple[str, int]:
    """A warm-start question "What is a + b?" with operands from 0..max_operand, and its sum."""
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    return f"What is {a} + {b}?", a + b
