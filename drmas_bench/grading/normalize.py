"""String normalisation of math answers (the first, cheap half of `grade_math`).

`normalize_answer(s)` rewrites a LaTeX answer into a canonical string so that trivially different
spellings compare equal as strings:

- `$`, `\\$`, `\\left` / `\\right` / `\\big...`, spacing commands (`\\!`, `\\,`, `\\;`, `\\quad`, ...)
  and `\\displaystyle` are dropped;
- `\\dfrac` / `\\tfrac` / `\\cfrac` -> `\\frac`, `\\dbinom` / `\\tbinom` -> `\\binom`, `\\frac 59` ->
  `\\frac{5}{9}`, `\\sqrt2` -> `\\sqrt{2}`, `x^{2}` -> `x^2` (single-character groups);
- degrees (`^\\circ`, `^{\\circ}`, `°`) and percent (`\\%`, `%`) marks are dropped;
- a trailing unit in `\\text{...}` / `\\mbox{...}` / `\\textbf{...}` / `\\textnormal{...}` / `\\mathrm{...}`
  (`5.4 \\text{ cents}`, `15\\mbox{ cm}^2`) is dropped; any other `\\text{X}` / `\\mathrm{X}` /
  `\\textbf{X}` ... becomes X;
- thousands separators (`1,000`, `10,\\!080`, `1{,}000`) are removed when the whole answer is one number
  in valid three-digit groups with no space after a comma (`32, 349` and `0,111` stay lists);
- bare unit words after a number (`28 percent`, `480 cm`, `5 square units`) are dropped, and `and` /
  `or` between items (`6 \\text{ and } 8`, `1 and 2 and 3`) becomes a comma;
- a time's `a.m.` / `p.m.` (`9:00 \\text{ p.m.}`) becomes a suffix (`9:00pm`);
- a trailing `.` is removed, a leading `.5` becomes `0.5`, `np.` prefixes go;
- a leading assignment to a single variable or function (`x=5`, `f(x)=2x`, `m_{\\max}=3`,
  `x \\in [-2,7]`) keeps only its right-hand side (per comma-separated item);
- a multiple-choice answer `(C)` becomes `C`; a mixed number `1\\frac{4}{5}` becomes `\\frac{9}{5}`;
- all spaces go, except one between a command and a following letter or digit (`\\cot x`).

Everything here is pure string work: no sympy, no exceptions.
"""

from __future__ import annotations

import re
from functools import lru_cache

# ------------------------------------------------------------------------------- building blocks


def split_top_level(s: str, sep: str = ",") -> list[str]:
    """Split `s` at `sep` where it is outside (), [], {} and `\\{ \\}`."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        ch = s[i]
        if depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            start = i + len(sep)
            i = start
            continue
        if ch == "\\" and i + 1 < len(s):
            if s[i + 1] == "{":
                depth += 1
            elif s[i + 1] == "}":
                depth -= 1
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        i += 1
    parts.append(s[start:])
    return parts


def _group_end(s: str, start: int) -> int:
    """Index just after the brace group opening at s[start] == '{' (len(s) when unbalanced)."""
    depth = 0
    for i in range(start, len(s)):
        if s[i] == "{" and (i == 0 or s[i - 1] != "\\"):
            depth += 1
        elif s[i] == "}" and (i == 0 or s[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return i + 1
    return len(s)


def _one_argument(s: str, i: int) -> tuple[str, int]:
    """The macro argument starting at s[i]: a brace group (kept with braces) or one character."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return "", i
    if s[i] == "{":
        end = _group_end(s, i)
        return s[i:end], end  # the caller fixes macros inside the group
    if s[i] == "\\":
        m = re.match(r"\\[a-zA-Z]+", s[i:])
        if m:
            return "{" + m.group(0) + "}", i + len(m.group(0))
    return "{" + s[i] + "}", i + 1


def brace_macro_arguments(s: str, macro: str, n_args: int) -> str:
    """`\\frac 59` -> `\\frac{5}{9}`, `\\frac9{19}` -> `\\frac{9}{19}`, `\\sqrt2` -> `\\sqrt{2}`."""
    out, i = [], 0
    pat = re.compile(re.escape(macro) + r"(?![a-zA-Z])")
    while True:
        m = pat.search(s, i)
        if m is None:
            out.append(s[i:])
            return "".join(out)
        out.append(s[i:m.end()])
        j = m.end()
        if macro == "\\sqrt" and j < len(s) and s[j] == "[":  # optional root index
            k = s.find("]", j)
            if k < 0:
                out.append(s[j:])
                return "".join(out)
            out.append(s[j:k + 1])
            j = k + 1
        for _ in range(n_args):
            arg, j = _one_argument(s, j)
            if arg.startswith("{") and arg.endswith("}"):
                arg = "{" + brace_macro_arguments(arg[1:-1], macro, n_args) + "}"
            out.append(arg)
        i = j


