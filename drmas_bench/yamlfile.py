"""Reading the YAML files users hand us (team files, price sheets, the paper's reference rows)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from drmas_bench.types import UserError


def read_yaml(path: str | os.PathLike, what: str) -> Any:
    """Parse a YAML file; a missing file or bad YAML is one UserError naming `what`, the file and line."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UserError(f"{what} {p} not found")
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UserError(f"{p}: not valid YAML{where}: {getattr(e, 'problem', None) or str(e).splitlines()[0]}") from None
