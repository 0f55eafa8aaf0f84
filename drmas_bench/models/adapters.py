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
import os
from pathlib import Path
from typing import Any

from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import save_file

from drmas_bench.checkpoints.adapter_names import ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_FILE, is_adapter_folder
from drmas_bench.models.adapter_layout import AdapterLayout, adapter_layout, base_record, resolve_base, tokenizer_source
from drmas_bench.models.loading import load_causal_lm
from drmas_bench.types import UserError

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "BASE_FILE", "AdapterLayout", "adapter_config_dict", "adapter_layout",
           "attach_saved",
           "base_record", "is_adapter_folder", "load_adapted_lm", "resolve_base", "save_adapter", "tokenizer_source"]


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
