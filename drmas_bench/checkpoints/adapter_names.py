"""The file names of a LoRA adapter folder and how to recognise one (a leaf: the model registry
asks it without importing the adapter loading code in ``drmas_bench.models.adapters``)."""

from __future__ import annotations

import os
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"  # peft's config of one adapter
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's tensors of one adapter
BASE_FILE = "base.json"  # the trainer's reference to the base model (name + content identity)


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """A folder holding one adapter (``adapter_config.json``) or a worker group's (``base.json``)."""
    p = Path(path)
    return p.is_dir() and ((p / ADAPTER_CONFIG).is_file() or (p / BASE_FILE).is_file())
