"""A worker group's LoRA adapters over one frozen base (``lora:`` of a recipe): loading the base
with its adapters, switching the active adapter per agent, handing the adapters to the rollout
engine and saving them: a mix-in of :class:`~drmas_trainer.worker.WorkerGroup` (the peft
mechanics are ``drmas_trainer.lora``'s)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from transformers import AutoTokenizer

from drmas_bench.engines import traits
from drmas_bench.models.adapters import (
    BASE_FILE,
    adapter_config_dict,
    adapter_layout,
    base_record,
    resolve_base,
    save_adapter,
    tokenizer_source,
)
from drmas_bench.types import UserError
from drmas_trainer import lora
from drmas_trainer.lora import adapter_tensors


class LoraAdapters:
    """The LoRA side of a worker group (the attributes it reads are WorkerGroup's)."""

    name: str
    settings: Any
    model_path: str
    adapters: dict
    adapter_of: dict[str, str]
    compute_dtype: torch.dtype
    params: list
    policy: Any
    tokenizer: Any
    base_ref: Any
    _base_path: Any  # the base the engine loads (LoRA)
    _engine_dir: str | None

    def _load_lora_policy(self) -> None:
        """The frozen base with this group's adapters (fresh, or a checkpoint's), its tokenizer (a
        checkpoint's adapter folder carries the one the group trained with, else the base's)."""
        if not traits(self.settings.engine).serves_adapters:
            raise UserError(f"worker group {self.name}: lora needs a rollout engine that serves LoRA adapters; "
                            f"engine {self.settings.engine} does not")
        # the frozen base in the compute dtype (bf16: 2 bytes per parameter, no master copy: it never
        # changes); the adapters in float32 (peft upcasts them), as full-weight master weights are
        self.policy, saved_base = lora.load_policy(self.model_path, self.adapters, dtype=self.compute_dtype)
        self._base_path = self.model_path  # the base's local folder (or hub id), for the engine
        if saved_base is not None:  # resumed: the base the checkpoint names, not its folder
            self.base_ref = saved_base
            self._base_path = resolve_base(adapter_layout(self.model_path))
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(self.model_path))
        self.adapter_params = {n: lora.adapter_params(self.policy, n) for n in self.adapters}
        self._engine_dir = None

    def _use_agent(self, agent: str) -> None:
        """Forwards from here on are ``agent``'s: its adapter active (LoRA); a no-op otherwise."""
        if self.adapters:
            lora.activate(self.policy, self.adapter_of[agent], self.params)

    def adapter_weights(self) -> Iterator[tuple[str, dict[str, Any], dict[str, Tensor]]]:
        """(adapter, its peft config as JSON, its tensors in the compute dtype) per adapter: what
        ``sync_weights`` hands a LoRA-serving engine (``update_adapter``), never the base."""

        for name in self.adapters:
            yield name, adapter_config_dict(self.policy, name, str(self.base_ref)), adapter_tensors(
                self.policy, name, self.compute_dtype)

    def _save_adapters(self, folder: str, base: str | None = None) -> None:
        """A LoRA group's model folder (``drmas_bench.models.adapters``): ``base.json`` (the base's
        name and content identity; ``base`` overrides the name), the tokenizer, one peft folder
        per adapter."""

        record = base_record(str(base or self.base_ref))
        os.makedirs(folder, exist_ok=True)
        for name in self.adapters:
            save_adapter(self.policy, name, os.path.join(folder, name), record["name"], record)
        self.tokenizer.save_pretrained(folder)
        with open(os.path.join(folder, BASE_FILE), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)
