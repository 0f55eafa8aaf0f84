"""The math grader registry: the one place that names math graders (`--grader` choices come from it).

A `MathGrader` is a name, a version, an extraction function (response -> answer or None) and a
comparison (extracted answer, gold) -> bool. The name and version go into a run's identity and its
summary, so a resumed run never mixes grades of two graders.

Graders:

- `careful` (default): our own grader (`drmas_bench.grading.math`): lenient extraction (last box,
  innermost when nested, `\\fbox` and `\\boxed 5` accepted, after the last `</think>`), careful
  normalisation, structural comparison of lists, tuples, intervals, matrices and equations, exact
  numbers, sympy with sample points and guards. Called `reference` before version 2; that name is
  refused with a pointer, since it was never the reference's grader.
- `reference_compat`: the reference's grader, RewardMathFn (`drmas_bench.grading.compat`), rule by
  rule with its flaws (REFERENCE.md 2b); it agrees with it on every `math_grade` reference vector.
- `math_verify`: the math-verify package (extra `mathverify`) on the careful extraction.

Adding a grader = one `register(MathGrader(...))` call.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import Callable

from drmas_bench.grading.compat import compat_equal
from drmas_bench.grading.extract import extract_boxed, extract_boxed_strict
from drmas_bench.registry import Registry

DEFAULT_GRADER = "careful"
# names that once meant something else: refused with this hint rather than silently remapped
RENAMED = {"reference": "the old default `reference` is now called `careful`; "
                        "the reference grader's own rules are `reference_compat`"}


@dataclass(frozen=True)
class MathGrader:
    """name: registry key; version: bumped whenever a grade may change; equal(extracted, gold);
    extract(response) -> answer or None; about: one line for --help and docs; grades_blank: a blank
    answer (`\\boxed{}`) still goes to `equal` (otherwise it is wrong without asking)."""

    name: str
    version: str
    equal: Callable[[str, str], bool]
    extract: Callable[[str | None], str | None] = extract_boxed
    about: str = ""
    grades_blank: bool = False

    def identity(self) -> dict[str, str]:
        """What a run records: {"name", "version"}."""
        return {"name": self.name, "version": self.version}


GRADERS: Registry[MathGrader] = Registry("math grader", hints=RENAMED)


def register(grader: MathGrader) -> MathGrader:
    """Register a math grader under its name."""
    GRADERS.register(grader.name, grader)
    return grader


def get_grader(name: str) -> MathGrader:
    """The registered grader called `name`; a UserError naming the known ones otherwise."""
    return GRADERS.get(name)


def _math() -> ModuleType:
    """`drmas_bench.grading.math`, imported on the first careful or math_verify grade: it loads
    sympy, which only the math graders need."""
    from drmas_bench.grading import math

    return math


def _careful(extracted: str, gold: str) -> bool:
    return bool(_math().answers_equal(gold, extracted))


def _compat(extracted: str, gold: str) -> bool:
    return compat_equal(extracted, gold)


def _math_verify(extracted: str, gold: str) -> bool:
    return bool(_math().math_verify_equal(extracted, gold))


def _dist_version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "missing"


# careful v3: a value beyond float range no longer counts as close to anything (v2 said such answers
# were equal)
# careful v4: complex infinity / nan equal nothing; times of day compared as times; thousands only in
# valid groups without spaces; a gold's label may be dropped; an equation stays an equation; inequalities
# compared as relations; bare unit words and \textbf/\textnormal unit groups dropped; and/or lists and
# bare-brace sets read as sets
register(MathGrader("careful", "4", _careful, extract_boxed,
                    "our careful grader (default): structure-aware, exact numbers, guarded sympy"))
# v2: the rules of REFERENCE.md 2b as rewritten from the reference's code (mathd and sympy forms,
# tuples, integer and fraction rules); v1 followed an earlier, looser restatement
register(MathGrader("reference_compat", "2", _compat, extract_boxed_strict,
                    "the reference grader (RewardMathFn), flaws included (REFERENCE.md 2b)",
                    grades_blank=True))
# math_verify v2: `\\$` in an answer is dropped whole (v1 left its backslash, so `\\$10` was never right)
register(MathGrader("math_verify", f"2+math-verify-{_dist_version('math-verify')}", _math_verify, extract_boxed,
                    "the math-verify package on the careful extraction (extra: mathverify)"))


# ---------------------------------------------------------------- the front door: grade one response


def resolve_backend(backend: str | Callable[[str, str], bool]):
    """A grader name -> (extract, equal) of the registered grader; a callable (extracted, gold) ->
    bool -> (the careful extraction, that callable). Unknown names are UserErrors."""
    if callable(backend):
        return extract_boxed, backend
    g = get_grader(backend)
    return g.extract, g.equal


def no_answer(extracted: str | None, backend: str | Callable[[str, str], bool]) -> bool:
    """Nothing to grade: no answer, or a blank one (`\\boxed{ }`). A grader whose `grades_blank` is
    set (reference_compat: the reference grades a blank box too) is given the blank answer."""
    if extracted is None:
        return True
    if extracted.strip():
        return False
    if callable(backend):
        return True
    return not get_grader(backend).grades_blank


def get_backend(backend: str | Callable[[str, str], bool]) -> Callable[[str, str], bool]:
    """A grader name (see `registry.GRADERS`) -> its comparison `(extracted answer, gold) -> bool`.

    A callable is returned as is: it is given the extracted answer and the gold answer."""
    return resolve_backend(backend)[1]


def extract_for(response: str | None, backend: str | Callable[[str, str], bool]):
    """The one extract-then-compare rule, first half: ``(extracted answer, comparison)``, the
    comparison ``None`` when there is nothing to grade (:func:`no_answer`: wrong without asking).
    :func:`grade_math` and ``grading.grade_worker.grade_one`` both start here."""
    extract, equal = resolve_backend(backend)
    extracted = extract(response)
    return extracted, (None if no_answer(extracted, backend) else equal)


def grade_math(response: str, gold: str, backend: str | Callable[[str, str], bool] = "careful") -> bool:
    """True when the answer extracted from `response` equals `gold` (see the module docstring).

    `backend`: "careful" (default) | "reference_compat" | "math_verify" | a function
    (extracted answer, gold) -> bool (given the careful extraction). No answer means False. Runs in
    this process with no timeout: batch grading of untrusted output belongs in `grade_math_many`."""
    extracted, equal = extract_for(response, backend)
    return equal is not None and bool(equal(extracted, gold))
