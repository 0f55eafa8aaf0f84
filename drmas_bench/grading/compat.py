"""`reference_compat`: a math grader that follows the reference grader's facts (REFERENCE.md 2b,
last paragraph, and §3), written here from those facts, for reproducing the paper's numbers.

Rules, in order:

1. **Extract** with `extract_boxed_strict`: the last `\\boxed{...}` (balanced braces; innermost
   when nested) in the text after the FIRST `</think>`. `\\fbox{...}` and an unbraced `\\boxed 5`
   give no answer (wrong).
2. **Normalise** both answers (`compat_normalize`): an answer holding `\\text{...}` keeps only that
   first brace group's content (so `5\\text{ cm}` reads as `cm`, `\\text{A} or \\text{B}` as `A`:
   our reading of "`\\text{...}` keeps only the first brace group"); then `$`, `\\left` / `\\right`,
   spacing commands, degree and percent marks and all whitespace are dropped, `\\dfrac` / `\\tfrac`
   become `\\frac`, a trailing `.` goes; a plain number within `INT_TOL` (1e-7) of an integer
   becomes that integer, so every number below 1e-7 in size equals 0 (the reference's known flaw,
   kept here on purpose and nowhere else).
3. **Compare**: equal strings are equal. Otherwise both sides are converted to sympy (the
   project's guarded LaTeX converter, which refuses power towers and huge numbers) and are equal
   when `simplify(a - b) == 0`; two plain numbers are snapped to integers the same way first.
   Guards: answers longer than `MAX_CHARS`, or expressions with more than `MAX_OPS` operations,
   are not compared symbolically (not equal). No structure (lists, tuples, equations) beyond
   what sympy parses: `1,2` and `2,1` differ.

Everything that differs from the careful grader is listed, measured, in docs/grading.md.
"""

from __future__ import annotations

import re

from drmas_bench.grading.extract import _braced

INT_TOL = 1e-7
MAX_CHARS = 1_000
MAX_OPS = 200

_TEXT = re.compile(r"\\text\s*(?=\{)")
_DROP = re.compile(
    r"\\left(?![a-zA-Z])|\\right(?![a-zA-Z])|\\[!,;: ]|\\q?quad(?![a-zA-Z])|\\displaystyle(?![a-zA-Z])"
    r"|\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\%|%|\\\$|\$"
)
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")


def snap_integer(s: str) -> str:
    """A plain number within INT_TOL of an integer -> that integer as a string (`2.00000001` -> `2`,
    `1e-9` -> `0`); anything else unchanged."""
    if not _NUMBER.match(s):
        return s
    try:
        x = float(s)
    except (ValueError, OverflowError):
        return s
    if x != x or abs(x) == float("inf"):
        return s
    r = round(x)
    return str(int(r)) if abs(x - r) <= INT_TOL else s


def compat_normalize(s: str | None) -> str:
    """The reference-style string form of an answer (see the module docstring, rule 2)."""
    if s is None:
        return ""
    s = str(s).strip()
    m = _TEXT.search(s)
    if m is not None:
        group = _braced(s, m.end())
        if group is not None:
            s = group[0]
    s = _DROP.sub("", s)
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    if s.startswith("."):
        s = "0" + s
    return snap_integer(s)


def _number(expr) -> float | None:
    try:
        if expr.free_symbols:
            return None
        v = complex(expr.evalf(30))
    except (TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError):
        return None
    return v.real if v.imag == 0 else None


def compat_equal(extracted: str, gold: str) -> bool:
    """`reference_compat`'s comparison of an extracted answer with the gold (rules 2 and 3)."""
    p, g = compat_normalize(extracted), compat_normalize(gold)
    if not p:
        return False
    if p == g:
        return True
    if len(p) > MAX_CHARS or len(g) > MAX_CHARS:
        return False
    from drmas_bench.grading.math import to_sympy  # the guarded converter (cached per string)

    a, b = to_sympy(p), to_sympy(g)
    if a is None or b is None:
        return False
    import sympy

    va, vb = _number(a), _number(b)
    if va is not None and vb is not None:
        sa, sb = snap_integer(repr(va)), snap_integer(repr(vb))
        if _NUMBER.match(sa) and "." not in sa and "e" not in sa.lower():
            return sa == sb
    try:
        d = a - b
        if sympy.count_ops(d) > MAX_OPS:
            return False
        return sympy.simplify(d) == 0
    except Exception:  # sympy raises many kinds of errors on odd input; unknown means "not equal"
        return False
