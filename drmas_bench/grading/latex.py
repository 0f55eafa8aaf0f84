"""A small LaTeX -> sympy converter for final answers, with size guards.

`latex_to_sympy(s)` parses one normalised answer expression (see `normalize.py`): numbers
(`3`, `0.15`, `4.5e33`, all exact rationals), letters (`e` is Euler's number, `i` the imaginary
unit, every other letter a symbol; `x_1`, `C_{1}`, `\\omega_{n}` are symbols), `\\pi`, `\\infty`,
greek letters, `+ - * / ^ !`, `\\cdot`, `\\times`, `\\div`, implicit multiplication (`2\\sqrt{3}i`,
`3xy`), `\\frac{a}{b}`, `\\sqrt{x}`, `\\sqrt[n]{x}`, `\\binom{n}{k}`, `|x|`, `\\lfloor x\\rfloor`,
`\\lceil x\\rceil`, and the functions sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh
ln log exp (with or without a backslash, with `\\log_{b}` bases and `\\sin^2 x` powers).

Anything else raises `LatexParseError`; a number in another base (`52_8`) raises `LatexRefused`
(compare it as text). Inputs that would make sympy build astronomically large numbers or
expansions raise `LatexGuardError` (a kind of `LatexRefused`) instead of hanging:

- more than `MAX_TOKENS` tokens;
- a power whose value would have more than `MAX_DIGITS` digits (`9^{9^{9^{9}}}`), or a symbolic
  base raised to an integer above `MAX_SYMBOLIC_EXPONENT`;
- a factorial or binomial of an integer above `MAX_FACTORIAL`.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

import sympy

MAX_TOKENS = 400
MAX_DIGITS = 10_000
MAX_SYMBOLIC_EXPONENT = 1_000
MAX_FACTORIAL = 2_000


class LatexParseError(ValueError):
    """The text is not an expression this converter understands."""


class LatexRefused(LatexParseError):
    """The converter recognises the text and declines it on purpose: no other parser should try
    (numbers in another base such as `52_8` compare as text only)."""


class LatexGuardError(LatexRefused):
    """The expression is too large to evaluate safely (see the module docstring)."""


_TOKEN_RE = re.compile(
    r"(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+(?![\d.]))?|\.\d+(?:[eE][+-]?\d+)?)"
    r"|(?P<cmd>\\[a-zA-Z]+|\\[^a-zA-Z\s])"
    r"|(?P<word>(?:arcsin|arccos|arctan|sinh|cosh|tanh|sin|cos|tan|cot|sec|csc|log|ln|exp|sqrt)(?![a-zA-Z]))"
    r"|(?P<letter>[a-zA-Z])"
    r"|(?P<op>[-+*/^_()\[\]{}|!'])"
    r"|(?P<space>\s+)"
)

_FUNCTIONS = {
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "cot": sympy.cot, "sec": sympy.sec,
    "csc": sympy.csc, "arcsin": sympy.asin, "arccos": sympy.acos, "arctan": sympy.atan,
    "sinh": sympy.sinh, "cosh": sympy.cosh, "tanh": sympy.tanh, "ln": sympy.log, "log": sympy.log,
    "exp": sympy.exp,
}
_GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta", "vartheta",
    "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "varrho", "sigma", "varsigma", "tau",
    "upsilon", "phi", "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi",
    "Pi", "Sigma", "Upsilon", "Phi", "Psi", "Omega", "hbar", "ell", "odot", "nabla", "prime",
}
_ACCENTS = {"dot", "ddot", "hat", "bar", "vec", "tilde", "overline", "widehat", "widetilde"}
# commands that continue a product or close a group: they never start an implicit factor
_NOT_ATOM_CMDS = {
    "\\cdot", "\\times", "\\div", "\\rfloor", "\\rceil", "\\pm", "\\mp", "\\cup", "\\cap", "\\le",
    "\\ge", "\\ne", "\\lt", "\\gt", "\\in", "\\to", "\\}", "\\{",
}


def tokenize(s: str) -> list[tuple[str, str]]:
    """(kind, text) tokens; kinds: num, cmd, word, letter, op. Raises LatexParseError on junk."""
    tokens, pos = [], 0
    while pos < len(s):
        m = _TOKEN_RE.match(s, pos)
        if m is None:
            raise LatexParseError(f"unexpected character {s[pos]!r}")
        if m.lastgroup != "space":
            tokens.append((m.lastgroup, m.group(0)))
        pos = m.end()
        if len(tokens) > MAX_TOKENS:
            raise LatexGuardError(f"more than {MAX_TOKENS} tokens")
    return tokens


def _number(text: str) -> sympy.Rational:
    f = Fraction(text)  # exact: "0.15" -> 3/20, "4.5e33" -> 45 * 10**32
    if f.numerator and abs(math.log10(abs(f.numerator))) > MAX_DIGITS:
        raise LatexGuardError("number too long")
    return sympy.Rational(f.numerator, f.denominator)


def _log10_abs(x: sympy.Expr) -> float | None:
    """log10 |x| for a number built from rationals (None when it is not cheap to know)."""
    if x.is_Rational:
        if x == 0:
            return None
        return math.log10(abs(x.p)) - math.log10(abs(x.q))
    try:
        v = abs(complex(sympy.N(x, 15)))
    except (TypeError, ValueError, OverflowError):
        return None
    return math.log10(v) if v > 0 and math.isfinite(v) else None


def safe_pow(base: sympy.Expr, exp: sympy.Expr) -> sympy.Expr:
    """base ** exp, refusing results too large to build (LatexGuardError)."""
    if exp.is_number and not exp.has(sympy.oo, -sympy.oo, sympy.zoo):
        e_log = _log10_abs(exp)
        if base.is_number:
            b_log = _log10_abs(base)
            if b_log is not None and e_log is not None and abs(b_log) > 0:
                # digits of the result ~ |exp| * |log10 base|
                if e_log + math.log10(abs(b_log)) > math.log10(MAX_DIGITS):
                    raise LatexGuardError("power too large")
        elif e_log is not None and e_log > math.log10(MAX_SYMBOLIC_EXPONENT):
            raise LatexGuardError("symbolic power with a huge exponent")
    return sympy.Pow(base, exp)


def _check_integer_arg(x: sympy.Expr, what: str) -> None:
    if x.is_number and x.is_real:
        try:
            too_big = abs(float(x)) > MAX_FACTORIAL
        except (TypeError, OverflowError):
            too_big = True
        if too_big:
            raise LatexGuardError(f"{what} of a huge number")


class _Parser:
    """Recursive descent over the token list; every method returns a sympy expression."""

    def __init__(self, tokens: list[tuple[str, str]]):
        self.toks = tokens
        self.i = 0
        self.abs_depth = 0

    # -- token helpers
    def peek(self, k: int = 0) -> tuple[str, str] | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise LatexParseError("unexpected end of expression")
        self.i += 1
        return tok

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[1] == text

    def expect(self, text: str) -> None:
        tok = self.take()
        if tok[1] != text:
            raise LatexParseError(f"expected {text!r}, got {tok[1]!r}")

    # -- grammar
    def parse(self) -> sympy.Expr:
        e = self.expr()
        if self.peek() is not None:
            raise LatexParseError(f"unexpected {self.peek()[1]!r}")
        return e

    def expr(self) -> sympy.Expr:
        e = self.term()
        while self.at("+") or self.at("-"):
            op = self.take()[1]
            t = self.term()
            e = e + t if op == "+" else e - t
        return e

    def _starts_atom(self) -> bool:
        tok = self.peek()
        if tok is None:
            return False
        kind, text = tok
        if kind in ("num", "letter", "word"):
            return True
        if kind == "cmd":
            return text not in _NOT_ATOM_CMDS
        if text == "|":
            return self.abs_depth == 0
        return text in ("(", "{", "[")

    def term(self) -> sympy.Expr:
        e = self.unary()
        while True:
            tok = self.peek()
            if tok is None:
                return e
            if tok[1] in ("*", "\\cdot", "\\times"):
                self.take()
                e = e * self.unary()
            elif tok[1] in ("/", "\\div"):
                self.take()
                d = self.unary()
                if d == 0:
                    raise LatexParseError("division by zero")
                e = e / d
            elif self._starts_atom():
                e = e * self.power()
            else:
                return e

    def unary(self) -> sympy.Expr:
        if self.at("-"):
            self.take()
            return -self.unary()
        if self.at("+"):
            self.take()
            return self.unary()
        return self.power()

    def power(self) -> sympy.Expr:
        base = self.postfix()
        if self.at("^"):
            self.take()
            return safe_pow(base, self.exponent())
        return base

    def exponent(self) -> sympy.Expr:
        tok = self.peek()
        if tok is None:
            raise LatexParseError("missing exponent")
        if tok[1] == "{":
            return self.group("{", "}")
        if tok[0] == "num" and len(tok[1]) > 1 and tok[1].isdigit():  # `x^23` means x^2 * 3
            self.toks[self.i] = ("num", tok[1][1:])
            return sympy.Integer(int(tok[1][0]))
        if tok[1] == "-":
            self.take()
            return -self.postfix()
        return self.postfix()

    def postfix(self) -> sympy.Expr:
        e = self.atom()
        while self.at("!"):
            self.take()
            _check_integer_arg(e, "factorial")
            e = sympy.factorial(e)
        return e

    def group(self, open_: str, close: str) -> sympy.Expr:
        self.expect(open_)
        e = self.expr()
        self.expect(close)
        return e

    def argument(self) -> sympy.Expr:
        """A macro argument: a brace group, or else one atom (one digit of a number: `\frac 34`)."""
        if self.at("{"):
            return self.group("{", "}")
        tok = self.peek()
        if tok is not None and tok[0] == "num" and tok[1].isdigit() and len(tok[1]) > 1:
            self.toks[self.i] = ("num", tok[1][1:])
            return sympy.Integer(int(tok[1][0]))
        return self.postfix()

    def subscript_text(self) -> str:
        """Raw text of a subscript (`_1`, `_{n}`, `_{\\max}`), for a symbol's name."""
        self.expect("_")
        return self.raw_argument()

    def raw_argument(self) -> str:
        """Raw text of one token or brace group (backslashes dropped), for a symbol's name."""
        if not self.at("{"):
            return self.take()[1].lstrip("\\")
        self.take()
        depth = 1
        parts: list[str] = []
        while True:
            kind, text = self.take()
            if text == "{":
                depth += 1
            elif text == "}":
                depth -= 1
                if depth == 0:
                    return "".join(parts)
            parts.append(text.lstrip("\\"))

    def symbol(self, name: str) -> sympy.Expr:
        if self.at("_"):
            return sympy.Symbol(f"{name}_{self.subscript_text()}")
        if name == "e":
            return sympy.E
        if name == "i":
            return sympy.I
        return sympy.Symbol(name)

    def function(self, name: str) -> sympy.Expr:
        fn = _FUNCTIONS[name]
        base = None
        if name == "log" and self.at("_"):
            self.take()
            base = self.argument()
        power = None
        if self.at("^"):  # `\sin^2 x`
            self.take()
            power = self.exponent()
        if self.at("(") or self.at("{") or self.at("["):
            close = {"(": ")", "{": "}", "[": "]"}[self.peek()[1]]
            arg = self.group(self.peek()[1], close)
        else:  # `\sin 2x`, `\ln 2`: a run of numbers, letters and powers
            arg = self.power()
            while self.peek() is not None and self.peek()[0] in ("num", "letter"):
                arg = arg * self.power()
        value = fn(arg) if base is None else sympy.log(arg, base)
        return value if power is None else safe_pow(value, power)

    def atom(self) -> sympy.Expr:
        kind, text = self.take()
        if kind == "num":
            if self.at("_"):
                raise LatexRefused("numbers in another base are compared as text")
            return _number(text)
        if kind == "letter":
            return self.symbol(text)
        if kind == "word":
            if text == "sqrt":
                return sympy.sqrt(self.argument())
            return self.function(text)
        if text == "(":
            e = self.expr()
            self.expect(")")
            return e
        if text == "[":
            e = self.expr()
            self.expect("]")
            return e
        if text == "{":
            e = self.expr()
            self.expect("}")
            return e
        if text == "|":
            self.abs_depth += 1
            e = self.expr()
            self.abs_depth -= 1
            self.expect("|")
            return sympy.Abs(e)
        if kind == "cmd":
            return self.command(text)
        raise LatexParseError(f"unexpected {text!r}")

    def command(self, cmd: str) -> sympy.Expr:
        name = cmd[1:]
        if name == "frac":
            num = self.argument()
            den = self.argument()
            if den == 0:
                raise LatexParseError("division by zero")
            return num / den
        if name == "sqrt":
            if self.at("["):
                index = self.group("[", "]")
                return safe_pow(self.argument(), 1 / index)
            return sympy.sqrt(self.argument())
        if name == "binom":
            n, k = self.argument(), self.argument()
            _check_integer_arg(n, "binomial")
            return sympy.binomial(n, k)
        if name == "pi":
            return sympy.pi
        if name in ("infty", "infin"):
            return sympy.oo
        if name == "imath":
            return sympy.I
        if name in _FUNCTIONS:
            return self.function(name)
        if name == "lfloor":
            e = self.expr()
            self.expect("\\rfloor")
            return sympy.floor(e)
        if name == "lceil":
            e = self.expr()
            self.expect("\\rceil")
            return sympy.ceiling(e)
        if name in _GREEK:
            return self.symbol(name)
        if name in _ACCENTS:  # `\dot{x}`, `\hat{\theta}`: a symbol of its own
            return self.symbol(f"{name}({self.raw_argument()})")
        raise LatexParseError(f"unsupported command {cmd}")


