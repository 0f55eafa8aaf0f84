"""`reference_compat`: the reference's math grader (RewardMathFn, REFERENCE.md 2b "Reference math
grader"), rule by rule, flaws included, so that the paper's numbers can be reproduced here.

Written here from those rules and checked on every `math_grade` reference vector
(tests/test_reference_vectors_grading.py). The careful grader (`grading/math.py`) is the default and
fixes these flaws knowingly; docs/grading.md measures where the two differ and who is right.

What a grade is, in order:

1. The answer: `extract_boxed_strict` (empty response, no box, a box only before the first
   `</think>`, or an unbraced last `\\boxed` -> no answer, wrong).
2. The gold: as text; a gold holding `\\boxed` is replaced by its own `reference_boxed` extraction,
   and when that fails there is no gold (wrong).
3. Right when the two **mathd forms** (`mathd_form`) are equal, or when `sympy_equal` says so on
   the two **sympy forms** (`sympy_form`): equal strings; else tuples split into elements compared
   in order, where two integer fractions must be written alike, an integer never equals a
   non-integer form, and anything else is right when sympy simplifies gold - answer to 0 (unless a
   guard refuses: more than two distinct letters, `^{`, `^(`, `^n^`, or `^nn`).

Several steps are odd on purpose, because the reference does them: unit words vanish inside other
words (`Monday` -> `Mon`), Python floats within 1e-7 of an integer become it (`1e-8` equals 0),
`3\\,159` reads as `3+159`, `x = 5` and `ab=5` read as `5`, a string with two `\\text{ ` is left
as it is by mathd, `\\frac{28}{6}` is not `\\frac{14}{3}`. Python's own `float`/`int` parsing
decides what counts as a number, as in the reference (`1_000`, `inf`, surrounding whitespace).

The LaTeX-to-text step is pylatexenc 2.10's `LatexNodes2Text` (a dependency pinned to that version:
another version may write some macros differently). The sympy step may run long or hang on hostile
input; batch grading goes through `grade_math_many`, whose per-item timeout records such an item as
`status="timeout"`, graded wrong (the reference has no timeout and would wait for sympy's answer).
"""

from __future__ import annotations

import re
from functools import lru_cache

from drmas_bench.grading.extract import reference_boxed

INT_TOL = 1e-7  # a float this close to an integer is that integer (the reference's tolerance)
UNIT_WORDS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day",
              "week", "month", "year", "foot", "feet", "inch", "yard")  # removed in this order

