"""Reading a LoRA adapter folder without peft: its layout, its base model and where its tokenizer
is (what a plan checks before any model loads). Loading and saving adapters, which need peft, are in
``drmas_bench.models.adapters``; the layouts are described there.

Everything here reads files as data: adapter names are checked (``files.safe_name``), subfolders
must lie inside the folder, and nothing from a folder is executed.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drmas_bench.checkpoints.adapter_names import ADAPTER_CONFIG, BASE_FILE
from drmas_bench.files import model_identity, safe_name
from drmas_bench.models import resolve_model
from drmas_bench.types import UserError

logger = logging.getLogger(__name__)

__all__ = ["AdapterLayout", "adapter_layout", "base_record", "resolve_base", "tokenizer_source"]


@dataclass
class AdapterLayout:
    """What an adapter folder holds: the base reference and each adapter's folder by name."""

    folder: Path
    base: str  # the base model's reference (alias, hub id or local folder)
    identity: dict[str, str] = field(default_factory=dict)  # the base's content identity when recorded
    adapters: dict[str, Path] = field(default_factory=dict)  # adapter name -> its one-adapter folder

    def adapter_for(self, agent: str | None) -> str | None:
        """The adapter serving ``agent``: its own (same name), the only one, or None (the base)."""
        if agent is not None and agent in self.adapters:
            return agent
        return next(iter(self.adapters)) if len(self.adapters) == 1 else None


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read the {what} ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(d, dict):
        raise UserError(f"{path}: the {what} must be a JSON object")
    return d


def adapter_layout(path: str | os.PathLike) -> AdapterLayout | None:
    """The layout of an adapter folder (module docstring), or None for any other folder."""

    p = Path(path)
    if (p / ADAPTER_CONFIG).is_file():
        base = _read_json(p / ADAPTER_CONFIG, "adapter config").get("base_model_name_or_path")
        if not isinstance(base, str) or not base:
            raise UserError(f"{p / ADAPTER_CONFIG}: names no base model (base_model_name_or_path)")
        ident = {}
        if (p / BASE_FILE).is_file():  # the trainer also records the identity beside each adapter
            ident = dict(_read_json(p / BASE_FILE, "base record").get("identity") or {})
        return AdapterLayout(p, base, ident, {safe_name(p.name, "adapter folder"): p})
    if not (p / BASE_FILE).is_file():
        return None
    rec = _read_json(p / BASE_FILE, "base record")
    base = rec.get("name")
    if not isinstance(base, str) or not base:
        raise UserError(f"{p / BASE_FILE}: names no base model (name)")
    adapters = {}
    for sub in sorted(p.iterdir()):
        if sub.is_dir() and not sub.is_symlink() and (sub / ADAPTER_CONFIG).is_file():
            adapters[safe_name(sub.name, f"{p}: adapter")] = sub
    if not adapters:
        raise UserError(f"{p}: {BASE_FILE} but no adapter subfolder (with {ADAPTER_CONFIG})")
    return AdapterLayout(p, base, dict(rec.get("identity") or {}), adapters)


def base_record(base: str) -> dict[str, Any]:
    """``base.json``'s content for base reference ``base``: the name, and the content identity of
    the folder it resolves to when that is local (aliases and downloaded hub ids included)."""

    rec: dict[str, Any] = {"name": str(base)}
    try:
        where = resolve_model(base, prepare=False)
    except UserError:
        return rec
    if isinstance(where, Path) and where.is_dir():
        rec["identity"] = model_identity(where)
    return rec


def resolve_base(layout: AdapterLayout) -> str:
    """The local folder (or hub id, while the hub may be reached) of ``layout``'s base; a recorded
    identity that differs from the base found now is logged as a warning (the adapters were trained
    on other weights). The reference resolves as a ``--model`` value would (alias, folder, hub id)."""

    try:
        where = resolve_model(layout.base)
    except UserError as e:
        raise UserError(f"the adapters in {layout.folder} need their base model {layout.base!r}: {e}") from None
    if isinstance(where, Path) and layout.identity.get("content"):
        now = model_identity(where).get("content")
        if now != layout.identity["content"]:
            logger.warning(f"[models] base model {layout.base!r} ({where}) is not the one the adapters in "
                           f"{layout.folder} were trained on (content {now} vs {layout.identity['content']})")
    return str(where)


def tokenizer_source(path: str | os.PathLike) -> str:
    """Where the tokenizer of model ``path`` is: the folder itself when it holds one, else (an
    adapter folder without tokenizer files) its base."""
    p = Path(path)
    if any((p / f).is_file() for f in ("tokenizer_config.json", "tokenizer.json")):
        return str(p)
    layout = adapter_layout(p) if p.is_dir() else None
    return resolve_base(layout) if layout is not None else str(p)
