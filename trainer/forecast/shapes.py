"""A model's shape for launch-time prediction: the architecture numbers (``ModelShape``: hidden
size, layers, heads, vocabulary, ...) read from its ``config.json`` when it is on this machine, else
from the public configs of the models the recipes name (:data:`KNOWN_SHAPES`). The memory plan and
the hours model (``forecast.memory``, ``forecast.hours``) count parameters and bytes from it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas_bench.engines.base import resolve_model_path
from drmas_bench.types import UserError


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers the plan needs (a decoder-only transformer with gated MLP)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int = 0  # 0 = hidden // heads
    tied: bool = False  # tie_word_embeddings
    qkv_bias: bool = False  # Qwen2: biases on q/k/v
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
    source: str = ""  # where the numbers came from (printed by the plan)

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def params(self) -> int:
        """Parameter count (embeddings, attention, gated MLP, norms, output layer unless tied)."""
        h, hd = self.hidden, self.hd
        attn = h * self.heads * hd + 2 * h * self.kv_heads * hd + self.heads * hd * h
        if self.qkv_bias:
            attn += (self.heads + 2 * self.kv_heads) * hd
        if self.qk_norm:
            attn += 2 * hd
        layer = attn + 3 * h * self.intermediate + 2 * h
        out = 0 if self.tied else self.vocab * h
        return self.vocab * h + self.layers * layer + h + out


#: Public configs (config.json on the Hugging Face hub) of the models the recipes name, used when the
#: model's own config.json cannot be read (hub ids are not downloaded for a plan).
KNOWN_SHAPES: dict[str, ModelShape] = {
    "qwen/qwen3-8b": ModelShape(4096, 36, 32, 8, 12288, 151_936, head_dim=128, qk_norm=True),
    "qwen/qwen3-4b": ModelShape(2560, 36, 32, 8, 9728, 151_936, head_dim=128, tied=True, qk_norm=True),
    "qwen/qwen3-1.7b": ModelShape(2048, 28, 16, 8, 6144, 151_936, head_dim=128, tied=True, qk_norm=True),
    "qwen/qwen2.5-7b-instruct": ModelShape(3584, 28, 28, 4, 18944, 152_064, qkv_bias=True),
    "qwen/qwen2.5-7b": ModelShape(3584, 28, 28, 4, 18944, 152_064, qkv_bias=True),
    "qwen/qwen2.5-3b": ModelShape(2048, 36, 16, 2, 11008, 151_936, tied=True, qkv_bias=True),
    "qwen/qwen2-0.5b": ModelShape(896, 24, 14, 2, 4864, 151_936, tied=True, qkv_bias=True),
    "meta-llama/llama-3.2-3b-instruct": ModelShape(3072, 28, 24, 8, 8192, 128_256, head_dim=128, tied=True),
    "meta-llama/llama-3.2-3b": ModelShape(3072, 28, 24, 8, 8192, 128_256, head_dim=128, tied=True),
}


def shape_from_config(cfg: dict[str, Any], source: str) -> ModelShape:
    """A :class:`ModelShape` from a transformers ``config.json`` mapping (text config of multimodal
    models included)."""
    c = cfg.get("text_config") or cfg
    try:
        heads = int(c["num_attention_heads"])
        return ModelShape(
            hidden=int(c["hidden_size"]), layers=int(c["num_hidden_layers"]), heads=heads,
            kv_heads=int(c.get("num_key_value_heads") or heads), intermediate=int(c["intermediate_size"]),
            vocab=int(c["vocab_size"]), head_dim=int(c.get("head_dim") or 0),
            tied=bool(c.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
            qkv_bias=c.get("model_type") == "qwen2" or bool(c.get("attention_bias", False)),
            qk_norm=c.get("model_type") == "qwen3", source=source)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{source}: missing or bad architecture field {e}") from None


def model_shape(model: str) -> ModelShape:
    """The shape of ``model`` (alias, folder or hub id): its config.json when it can be read
    locally, else :data:`KNOWN_SHAPES`; ``ValueError`` naming the model otherwise."""

    folder: Path | None = None
    try:
        p = Path(resolve_model_path(model))
        folder = p if (p / "config.json").is_file() else None
    except (UserError, OSError, ValueError):
        folder = None
    if folder is not None:
        return shape_from_config(json.loads((folder / "config.json").read_text()), f"{folder}/config.json")
    known = KNOWN_SHAPES.get(model.lower().rstrip("/"))
    if known is not None:
        return ModelShape(**{**known.__dict__, "source": f"built-in table (public config of {model}; not found locally)"})
    raise ValueError(f"model {model!r}: no local config.json and not in the built-in table "
                     f"({', '.join(sorted(KNOWN_SHAPES))}); download it or pass a folder")