def unwrap_macro(s: str, macro: str) -> str:
    """`\\text{abc}` -> `abc` for every occurrence of `macro` (nested groups respected)."""
    pat = re.compile(re.escape(macro) + r"\s*\{")
    while True:
        m = pat.search(s)
        if m is None:
            return s
        start_brace = m.end() - 1
        end = _group_end(s, start_brace)
        s = s[:m.start()] + s[start_brace + 1:end - 1] + s[end:]


# ------------------------------------------------------------------------------------ the steps

_SPACING = re.compile(r"\\\\|\\[,;: ]|\\quad(?![a-zA-Z])|\\qquad(?![a-zA-Z])|~")
_SIZING = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|Biggl|Biggr|big|Big|bigg|Bigg)(?![a-zA-Z])\.?")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ(?![a-zA-Z])|°|\^\s*\{\s*\\degree\s*\}|\\degree(?![a-zA-Z])")
_TEXT_MACROS = r"(?:text|mbox|textrm|textnormal|textbf|textit|mathrm|mathbf)"
_TRAILING_UNIT = re.compile(
    r"(?<=\S)\s*\\" + _TEXT_MACROS + r"\s*\{\s*[a-zA-Z][a-zA-Z .,/]*\}(?:\s*\^\s*\{?\s*\d\s*\}?)?\s*$"
)
# unit words written bare after a number (`28 percent`, `480 cm`, `5 square units`): ours, broader
# than the reference's list (compat.UNIT_WORDS), and only after a space behind a digit or a group
UNIT_WORDS = (
    "percent", "percentage", "per cent", "pct", "degrees?", "radians?", "units?", "cents?", "dollars?",
    "mm", "cm", "km", "m", "millimet(?:er|re)s?", "centimet(?:er|re)s?", "kilomet(?:er|re)s?", "met(?:er|re)s?",
    "inch(?:es)?", "feet", "foot", "ft", "yards?", "yd", "miles?", "mph", "km/h", "m/s",
    "seconds?", "secs?", "minutes?", "mins?", "hours?", "hrs?", "days?", "weeks?", "months?", "years?",
    "g", "kg", "mg", "grams?", "kilograms?", "pounds?", "lbs?", "ounces?", "oz", "liters?", "litres?", "ml",
)
_BARE_UNIT = re.compile(r"(?<=[\d}.])\s+(?:(?:square|sq\.?|cubic)\s+)?(?:" + "|".join(UNIT_WORDS)
                        + r")\.?(?:\s*\^\s*\{?\s*\d\s*\}?)?\s*$", re.IGNORECASE)
# `6 \text{ and } 8`, `1 and 2 and 3`, `2 or 3`: a list (compared as a set)
_TEXT_JOINER = re.compile(r"\s*,?\s*\\" + _TEXT_MACROS + r"\s*\{\s*(?:and|or)\s*\}\s*")
_WORD_JOINER = re.compile(r"\s*,?\s+(?:and|or)\s+")
# a time of day with a.m./p.m. in a text group, kept as a suffix before text groups are dropped
_TIME_SUFFIX = re.compile(r"(\d:\d\d)\s*(?:\\" + _TEXT_MACROS + r"\s*\{\s*([aApP])\.?\s*[mM]\.?\s*\}|([aApP])\.?\s*[mM]\.?(?![a-zA-Z]))")
_UNWRAP = ("\\text", "\\mbox", "\\textrm", "\\textnormal", "\\textbf", "\\textit", "\\mathrm", "\\mathbf",
           "\\mathit", "\\boldsymbol", "\\mathbb", "\\mathcal")
# thousands separators: only valid three-digit groups behind a first group that has no leading
# zero (`0,111` is not 111), and only when no space follows a comma (`32, 349` is a list)
_THOUSANDS = re.compile(r"^[+-]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")
_SPACED_COMMA = re.compile(r",\s")
_ASSIGN_LHS = re.compile(
    r"^\s*(?:[a-zA-Z]|\\[a-zA-Z]+)(?:\s*_\s*(?:\{[^{}]*\}|[a-zA-Z0-9]))?(?:\s*\(\s*[a-zA-Z]\s*\))?\s*$"
)
_IN_LHS = re.compile(r"^\s*[a-zA-Z]\s*\\in(?![a-zA-Z])\s*")
_CHOICE = re.compile(r"^\(([A-Ea-e])\)$")
_MIXED = re.compile(r"^([+-]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}$")
_ALIASES = (
    ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\cfrac", "\\frac"),
    ("\\dbinom", "\\binom"), ("\\tbinom", "\\binom"),
    ("\\geqslant", "\\ge"), ("\\leqslant", "\\le"), ("\\geq", "\\ge"), ("\\leq", "\\le"),
    ("\\neq", "\\ne"), ("\\varnothing", "\\emptyset"), ("\\lbrace", "\\{"), ("\\rbrace", "\\}"),
    ("\\lvert", "|"), ("\\rvert", "|"), ("\\vert", "|"), ("\\mid", "|"),
)


