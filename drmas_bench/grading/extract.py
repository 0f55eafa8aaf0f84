"""Pulling the final answer out of a model response.

- `extract_boxed(text)`: the content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`),
  searched after the last closing think tag when there is one (REFERENCE.md §3).
- `extract_answer_tag(text, tag="answer")`: the content of the last `<answer>...</answer>`.

Both return None when there is no answer, never raise.
"""

from __future__ import annotations

import re

THINK_CLOSE = "</think>"
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")


def after_think(text: str) -> str:
    """The part of `text` after the last `</think>`, or all of it when there is no such tag."""
    cut = text.rfind(THINK_CLOSE)
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
        return (content, j + len(m.group(0))) if content else None
    return None


def extract_boxed(text: str | None) -> str | None:
    """Content of the last top-level `\\boxed{...}` / `\\fbox{...}` / `\\boxed x` in `text`.

    Searches after the last `</think>` when one is present. Nested braces are balanced
    (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`). A box nested inside another box counts as part of
    the outer one. Returns None when there is no complete box (an empty box returns "")."""
    if not text:
        return None
    text = after_think(text)
    last: str | None = None
    pos = 0
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return last
        box = _box_at(text, m.end())
        if box is None:
            pos = m.end()
            continue
        last, pos = box[0].strip(), box[1]


def extract_answer_tag(text: str | None, tag: str = "answer") -> str | None:
    """Content (stripped) of the last complete `<tag>...</tag>` in `text`, or None."""
    if not text:
        return None
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None
