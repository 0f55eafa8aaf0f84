"""Rewrite the config tables in docs/*.md from the schemas (drmas_bench.schema.update_docs).

    python scripts/gen_config_docs.py          # rewrite stale tables, list the pages changed
    python scripts/gen_config_docs.py --check  # exit 1 if any table is stale (what tests/test_schema.py checks)
"""

from __future__ import annotations

import sys
from pathlib import Path

from drmas_bench.schema import update_docs

DOCS = Path(__file__).resolve().parent.parent / "docs"


def main(argv: list[str]) -> int:
    stale = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        new = update_docs(text)
        if new != text:
            stale.append(page.name)
            if "--check" not in argv:
                page.write_text(new, encoding="utf-8")
    print(("stale: " if "--check" in argv else "rewrote: ") + (", ".join(stale) or "none"))
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