@lru_cache(maxsize=8192)
def latex_to_sympy(s: str) -> sympy.Expr:
    """Parse one normalised LaTeX expression (cached). Raises LatexParseError / LatexGuardError."""
    if not s.strip():
        raise LatexParseError("empty expression")
    return _Parser(tokenize(s)).parse()


# the parser above, then a second opinion for syntax it lacks; what the math grader compares
MAX_ANSWER_CHARS = 2_000


@lru_cache(maxsize=8192)
def to_sympy(s: str):
    """A normalised leaf -> sympy expression, or None when it cannot (or must not) be parsed."""
    if len(s) > MAX_ANSWER_CHARS:
        return None
    try:
        return latex_to_sympy(s)
    except LatexRefused:  # too large to evaluate, or text on purpose: no second opinion
        return None
    except (LatexParseError, ValueError, TypeError, ZeroDivisionError, OverflowError, RecursionError):
        pass
    return _fallback_parse(s)


def _fallback_parse(s: str):
    """latex2sympy2_extended (a math-verify dependency) for syntax our converter lacks."""
    if re.search(r"\^\s*\{?[^{}]*\^", s) or "=" in s:  # nested powers never go to an unguarded parser
        return None
    try:
        from latex2sympy2_extended import latex2sympy
    except ImportError:
        return None
    try:
        expr = latex2sympy(s)
    except Exception:  # a foreign parser: any failure means "cannot parse"
        return None
    import sympy

    return expr if isinstance(expr, sympy.Expr) else None
