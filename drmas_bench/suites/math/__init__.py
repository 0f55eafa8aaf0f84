"""The math suite (REFERENCE.md §3): AIME, AMC, MATH-500, ... graded by the boxed answer; the
math_refine (solver <-> verifier) and math_single workflows."""