def _replace_command(s: str, old: str, new: str) -> str:
    return re.sub(re.escape(old) + r"(?![a-zA-Z])", lambda _: new, s)


def strip_dollars(s: str) -> str:
    """Drop `$` math delimiters and escaped dollar signs `\\$` (the escape first, so no stray
    backslash is left behind: `\\$10` -> `10`, not `\\10`)."""
    return s.replace("\\$", "").replace("$", "")


def strip_percent(s: str) -> str:
    """Drop percent signs, escaped (`\\%`) or not (the escape first, for the same reason)."""
    return s.replace("\\%", "").replace("%", "")


def strip_leading_assignment(item: str) -> str:
    """`x=5` -> `5`, `f(x)=2x` -> `2x`, `x \\in [1,2]` -> `[1,2]`; other items unchanged."""
    m = _IN_LHS.match(item)
    if m:
        return item[m.end():]
    parts = split_top_level(item, "=")
    if len(parts) == 2 and _ASSIGN_LHS.match(parts[0]) and parts[1].strip():
        return parts[1]
    return item


def squeeze_spaces(s: str) -> str:
    """Drop all whitespace except one space between a command and a following letter or digit."""
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"(\\[a-zA-Z]+) (?=[a-zA-Z0-9])", "\\1\x00", s)
    return s.replace(" ", "").replace("\x00", " ")


def _mixed_number(s: str) -> str:
    m = _MIXED.match(s)
    if not m:
        return s
    sign, whole, num, den = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    if den == 0 or num >= den:  # `2\frac{5}{3}` is not a mixed number: leave it as a product
        return s
    return f"{'-' if sign == '-' else ''}\\frac{{{whole * den + num}}}{{{den}}}"


def normalize_answer(s: str | None, join_thousands: bool = True, keep_assignment: bool = False) -> str:
    """The canonical string form of a math answer (see the module docstring for every rule).

    join_thousands=False keeps `8,221` as the two-item list it may also be; keep_assignment=True
    keeps a leading `y=` (for comparing an equation with an equation)."""
    if s is None:
        return ""
    return _normalize(str(s), join_thousands, keep_assignment)


@lru_cache(maxsize=16384)
def _normalize(s: str, join_thousands: bool = True, keep_assignment: bool = False) -> str:
    s = s.replace("\n", " ").strip()
    s = strip_dollars(s)
    s = s.replace("{,}", ",")  # `1{,}000`: a comma in braces (LaTeX's no-space comma) is a comma
    s = re.sub(r",\\!\s*", ",", s)  # `11,\! 111`: LaTeX's thousands comma, whatever spaces follow it
    s = s.replace("\\!", "")
    s = _SPACING.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else " ", s)  # keep row breaks
    s = _SIZING.sub("", s)
    s = re.sub(r"\\displaystyle(?![a-zA-Z])", "", s)
    for old, new in _ALIASES:
        s = _replace_command(s, old, new)
    s = _DEGREES.sub("", s)
    s = strip_percent(s)
    s = re.sub(r"\\text\s*\{\s*degrees?\s*\}|\\text\s*\{\s*percent\s*\}", "", s).strip()
    s = _TIME_SUFFIX.sub(lambda m: m.group(1) + (m.group(2) or m.group(3)).lower() + "m", s)
    s = _TEXT_JOINER.sub(",", s)
    while True:  # trailing units, possibly several (`5 \text{m} \text{per second}`, `5 square units`)
        t = _BARE_UNIT.sub("", _TRAILING_UNIT.sub("", s))
        if t == s:
            break
        s = t
    s = re.sub(r"\\operatorname\s*\{\s*([a-zA-Z]+)\s*\}", r"\\\1", s)
    for macro in _UNWRAP:
        s = unwrap_macro(s, macro)
    s = re.sub(r"\bnp\.", "", s)
    s = s.strip().rstrip(".").strip()  # a sentence's full stop (`5.` -> `5`)
    s = brace_macro_arguments(s, "\\frac", 2)
    s = brace_macro_arguments(s, "\\binom", 2)
    s = brace_macro_arguments(s, "\\sqrt", 1)
    s = _WORD_JOINER.sub(",", s)
    spaced_commas = bool(_SPACED_COMMA.search(s))
    s = squeeze_spaces(s)
    if join_thousands and not spaced_commas and _THOUSANDS.match(s):
        s = s.replace(",", "")
    if not keep_assignment:
        s = ",".join(strip_leading_assignment(item) for item in split_top_level(s, ","))
    s = re.sub(r"([_^])\{([a-zA-Z0-9])\}", r"\1\2", s)
    s = re.sub(r"(?<![\d}a-zA-Z])\.(\d)", r"0.\1", s)
    s = _CHOICE.sub(lambda m: m.group(1).upper(), s)
    s = _mixed_number(s)
    return s
