"""Per-agent LoRA adapters over one frozen base (the ``lora:`` settings; ``shared_base: true``).

A worker group with LoRA holds its base model once, frozen, and one peft adapter per entry of its
plan's ``adapters`` (one per agent under ``shared_base``, else one for the group). Everything the
worker group does with adapters goes through this module:

    policy = attach(base, {"solver": solver_settings, "verifier": verifier_settings})
    params = adapter_params(policy, "solver")     # what the solver's own optimiser steps
    activate(policy, "solver", trainable)         # forward/backward of the solver's rows
    tensors = adapter_tensors(policy, "solver")   # peft-saved names, what engines load

Why peft and not our own low-rank layers: its adapter format (``adapter_config.json`` +
``adapter_model.safetensors``) is what SGLang, vLLM and ``PeftModel.from_pretrained`` read, so a
checkpoint's adapters are usable anywhere; its multi-adapter models let one base serve several
adapters with the active one switched per forward (a forward never mixes adapters).

The base's weights get no gradients and no optimiser state; only the adapters' parameters are
trainable (float32 even when the group computes in bf16, as the full-weight master weights are).
peft's ``set_adapter`` marks the inactive adapters as not trainable; :func:`activate` switches the
adapter and gives every adapter its ``requires_grad`` back, so each agent's optimiser keeps a fixed
parameter list and an adapter that saw no rows simply has no gradient (its optimiser skips it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model, get_peft_model_state_dict

from drmas_bench.models.adapters import adapter_layout, attach_saved, resolve_base
from drmas_bench.models.loading import load_causal_lm
from drmas_bench.types import UserError
from drmas_trainer.config.train import AgentConfig, LoraConfig

__all__ = ["activate", "adapter_params", "adapter_tensors", "attach", "load_policy", "peft_config"]


def peft_config(spec: LoraConfig) -> Any:
    """peft's ``LoraConfig`` for one adapter's ``lora:`` settings (causal LM, no bias)."""
    targets = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    return PeftLoraConfig(r=int(spec.rank), lora_alpha=float(spec.alpha), lora_dropout=float(spec.dropout),
                          target_modules=targets, bias="none", task_type="CAUSAL_LM")


def attach(model: Any, adapters: dict[str, AgentConfig]) -> Any:
    """``model`` (a plain causal LM) wrapped by peft with one fresh adapter per entry of ``adapters``
    (name -> the settings whose ``lora`` shapes it); the base frozen, every adapter trainable."""
    names = list(adapters)
    if not names:
        raise ValueError("attach needs at least one adapter")
    try:
        pm = get_peft_model(model, peft_config(adapters[names[0]].lora), adapter_name=names[0])
        for n in names[1:]:
            pm.add_adapter(n, peft_config(adapters[n].lora))
    except ValueError as e:  # e.g. target modules the model does not have
        raise UserError(f"lora: {' '.join(str(e).split())[:240]}") from None
    _trainable(pm, names)
    return pm


def load_policy(path: str, adapters: dict[str, AgentConfig], *, dtype: Any) -> tuple[Any, str | None]:
    """The policy of a LoRA worker group: from a base model folder (fresh adapters, :func:`attach`)
    or from a checkpoint's adapter folder (``drmas_bench.models.adapters``: base resolved, the saved
    adapters loaded trainable). Returns (policy, the base reference a checkpoint records: None for a
    fresh start, where the caller knows the base's name)."""

    layout = adapter_layout(path) if Path(path).is_dir() else None
    if layout is None:
        return attach(load_causal_lm(path, dtype=dtype), adapters), None
    missing = sorted(set(adapters) - set(layout.adapters))
    if missing:
        raise UserError(f"{path}: holds the adapter(s) {', '.join(layout.adapters)}, not {', '.join(missing)}")
    base = load_causal_lm(resolve_base(layout), dtype=dtype)
    pm = attach_saved(base, {n: layout.adapters[n] for n in adapters}, trainable=True)
    _trainable(pm, list(adapters))
    return pm, layout.base


def _is_adapter_param(name: str, adapter: str) -> bool:
    return "lora_" in name and f".{adapter}." in f"{name}."


def adapter_params(model: Any, adapter: str) -> list[Any]:
    """The parameters of ``adapter`` (its lora_A / lora_B matrices), in module order."""
    return [p for n, p in model.named_parameters() if _is_adapter_param(n, adapter)]


def _trainable(model: Any, names: list[str]) -> None:
    for n, p in model.named_parameters():
        p.requires_grad_(any(_is_adapter_param(n, a) for a in names))


def activate(model: Any, adapter: str, trainable: list[Any]) -> None:
    """Make ``adapter`` the one the next forwards use; ``trainable`` (every adapter's parameters)
    keep ``requires_grad`` (peft's ``set_adapter`` would freeze the inactive ones)."""
    if model.active_adapter != adapter:
        model.set_adapter(adapter)
        for p in trainable:
            p.requires_grad_(True)


def adapter_tensors(model: Any, adapter: str, dtype: Any = None) -> dict[str, Any]:
    """``adapter``'s tensors under the names peft saves them with (no adapter name in them): what
    ``adapter_model.safetensors`` holds and what an engine's ``update_adapter`` takes."""
    state = get_peft_model_state_dict(model, adapter_name=adapter, save_embedding_layers=False)
    return {k: (v.detach() if dtype is None else v.detach().to(dtype)) for k, v in state.items()}
