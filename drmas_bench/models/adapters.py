"""LoRA adapter folders: the format the trainer writes and the engines and ``eval`` read (peft's).

Two layouts are recognised (:func:`adapter_layout`):

- **one adapter**: a folder with ``adapter_config.json`` and ``adapter_model.safetensors`` (what
  ``peft.PeftModel.save_pretrained`` writes); its base model is ``base_model_name_or_path`` of the
  config. Every agent served from it uses this adapter.
- **a worker group's adapters** (a trainer checkpoint's ``models/<wg>/``): ``base.json`` naming the
  base (``{"name": ..., "identity": {...}}``), one subfolder per adapter in the one-adapter layout,
  and the tokenizer the group trained with. An agent whose name is an adapter's gets that adapter;
  with a single adapter every agent gets it (a group whose agents share one adapter).

The base reference is what the run was given (an alias such as ``tiny-random``, a hub id, or a
local folder) plus, for a local folder, its content identity (``files.model_identity``), so a base
that changed since training is reported rather than silently used. Resolving the reference goes
through ``models.resolve_model`` (the hub only while it may be reached; offline a clear error).

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

from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import save_file

from drmas_bench.files import model_identity, safe_name
from drmas_bench.models import resolve_model
from drmas_bench.models.adapter_names import ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_FILE, is_adapter_folder
from drmas_bench.models.loading import load_causal_lm
from drmas_bench.types import UserError

logger = logging.getLogger(__name__)

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "BASE_FILE", "AdapterLayout", "adapter_config_dict", "adapter_layout",
           "attach_saved",
           "base_record", "is_adapter_folder", "load_adapted_lm", "resolve_base", "save_adapter", "tokenizer_source"]


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


def save_adapter(model: Any, name: str, folder: str | os.PathLike, base: str,
                 record: dict[str, Any] | None = None, state: dict[str, Any] | None = None) -> None:
    """Write adapter ``name`` of peft model ``model`` to ``folder`` in peft's format
    (``adapter_config.json`` with ``base_model_name_or_path = base``, ``adapter_model.safetensors``),
    and ``record`` (``base_record``) as ``base.json`` beside them. ``state``: the adapter's tensors
    under peft's names when the caller has them (a sharded group gathers them), else read from ``model``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.peft_config[name]
    cfg_dict = cfg.to_dict()
    cfg_dict["base_model_name_or_path"] = str(base)
    for k, v in list(cfg_dict.items()):  # sets (target_modules after injection) -> sorted lists: JSON
        if isinstance(v, set):
            cfg_dict[k] = sorted(v)
    (out / ADAPTER_CONFIG).write_text(json.dumps(cfg_dict, indent=2, sort_keys=True, default=str), encoding="utf-8")
    # only the adapter: the frozen base's embedding / output layers are never copied into it (peft would
    # add them whenever lm_head or embed_tokens is a target)
    if state is None:
        state = get_peft_model_state_dict(model, adapter_name=name, save_embedding_layers=False)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(out / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    if record is not None:
        (out / BASE_FILE).write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")


def adapter_config_dict(model: Any, name: str, base: str = "") -> dict[str, Any]:
    """Adapter ``name``'s peft config as JSON (what an engine gets with the adapter's tensors)."""
    d = model.peft_config[name].to_dict()
    d["base_model_name_or_path"] = base
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in d.items()}


def attach_saved(model: Any, adapters: dict[str, Path], *, trainable: bool = False) -> Any:
    """``model`` (a plain causal LM) with the saved ``adapters`` attached by name: a PeftModel
    (the first one through ``PeftModel.from_pretrained``, the rest with ``load_adapter``)."""
    names = list(adapters)
    try:
        pm = PeftModel.from_pretrained(model, str(adapters[names[0]]), adapter_name=names[0], is_trainable=trainable)
        for n in names[1:]:
            pm.load_adapter(str(adapters[n]), adapter_name=n, is_trainable=trainable)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise UserError(f"cannot load the adapter(s) {', '.join(names)}: {' '.join(str(e).split())[:200]}") from None
    return pm


def load_adapted_lm(path: str | os.PathLike, **kwargs: Any) -> tuple[Any, AdapterLayout]:
    """(PeftModel with every adapter of folder ``path``, its layout): the base resolved and loaded
    with ``kwargs`` (``models.loading.load_causal_lm``), the adapters attached for inference."""

    layout = adapter_layout(path)
    if layout is None:
        raise UserError(f"{path}: not an adapter folder (no {ADAPTER_CONFIG} or {BASE_FILE})")
    base = load_causal_lm(resolve_base(layout), **kwargs)
    return attach_saved(base, layout.adapters), layout


def tokenizer_source(path: str | os.PathLike) -> str:
    """Where the tokenizer of model ``path`` is: the folder itself when it holds one, else (an
    adapter folder without tokenizer files) its base."""
    p = Path(path)
    if any((p / f).is_file() for f in ("tokenizer_config.json", "tokenizer.json")):
        return str(p)
    layout = adapter_layout(p) if p.is_dir() else None
    return resolve_base(layout) if layout is not None else str(p)
