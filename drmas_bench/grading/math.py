"""Math answer grading: `grade_math(response, gold, backend="careful")`.

The `careful` grader (our own, the default; called `reference` before its version 2) builds on
the reference's steps (REFERENCE.md §3) and tightens them:

1. **Extract** the last `\\boxed{}` of the response (innermost when nested), after any
   `</think>` (`extract_boxed`). No box means wrong.
2. **Normalise** both answers (`normalize_answer`) and compare the strings. Equal means right.
3. Otherwise compare **structurally, then symbolically**:
   - comma-separated lists and sets `\\{...\\}` compare as unordered collections (`1,-2` equals
     `-2,1`; `1\\pm\\sqrt{19}` expands to the two-element list); when the gold is a list, a
     prediction such as `8, 221` (also readable as the number 8221) is compared as a list too;
   - tuples and intervals `(a,b)`, `[a,b)` compare element by element, brackets included;
     unions `A \\cup B` part by part; matrices (`pmatrix`, `bmatrix`, ...) entry by entry;
   - equations `lhs = rhs` are equal when `lhs - rhs` agree up to a non-zero constant factor;
   - single expressions go through the guards of the reference grader: an **integer** gold needs
     a plain number that equals it (`3.0` is right for `3`, `\\frac{6}{2}` is not); two **plain
     fractions** must be the same fraction as written (an unreduced `\\frac{2}{4}` is not
     `\\frac{1}{2}`); anything else is converted to sympy (`latex_to_sympy`, falling back to
     `latex2sympy2_extended` when installed) and is equal when the difference is zero: exactly
     for rational numbers (decimals are exact: `0.333` is not `\frac{1}{3}`, and a decimal never
     equals an irrational number), to `REL_TOL` relative error at 30 digits for other numbers,
     and at three fixed sample points (symbols taken positive) for expressions with symbols;
   - single words (`\text{Evelyn}`) compare without case.

Expressions too large to evaluate safely (power towers, huge factorials) count as not equal;
`grade_math_many` adds a hard per-item timeout on top for anything that still runs too long.

Graders (`backend=`, a name from `drmas_bench.grading.graders.GRADERS`, the one list of names):
- `"careful"`: the rules above (default).
- `"reference_compat"`: the reference grader's facts, flaws included (`grading/compat.py`).
- `"math_verify"`: the `math-verify` package (extra `mathverify`), on the careful extraction;
  its own signal-based timeouts are switched off (they fail outside the main thread).
"""

from __future__ import annotations

import cmath
import logging
import re
from dataclasses import dataclass
from fractions import Fraction

import sympy
from sympy.core.function import AppliedUndef

from drmas_bench.grading.latex import MAX_ANSWER_CHARS, to_sympy
from drmas_bench.grading.normalize import normalize_answer, split_top_level, strip_dollars
from drmas_bench.types import UserError

REL_TOL = 1e-9
# sample points for identity testing of expressions with symbols: positive, irrational-looking,
# distinct per symbol, away from common poles (0, 1, pi/2)
_SAMPLE_POINTS = ((0.6180339, 1.3247179, 2.2360679, 0.8414709, 1.7320508, 0.3819660),
                  (1.4142135, 0.7071067, 1.1892071, 2.6457513, 0.5772156, 1.6180339),
                  (2.7182818, 0.4342944, 1.9129311, 0.9189385, 1.2020569, 2.0794415))


# ----------------------------------------------------------------------------------- structure


@dataclass(frozen=True)
class Node:
    """A parsed answer: `kind` is leaf | list | tuple | union | matrix | eq | rel.

    leaf: `text` holds the expression; list: unordered `items`; tuple: ordered `items` with the
    bracket pair in `text` (e.g. "(]"); union and eq: ordered `items`; matrix: `items` are rows;
    rel: a chain of inequalities, `items` the sides and `text` the operators (`<`, `\\le`, ...)
    joined by spaces."""

    kind: str
    text: str = ""
    items: tuple["Node", ...] = ()


_MATRIX = re.compile(r"^\\begin\{([pbvBV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}$", re.DOTALL)


def _wrapped(s: str) -> bool:
    """True when s[0] and s[-1] are brackets enclosing everything in between."""
    if len(s) < 2 or s[0] not in "([" or s[-1] not in ")]":
        return False
    depth = 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0 and i != len(s) - 1:
                return False
    return depth == 0