# a leading \text{...}: its content up to the first `}` (`.` does not cross a newline)
_LEADING_TEXT = re.compile(r"^\\text\{(.+?)\}")
_UNIT_RES = tuple(re.compile(w + r"(es)?(s)? *(\^[0-9]+)?") for w in UNIT_WORDS)
_CIRC = re.compile(r"\^ *\\circ")
_COMMA_BANG = re.compile(r",\\! *")
_MINUS_SPACES = re.compile(r"- *")
_DIGIT_SPACE_DIGIT = re.compile(r"([0-9]) +([0-9])")  # non-overlapping: `1 2 3` -> `1+2 3`
_THOUSANDS = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_INT_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_POWER_GUARDS = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_TUPLE_CHARS = "()[]"
_TEXT_SYMBOLS = (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*"))


# ---------------------------------------------------------------------------------- mathd form


class _GiveUp(Exception):
    """mathd normalisation stops; the answer is compared as it was after the `\\text{` step."""


def _leading_text(s: str) -> str | None:
    m = _LEADING_TEXT.search(s)
    return None if m is None else m.group(1)


def _brace_sqrt(s: str) -> str:
    """`\\sqrt3` -> `\\sqrt{3}` (one character braced); `\\sqrt` with nothing after it gives up."""
    head, *rest = s.split("\\sqrt")
    out = [head]
    for piece in rest:
        if not piece:
            raise _GiveUp
        out.append("\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:]))
    return "".join(out)


def _brace_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`. A `\\frac` with nothing
    after it gives up; one followed by a single character leaves the whole string unchanged."""
    head, *rest = s.split("\\frac")
    out = [head]
    for piece in rest:
        if not piece:
            raise _GiveUp
        if piece[0] == "{":
            out.append("\\frac" + piece)
        elif len(piece) < 2:
            return s
        elif piece[1] != "{":
            out.append("\\frac{" + piece[0] + "}{" + piece[1] + "}" + piece[2:])
        else:
            out.append("\\frac{" + piece[0] + "}" + piece[1:])
    return "".join(out)


def _slash_to_frac(s: str) -> str:
    """`a/b` of two integers, written as Python writes them, -> `\\frac{a}{b}`."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _mathd_steps(s: str) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    for gone in ("\\left", "\\right", "^{\\circ}", "^\\circ", "\\$"):
        s = s.replace(gone, "")
    units = s.count("\\text{ ")
    if units > 1:
        raise _GiveUp
    if units == 1:
        s = s.split("\\text{ ")[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    if "\\sqrt" in s:
        s = _brace_sqrt(s)
    s = _brace_fracs(s.replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


@lru_cache(maxsize=65536)
def mathd_form(answer: str) -> str:
    """The mathd (Hendrycks MATH) normal form the reference compares first."""
    s = answer.strip()
    text = _leading_text(s)
    if text is not None:
        s = text.strip()
    try:
        return _mathd_steps(s)
    except _GiveUp:
        return s


# ---------------------------------------------------------------------------------- sympy form


def _float_or_none(s: str) -> float | None:
    """Python's float() of `s` (which accepts `1_0`, ` 5 `, `inf`, `1e-8`), or None."""
    try:
        return float(s)
    except ValueError:
        return None


def _near_int(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= INT_TOL
    except (OverflowError, ValueError):  # inf, nan
        return False


def _drop_thousands_commas(s: str) -> str:
    """Remove `,` between a digit and three digits that end the string or meet a non-digit,
    repeatedly (`1,000,000` -> `1000000`; `(2,251,252)` -> `(2251252)`)."""
    while True:
        nxt = _THOUSANDS.sub(r"\1\3\4", s)
        if nxt == s:
            return s
        s = nxt


def _is_int_text(s: str) -> bool:
    x = _float_or_none(_drop_thousands_commas(s))
    return x is not None and _near_int(x)


@lru_cache(maxsize=1)
def _latex_to_text_converter():
    from pylatexenc.latex2text import LatexNodes2Text

    return LatexNodes2Text()


def _latex_to_text(s: str) -> str:
    s = s.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    s = _latex_to_text_converter().latex_to_text(s)
    for sym, word in _TEXT_SYMBOLS:
        s = s.replace(sym, word)
    return s.strip()


@lru_cache(maxsize=65536)
def sympy_form(answer: str) -> str:
    """The string the reference's sympy path compares (REFERENCE.md 2b, "sympy normalisation")."""
    s = answer
    text = _leading_text(s)
    if text is not None:
        s = text
    s = s.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    s = s.replace(" or ", " , ").replace(" and ", " , ")
    s = s.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _UNIT_RES:
        s = unit.sub("", s)
    s = _CIRC.sub("", s)
    if s and s[0] == "{" and s[-1] == "}":
        s = s[1:-1]
    s = _COMMA_BANG.sub("", s)
    x = _float_or_none(s)
    if x is not None and _near_int(x):
        s = str(int(round(x)))
    if "\\" in s:
        try:
            s = _latex_to_text(s)
        except Exception:  # pylatexenc failing on odd input: the reference keeps the string
            pass
    s = _MINUS_SPACES.sub("-", s)
    s = _DIGIT_SPACE_DIGIT.sub(r"\1+\2", s)
    s = s.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _is_int_text(s):
        s = str(int(float(s.replace(",", ""))))  # int() truncates, as the reference does
    return s


# ---------------------------------------------------------------------------------- comparison


def _elements(s: str) -> list[str]:
    """A bracketed tuple/interval (longer than 2, no bracket inside) -> its comma-separated
    elements, after thousands commas are dropped; anything else -> [s] ([] when empty)."""
    s = _drop_thousands_commas(s)
    if not s:
        return []
    if (len(s) > 2 and s[0] in _TUPLE_CHARS and s[-1] in _TUPLE_CHARS
            and not any(ch in s[1:-1] for ch in _TUPLE_CHARS)):
        return [e.strip() for e in s[1:-1].split(",")]
    return [s]


def _sympy_allowed(expr: str) -> bool:
    """The reference's guards against slow or meaningless sympy calls."""
    letters = {ch for ch in expr.replace("sqrt", "").replace("frac", "") if ch.isalpha()}
    if len(letters) > 2 or "^{" in expr or "^(" in expr:
        return False
    return not any(g.search(expr) for g in _POWER_GUARDS)


def _sympy_zero(gold: str, answer: str) -> bool:
    """sympy simplifies (gold)-(answer) to 0. Parsing is sympy's parse_expr (which evaluates
    Python), kept safe by the guard's two-letter limit; any error means not equal."""
    expr = f"({gold})-({answer})"
    if not _sympy_allowed(expr):
        return False
    try:
        import sympy
        from sympy.parsing import sympy_parser as sp

        parsed = sp.parse_expr(expr.replace("^", "**"), transformations=(
            sp.standard_transformations + (sp.implicit_multiplication_application,)))
        return bool(sympy.simplify(parsed) == 0)
    except Exception:  # sympy raises many kinds of errors on odd input; the reference says "not equal"
        return False


def _element_equal(gold: str, answer: str) -> bool:
    if _INT_FRACTION.search(gold) and _INT_FRACTION.search(answer):
        return gold == answer  # unreduced fractions are not accepted
    if _is_int_text(gold) != _is_int_text(answer):
        return False
    return _sympy_zero(gold, answer)


def sympy_equal(answer: str, gold: str) -> bool:
    """The reference's sympy-path verdict on two raw answers."""
    g, a = sympy_form(gold), sympy_form(answer)
    if g == a:
        return True
    if not a:
        return False
    g_elems, a_elems = _elements(g), _elements(a)
    if len(g_elems) > 1 and (g[0] != a[0] or g[-1] != a[-1]):
        return False
    if len(g_elems) != len(a_elems):
        return False
    return all(_element_equal(ge, ae) for ge, ae in zip(g_elems, a_elems))


def reference_gold(gold: str) -> str | None:
    """The gold the reference compares with: its boxed content when it holds `\\boxed` (None when
    that extraction fails), else the text itself."""
    gold = str(gold)
    return reference_boxed(gold) if "\\boxed" in gold else gold


def compat_equal(extracted: str, gold: str) -> bool:
    """`reference_compat`'s verdict on an extracted answer (from `extract_boxed_strict`) and a gold."""
    g = reference_gold(gold)
    if extracted is None or g is None:
        return False
    return mathd_form(extracted) == mathd_form(g) or sympy_equal(extracted, g)
