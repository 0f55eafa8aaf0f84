"""The fenced code blocks of the project's Markdown docs, and the markers that say what to do with them.

Two readers share this one parser, so the docs cannot drift from what is checked:

- ``.ci/run`` runs the README's main job exactly as the README prints it:
  ``python scripts/doc_blocks.py main-job README.md`` prints the command of the one block that
  follows the marker line ``<!-- main-job -->``.
- ``tests/test_docs.py`` runs every ``python`` block of README.md and docs/*.md, except a block
  preceded by ``<!-- not-run: REASON -->`` (a sketch with names from its surroundings, a block that
  needs a GPU or a server); the reason is shown as the test's skip reason.

A marker is an HTML comment on its own line (invisible when the Markdown is rendered), directly
above the block's opening fence; blank lines between them are allowed, any other text is not, so a
marker never reaches past the paragraph it sits in.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

MAIN_JOB = "main-job"
NOT_RUN = "not-run"
_FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*([\w-]+)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    lang: str  # the fence's info word ("python", "bash", "" when none)
    code: str
    line: int  # 1-based line of the opening fence
    marker: str | None = None  # "main-job", "not-run", ... of the comment directly above
    note: str = ""  # the marker's text after the colon (a not-run reason)


def blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, in order, with the marker directly above it."""
    out: list[Block] = []
    lines = text.splitlines()
    marker: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line.strip())
        m = _MARKER.match(line.strip())
        if m:
            marker = (m.group(1), m.group(2) or "")
        elif fence:
            close, lang, start = fence.group(1), fence.group(2), i
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(close):
                body.append(lines[i])
                i += 1
            out.append(Block(lang, "\n".join(body) + "\n", start + 1,
                             marker[0] if marker else None, marker[1] if marker else ""))
            marker = None
        elif line.strip():
            marker = None  # text between a marker and a fence: the marker belonged to nothing
        i += 1
    return out


def main_job(text: str, where: str = "README.md") -> str:
    """The command of the block after ``<!-- main-job -->``: continuation lines joined, comments and
    blank lines dropped. Exactly one such block, holding exactly one command, or ValueError."""
    found = [b for b in blocks(text) if b.marker == MAIN_JOB]
    if len(found) != 1:
        raise ValueError(f"{where}: {len(found)} blocks marked <!-- {MAIN_JOB} -->, expected exactly 1")
    commands, current = [], ""
    for raw in found[0].code.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1].rstrip() + " "
            continue
        commands.append((current + line).strip())
        current = ""
    if current:
        commands.append(current.strip())
    if len(commands) != 1:
        raise ValueError(f"{where}:{found[0].line}: the <!-- {MAIN_JOB} --> block holds {len(commands)} commands, expected 1")
    return commands[0]


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "main-job":
        print("usage: python scripts/doc_blocks.py main-job README.md", file=sys.stderr)
        return 2
    try:
        print(main_job(Path(argv[1]).read_text(encoding="utf-8"), argv[1]))
    except (OSError, ValueError) as e:
        print(f"doc_blocks: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