def _expand_pm(s: str) -> list[str]:
    """`1\\pm\\sqrt{2}` -> [`1+\\sqrt{2}`, `1-\\sqrt{2}`] (every `\\pm` / `\\mp` expanded)."""
    m = re.search(r"\\(pm|mp)(?![a-zA-Z])", s)
    if m is None:
        return [s]
    first, second = ("+", "-") if m.group(1) == "pm" else ("-", "+")
    head, tail = s[:m.start()], s[m.end():]
    return _expand_pm(head + first + tail) + _expand_pm(head + second + tail)


_RELATION = re.compile(r"\\(?:le|ge|lt|gt)(?![a-zA-Z])|<=|>=|<|>|≤|≥")
_LESS = {"<": (True, False), "\\lt": (True, False), "\\le": (False, False), "≤": (False, False), "<=": (False, False),
         ">=": (False, True),
         ">": (True, True), "\\gt": (True, True), "\\ge": (False, True), "≥": (False, True)}  # (strict, flipped)


def _split_relation(s: str) -> tuple[list[str], list[str]] | None:
    """`1<x\\le3` -> (["1", "x", "3"], ["<", "\\le"]): the sides and operators of an inequality
    chain at the top level (outside brackets), or None when `s` holds none."""
    sides, ops, depth, start, i = [], [], 0, 0, 0
    while i < len(s):
        ch = s[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0:
            m = _RELATION.match(s, i)
            if m:
                sides.append(s[start:i])
                ops.append(m.group(0))
                start = i = m.end()
                continue
        i += 1
    sides.append(s[start:])
    return (sides, ops) if ops and all(sides) else None


def _braced(s: str) -> bool:
    """`{...}` whose braces enclose everything (a bare-brace set such as `{2,3,5}`)."""
    if len(s) < 2 or s[0] != "{" or s[-1] != "}":
        return False
    depth = 0
    for i, ch in enumerate(s):
        depth += (ch == "{") - (ch == "}")
        if depth == 0 and i != len(s) - 1:
            return False
    return True


def parse_structure(s: str) -> Node:
    """A normalised answer -> Node (see `Node`)."""
    if _braced(s):  # bare braces: a set when they hold a list, grouping otherwise
        return parse_structure(s[1:-1])
    items = split_top_level(s, ",")
    if len(items) > 1:
        return Node("list", items=tuple(parse_structure(x) for x in items if x))
    parts = split_top_level(s, "\\cup")
    if len(parts) > 1:
        return Node("union", items=tuple(parse_structure(x) for x in parts))
    if s.startswith("\\{") and s.endswith("\\}") and len(split_top_level(s[2:], "\\}")) == 2:
        inner = s[2:-2]
        return Node("list", items=tuple(parse_structure(x) for x in split_top_level(inner, ",") if x))
    if "\\pm" in s or "\\mp" in s:
        expanded = _expand_pm(s)
        if len(expanded) > 1:
            return Node("list", items=tuple(parse_structure(x) for x in expanded))
    if _wrapped(s):
        members = split_top_level(s[1:-1], ",")
        if len(members) > 1:
            return Node("tuple", text=s[0] + s[-1], items=tuple(parse_structure(x) for x in members))
    m = _MATRIX.match(s)
    if m:
        rows = [r for r in m.group(2).split("\\\\") if r.strip()]
        return Node("matrix", items=tuple(
            Node("list", items=tuple(Node("leaf", text=c) for c in r.split("&"))) for r in rows
        ))
    rel = _split_relation(s)  # before equations: `x<=1` holds an `=` too
    if rel is not None:
        return Node("rel", text=" ".join(rel[1]), items=tuple(Node("leaf", text=x) for x in rel[0]))
    sides = split_top_level(s, "=")
    if len(sides) == 2 and all(sides):
        return Node("eq", items=(Node("leaf", text=sides[0]), Node("leaf", text=sides[1])))
    return Node("leaf", text=s)


# ------------------------------------------------------------------------------------ numbers

_PLAIN_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_INTEGER = re.compile(r"^[+-]?\d+(?:\.0*)?$")
_PLAIN_FRACTION = re.compile(r"^([+-]?)(?:\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}|([+-]?\d+)/([+-]?\d+))$")


def plain_number(s: str) -> Fraction | None:
    """`3`, `-0.5`, `4.5e33` -> exact Fraction; anything else -> None."""
    return Fraction(s) if _PLAIN_NUMBER.match(s) else None


def plain_fraction(s: str) -> tuple[int, int] | None:
    """`\\frac{3}{4}`, `-3/4` -> (numerator, denominator) as written (sign on the numerator)."""
    m = _PLAIN_FRACTION.match(s)
    if not m:
        return None
    num, den = (int(m.group(2)), int(m.group(3))) if m.group(2) is not None else (int(m.group(4)), int(m.group(5)))
    if den == 0:
        return None
    sign = -1 if (m.group(1) == "-") != ((num < 0) != (den < 0)) else 1
    return sign * abs(num), abs(den)


# ------------------------------------------------------------------------------------- sympy


def _close(a: complex, b: complex) -> bool:
    return abs(a - b) <= REL_TOL * max(1.0, abs(a), abs(b))


def _value(expr, subs: dict | None = None) -> complex | None:
    try:
        v = sympy.N(expr.subs(subs) if subs else expr, 30)
        if v.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or v.free_symbols:
            return None
        c = complex(v)
        # a value beyond float range becomes inf here, and inf would be "close" to anything
        return c if cmath.isfinite(c) else None
    except (TypeError, ValueError, ZeroDivisionError, OverflowError, AttributeError):
        return None


def _sample_values(a, b, symbols: list) -> list[tuple[complex, complex]] | None:
    """(a, b) evaluated at the fixed sample points; None when no point gives finite values."""
    pairs = []
    for point in _SAMPLE_POINTS:
        subs = {sym: point[k % len(point)] + 0.1 * (k // len(point)) for k, sym in enumerate(symbols)}
        va, vb = _value(a, subs), _value(b, subs)
        if va is not None and vb is not None:
            pairs.append((va, vb))
    return pairs or None


def sympy_equal(a, b) -> bool:
    """True when sympy expressions a and b are equal (see the module docstring)."""
    if a.has(sympy.zoo, sympy.nan) or b.has(sympy.zoo, sympy.nan):
        return False  # complex infinity (`1/0`, `12:00` read as a ratio) and nan equal nothing
    if a == b:
        return True
    if a.has(sympy.oo, -sympy.oo) or b.has(sympy.oo, -sympy.oo):
        return False
    a, b = _freeze_functions(a, b)
    symbols = sorted(a.free_symbols | b.free_symbols, key=lambda x: x.name)
    if not symbols:
        if a.is_Rational and b.is_Rational:
            return False  # exact numbers (decimals are exact too) that differ
        if a.is_rational is not None and b.is_rational is not None and a.is_rational != b.is_rational:
            return False  # an exact decimal never equals an irrational number, however close
        va, vb = _value(a), _value(b)
        return va is not None and vb is not None and _close(va, vb)
    pairs = _sample_values(a, b, symbols)
    if pairs is None:
        return _simplifies_to_zero(a - b)
    return all(_close(va, vb) for va, vb in pairs)


def _freeze_functions(a, b):
    """Replace undefined functions such as `theta(t)` by plain symbols (the same in a and b)."""
    calls = a.atoms(AppliedUndef) | b.atoms(AppliedUndef)
    if not calls:
        return a, b

    subs = {c: sympy.Symbol(f"_fn{k}") for k, c in enumerate(sorted(calls, key=str))}
    return a.xreplace(subs), b.xreplace(subs)


def _simplifies_to_zero(d) -> bool:
    """Last resort when no sample point evaluates: a bounded `expand` (never `simplify`, which
    can take seconds on innocent-looking input)."""
    if sympy.count_ops(d) > 50:
        return False
    try:
        return sympy.expand(d) == 0
    except Exception:  # sympy raises many kinds of errors on odd input; unknown means "not equal"
        return False


def positively_proportional(a, b) -> bool:
    """True when a = c * b for a constant c > 0 (inequalities `lhs - rhs < 0`: direction kept)."""
    if a.has(sympy.zoo, sympy.nan) or b.has(sympy.zoo, sympy.nan):
        return False
    if sympy_equal(a, b):
        return True
    symbols = sorted(a.free_symbols | b.free_symbols, key=lambda x: x.name)
    if symbols:
        pairs = _sample_values(a, b, symbols)
    else:
        va, vb = _value(a), _value(b)
        pairs = None if va is None or vb is None else [(va, vb)]
    if not pairs or any(abs(vb) <= 1e-12 for _, vb in pairs):
        return False
    ratios = [va / vb for va, vb in pairs]
    r0 = ratios[0]
    return r0.real > 1e-12 and abs(r0.imag) <= REL_TOL * abs(r0) and all(_close(r, r0) for r in ratios)


def proportional(a, b) -> bool:
    """True when a = c * b for a non-zero constant c (equations `lhs - rhs`)."""
    if sympy_equal(a, b) or sympy_equal(a, -b):
        return True
    symbols = sorted(a.free_symbols | b.free_symbols, key=lambda x: x.name)
    pairs = _sample_values(a, b, symbols) if symbols else None
    if not pairs:
        return False
    ratios = [va / vb for va, vb in pairs if abs(vb) > 1e-12]
    return len(ratios) == len(pairs) and abs(ratios[0]) > 1e-12 and all(_close(r, ratios[0]) for r in ratios)


# ----------------------------------------------------------------------------------- compare


_TIME = re.compile(r"^(\d{1,2}):([0-5]\d)(?::([0-5]\d))?(am|pm)?$")


def times_of_day(s: str) -> set[int] | None:
    """`9:00pm` -> {seconds after midnight}; `9:00` (no a.m./p.m.) -> both readings, 9 and 21 o'clock;
    `21:00` -> {21 o'clock}. None when `s` is not a time of day (`3:2` is a ratio)."""
    m = _TIME.match(s)
    if m is None:
        return None
    h, minutes, secs, half = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), m.group(4)
    if h > 24 or (half and not 1 <= h <= 12):
        return None
    rest = minutes * 60 + secs
    if half:
        return {((h % 12) + (12 if half == "pm" else 0)) * 3600 + rest}
    hours = {h % 24} | ({(h + 12) % 24} if 1 <= h <= 12 else set())
    return {x * 3600 + rest for x in hours}


def leaf_equal(gold: str, pred: str) -> bool:
    """Two normalised single expressions (reference guards, then sympy)."""
    if gold == pred:
        return True
    g_time = times_of_day(gold)
    if g_time is not None:  # a time of day is compared as a time, never as the ratio `12:00`
        p_time = times_of_day(pred)
        return p_time is not None and bool(g_time & p_time)
    if gold.isalpha() and pred.isalpha():  # words (`Evelyn`, `even`): case-insensitive text
        return len(gold) > 1 and gold.lower() == pred.lower()
    g_num, p_num = plain_number(gold), plain_number(pred)
    if _INTEGER.match(gold):  # integer gold: a plain number must match
        return p_num is not None and p_num == g_num
    g_frac, p_frac = plain_fraction(gold), plain_fraction(pred)
    if g_frac is not None and p_frac is not None:
        return g_frac == p_frac
    if g_num is not None and p_num is not None:
        return g_num == p_num
    a, b = to_sympy(gold), to_sympy(pred)
    if a is None or b is None:
        return False
    return sympy_equal(a, b)


def _unordered_equal(gold: tuple[Node, ...], pred: tuple[Node, ...]) -> bool:
    if len(gold) != len(pred):
        return False
    unused = list(pred)
    for g in gold:
        for k, p in enumerate(unused):
            if nodes_equal(g, p):
                del unused[k]
                break
        else:
            return False
    return True


def _flatten_lists(n: Node) -> tuple[Node, ...]:
    out: list[Node] = []
    for x in n.items:
        out.extend(_flatten_lists(x) if x.kind == "list" else [x])
    return tuple(out)


def nodes_equal(gold: Node, pred: Node) -> bool:
    """Structural comparison of two parsed answers (see the module docstring)."""
    if gold.kind != pred.kind:
        return False
    if gold.kind == "leaf":
        return leaf_equal(gold.text, pred.text)
    if gold.kind == "list":
        return _unordered_equal(_flatten_lists(gold), _flatten_lists(pred))
    if gold.kind == "tuple" and gold.text != pred.text:
        return False
    if gold.kind == "eq":
        if gold.items[0].text == pred.items[0].text and leaf_equal(gold.items[1].text, pred.items[1].text):
            return True
        return _equations_equal(gold, pred)
    if gold.kind == "rel":
        return _relations_equal(gold, pred)
    if gold.kind == "matrix":
        return len(gold.items) == len(pred.items) and all(
            len(g.items) == len(p.items) and all(nodes_equal(a, b) for a, b in zip(g.items, p.items))
            for g, p in zip(gold.items, pred.items)
        )
    return len(gold.items) == len(pred.items) and all(nodes_equal(g, p) for g, p in zip(gold.items, pred.items))


def _relations(n: Node):
    """A chain `a < b \\le c` -> [(b - a, strict), (c - b, strict)], each meaning `expr > 0` (or
    `>= 0` when not strict), as sympy; None when a side does not parse."""
    sides = [to_sympy(x.text) for x in n.items]
    if any(x is None for x in sides):
        return None
    out = []
    for k, op in enumerate(n.text.split(" ")):
        strict, flipped = _LESS[op]
        small, big = (sides[k + 1], sides[k]) if flipped else (sides[k], sides[k + 1])
        out.append((big - small, strict))
    return out


def _relations_equal(gold: Node, pred: Node) -> bool:
    """Inequalities as relations: both sides moved to one, direction kept (`x\\le5` is `5\\ge x` and
    `-x\\ge-5`, never `x\\ge5`); a chain's relations compare as a set."""
    g, p = _relations(gold), _relations(pred)
    if g is None or p is None or len(g) != len(p):
        return False
    unused = list(p)
    for expr, strict in g:
        for k, (other, other_strict) in enumerate(unused):
            if strict == other_strict and positively_proportional(expr, other):
                del unused[k]
                break
        else:
            return False
    return True


def _equations_equal(gold: Node, pred: Node) -> bool:
    sides = [to_sympy(x.text) for x in (*gold.items, *pred.items)]
    if any(x is None for x in sides):
        return False
    return proportional(sides[0] - sides[1], sides[2] - sides[3])


# a gold's label, which an answer may leave out: `(p,q)=`, `AB=`, `m_1=`, `\\theta=`
_NAME = r"(?:[a-zA-Z](?:_(?:\{[a-zA-Z0-9]+\}|[a-zA-Z0-9]))?|\\[a-zA-Z]+)"
_LABEL = re.compile(rf"^(?:\({_NAME}(?:,{_NAME})+\)|[A-Za-z]{{1,4}}|{_NAME})$")


def _unlabelled(n: Node) -> Node | None:
    """The right-hand side of a labelled gold (`(p,q)=(3,2)` -> `(3,2)`), or None."""
    if n.kind == "eq" and _LABEL.match(n.items[0].text):
        return parse_structure(n.items[1].text)
    return None


def answers_equal(gold: str, pred: str) -> bool:
    """Two raw answer strings (already extracted): normalise, then compare (the careful rules)."""
    g, p = normalize_answer(gold), normalize_answer(pred)
    if not p:
        return False
    if g == p:
        return True
    if len(g) > MAX_ANSWER_CHARS or len(p) > MAX_ANSWER_CHARS:
        return False
    g_node, p_node = parse_structure(g), parse_structure(p)
    if nodes_equal(g_node, p_node):
        return True
    if p_node.kind != "eq":
        rhs = _unlabelled(g_node)
        if rhs is not None and nodes_equal(rhs, p_node):
            return True
    if (g_node.kind == "eq") != (p_node.kind == "eq"):  # an equation is never compared as an expression:
        g_eq, p_eq = (parse_structure(normalize_answer(x, keep_assignment=True)) for x in (gold, pred))
        if g_eq.kind == p_eq.kind == "eq" and nodes_equal(g_eq, p_eq):  # keep `y=` and compare equations
            return True
    # a list gold (`221, 8`) against `8, 221`, which reads as the number 8221: compare as a list too
    p_list = normalize_answer(pred, join_thousands=False)
    if p_list != p and len(split_top_level(g, ",")) > 1:
        return nodes_equal(parse_structure(g), parse_structure(p_list))
    return False


# ----------------------------------------------------------------------------------- backends


def math_verify_equal(extracted: str, gold: str) -> bool:
    """The `math_verify` grader's comparison: math-verify's parse + verify on both boxed answers."""
    try:
        from math_verify import parse, verify
    except ImportError:
        raise UserError("grader 'math_verify' needs the math-verify package: pip install 'drmas-bench[mathverify]'") from None
    # it warns once per process that its own timeouts are off: they are, on purpose (see above)
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # `$` delimiters and escaped `\\$` signs go as normalize_answer drops them (a bare
    # `s.replace("$", "")` would leave the backslash of `\\$10` behind: `\\boxed{\\10}`); `\\%` stays,
    # math-verify reads a percentage itself (`50\\%` equals both 50 and 0.5 there)
    wrap = lambda s: "\\boxed{" + strip_dollars(s) + "}"  # noqa: E731
    g = parse(wrap(gold), parsing_timeout=None)
    p = parse(wrap(extracted), parsing_timeout=None)
    return bool(g) and bool(p) and verify(g, p, timeout_seconds=None)
