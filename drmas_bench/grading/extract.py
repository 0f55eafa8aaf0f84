"""Pulling the final answer out of a model response.

- `extract_boxed(text)`: the content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`),
  innermost when boxes are nested, searched after the last closing think tag when there is one
  (the careful grader's extraction, lenient on purpose);
- `reference_boxed(text)`: the reference's boxed extraction (REFERENCE.md 2b, "Extraction"): only the
  LAST `\\boxed` of any form counts; a brace scan from there must close on a `}` and the span must
  begin with `\\boxed{`; `\\fbox`, `\\boxed 5` and an unclosed last box give no answer;
- `reference_graded_text(text)`: the part the reference grader reads (after the first `</think>`, up
  to a second one; the whole text without one);
- `extract_boxed_strict(text)`: `reference_boxed(reference_graded_text(text))`, the answer
  `reference_compat` grades;
- `has_boxed_answer(text)`: the solver's validity test of REFERENCE.md 2b (`reference_boxed` on the
  WHOLE response returns a string; `\\boxed{}` counts);
- `extract_answer_tag(text, tag="answer")`: the content of the last `<answer>...</answer>`.

The extractors return None when there is no answer; nothing here raises.
"""

from __future__ import annotations

import re

THINK_CLOSE = "</think>"
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")


def after_think(text: str, first: bool = False) -> str:
    """The part of `text` after the last `</think>` (`first=True`: after the first one), or all of
    it when there is no such tag."""
    cut = text.find(THINK_CLOSE) if first else text.rfind(THINK_CLOSE)
    return text if cut < 0 else text[cut + len(THINK_CLOSE):]


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """(content, end index) of the brace group opening at text[start] == "{"; None if unbalanced.

    Escaped braces (`\\{`, `\\}`) do not count as group delimiters."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
        i += 1
    return None


def _box_at(text: str, cmd_end: int) -> tuple[str, int] | None:
    """Parse one box whose command ends at `cmd_end`: `{...}` or `<space>token` (`\\boxed 5`)."""
    j = cmd_end
    while j < len(text) and text[j] in " \t":
        j += 1
    if j < len(text) and text[j] == "{":
        return _braced(text, j)
    if j > cmd_end and j < len(text):  # `\boxed 5`: up to the closing `$` or end of line
        m = re.match(r"[^$\n]*", text[j:])
        content = m.group(0).strip() if m else ""
        return (content, j + len(m.group(0))) if m and content else None
    return None


def _last_box(text: str, pattern: re.Pattern, braced_only: bool) -> str | None:
    """Content of the last complete top-level box in `text`, then of the innermost box inside it
    (`\\boxed{\\boxed{7}}` -> `7`; `\\boxed{x=\\boxed{7}}` -> `7`)."""
    last: str | None = None
    pos = 0
    while True:
        m = pattern.search(text, pos)
        if m is None:
            break
        box = _braced(text, m.end()) if braced_only else _box_at(text, m.end())
        if box is None:
            pos = m.end()
            continue
        last, pos = box[0].strip(), box[1]
    if last is not None and pattern.search(last):
        inner = _last_box(last, pattern, braced_only)
        if inner is not None:
            return inner
    return last


def extract_boxed(text: str | None) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` / `\\boxed x` in `text` (careful grader).

    Searches after the last `</think>` when one is present. Nested braces are balanced
    (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`). When the last box holds other boxes, the innermost
    last one is the answer (`\\boxed{\\boxed{7}}` -> `7`). Returns None when there is no complete
    box (an empty box returns "")."""
    if not text:
        return None
    return _last_box(after_think(text), _BOX_RE, braced_only=False)


def reference_boxed(text: str | None) -> str | None:
    """The reference's boxed extraction (REFERENCE.md 2b): the content of the LAST ``\\boxed``.

    From the last occurrence of ``\\boxed`` (in any form), braces are counted (``{`` +1, ``}`` -1)
    up to the first ``}`` that brings the count to 0; that span must begin with ``\\boxed{``.
    ``\\boxed{5} \\boxed{`` -> None (the last box is unclosed), ``\\boxed{\\boxed{5}}`` -> ``5``,
    ``\\boxed{a}}`` -> ``a``, ``\\boxed{}`` -> ``""``, ``\\fbox{5}`` and ``\\boxed 5`` -> None.
    Escapes are not special here (unlike the careful grader's `_braced`)."""
    if not text:
        return None
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                span = text[start:i + 1]
                return span[len("\\boxed{"):-1] if span.startswith("\\boxed{") else None
    return None


def reference_graded_text(text: str) -> str:
    """What the reference grader reads: the piece after the first ``</think>`` up to a second one
    (the second piece of ``text.split("</think>")``), or the whole text without one."""
    parts = text.split(THINK_CLOSE)
    return parts[1] if len(parts) > 1 else text


def extract_boxed_strict(text: str | None) -> str | None:
    """The answer the reference grader grades: `reference_boxed` of `reference_graded_text`
    (a box before the first ``</think>`` is not seen)."""
    if not text:
        return None
    return reference_boxed(reference_graded_text(text))


def has_boxed_answer(text: str | None) -> bool:
    """REFERENCE.md 2b solver validity: `reference_boxed` on the whole response returns a string
    (no think split; ``\\boxed{}`` is valid; ``\\boxed{5} \\boxed{`` is not)."""
    return reference_boxed(text) is not None


def extract_answer_tag(text: str | None, tag: str = "answer") -> str | None:
    """Content (stripped) of the last complete `<tag>...</tag>` in `text`, or None."""
    if not text:
        return None
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None
