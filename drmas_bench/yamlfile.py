"""Reading the YAML files users hand us (team files, price sheets, the paper's reference rows).

Every problem is one :class:`UserError` naming the file (and the line where there is one):
a missing file, a file over ``MAX_YAML_BYTES``, bytes that are not UTF-8, bad YAML, and a document
whose aliases expand to more than ``MAX_YAML_NODES`` nodes (an "alias bomb": a few lines of
``&a [*b, *b, ...]`` that would expand to billions of values once anything walks or serializes
them). Only YAML's safe subset is read (no Python objects).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from drmas_bench.types import UserError

MAX_YAML_BYTES = 8 * 1024 * 1024  # team files and price sheets are a few KiB
MAX_YAML_NODES = 100_000  # nodes after expanding aliases


def decode_utf8(data: bytes, where: str) -> str:
    """Bytes -> text; non-UTF-8 bytes are one UserError naming ``where`` and the line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(f"{where}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x}); save the file as UTF-8") from None


def expanded_size(node: Any, limit: int) -> int:
    """Nodes in a composed YAML tree counting every alias as a full copy (stops counting past ``limit``)."""
    memo: dict[int, int] = {}

    def size(n: Any) -> int:
        key = id(n)
        if key in memo:
            return memo[key]
        memo[key] = limit + 1  # a recursive alias counts as too big
        total = 1
        value = n.value if isinstance(n.value, list) else []
        for child in value:
            parts = child if isinstance(child, tuple) else (child,)  # mappings hold (key, value) pairs
            for p in parts:
                total += size(p)
                if total > limit:
                    memo[key] = total
                    return total
        memo[key] = total
        return total

    return size(node)


def read_yaml(path: str | os.PathLike, what: str) -> Any:
    """Parse a YAML file; a missing file or bad YAML is one UserError naming `what`, the file and line."""

    p = Path(path)
    if not p.is_file():
        raise UserError(f"{what} {p} not found")
    size = p.stat().st_size
    if size > MAX_YAML_BYTES:
        raise UserError(f"{p}: {what} is {size} bytes, more than the {MAX_YAML_BYTES} a {what} may have")
    text = decode_utf8(p.read_bytes(), str(p))
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if expanded_size(node, MAX_YAML_NODES) > MAX_YAML_NODES:
            raise UserError(f"{p}: YAML aliases expand to more than {MAX_YAML_NODES} values; "
                            f"write the values out instead of repeating anchors")
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UserError(f"{p}: not valid YAML{where}: {getattr(e, 'problem', None) or str(e).splitlines()[0]}") from None
    finally:
        loader.dispose()
