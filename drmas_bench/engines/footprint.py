"""An engine's memory footprint before it starts: parameter count x bytes per parameter (+ whatever
the engine reserves on top, e.g. SGLang's KV-cache pool), read from the model folder only.

    n = param_count("~/.cache/drmas-bench/models/tiny-random")   # exact, from safetensors headers
    weights = n * dtype_bytes("bfloat16", checkpoint_dtype(folder))

- ``param_count(folder)``: the sum of the tensor sizes listed in the folder's safetensors headers
  (exact, any architecture; nothing is loaded), else an estimate from ``config.json`` for a dense
  decoder (embeddings, attention with grouped KV heads and optional q/k/v biases, gated MLP, norms,
  an untied LM head).
- ``dtype_bytes(dtype, checkpoint)``: bytes per parameter an engine runs in; ``"auto"`` follows the
  checkpoint's dtype, except that float32 checkpoints run in float16 (SGLang's and vLLM's rule).

Pure functions over files; no torch, no model load. A folder without either source is a
``UserError`` that says so.
"""

from __future__ import annotations

import json
import resource
import struct
import sys
from pathlib import Path
from typing import Any

from drmas_bench.types import UserError

DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1,
}
# safetensors header dtype codes -> bytes
_ST_BYTES: dict[str, int] = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                             "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def read_config(folder: str | Path) -> dict[str, Any]:
    """The model's ``config.json`` (a multimodal config's ``text_config`` is merged in)."""
    path = Path(folder).expanduser() / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no config.json in {path.parent}: cannot size the model before loading it") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON (line {exc.lineno}): cannot size the model") from None
    text = cfg.get("text_config")
    return {**cfg, **text} if isinstance(text, dict) else cfg


def checkpoint_dtype(cfg: dict[str, Any]) -> str:
    """The dtype the checkpoint declares (``dtype`` or the older ``torch_dtype``), else float32."""
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32").removeprefix("torch.")


def dtype_bytes(dtype: str, checkpoint: str = "float32") -> int:
    """Bytes per parameter when an engine runs in ``dtype`` (``"auto"``: the checkpoint's dtype,
    float32 checkpoints in float16)."""
    name = str(dtype).removeprefix("torch.")
    if name == "auto":
        name = "float16" if checkpoint in ("float32", "float") else checkpoint
    if name not in DTYPE_BYTES:
        raise UserError(f"unknown dtype {dtype!r}; expected auto or one of: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def safetensors_param_count(folder: str | Path) -> int | None:
    """Elements in every tensor of the folder's ``*.safetensors`` files, read from their headers
    (8-byte little-endian length + JSON); ``None`` when the folder has none."""
    files = sorted(Path(folder).expanduser().glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for d in info["shape"]:
                count *= int(d)
            total += count
    return total


def config_param_count(cfg: dict[str, Any]) -> int:
    """Parameters of a dense decoder-only LM described by ``cfg`` (Llama / Qwen2 / Mistral shapes)."""
    try:
        h = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        vocab = int(cfg["vocab_size"])
        inter = int(cfg["intermediate_size"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"config.json lacks {exc} needed to count the parameters") from None
    kv = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("head_dim") or h // heads)
    qkv_bias = bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2"))
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if qkv_bias:
        attn += heads * hd + 2 * kv * hd
    mlp = 3 * h * inter
    per_layer = attn + mlp + 2 * h  # + input and post-attention norms
    embed = vocab * h
    head = 0 if cfg.get("tie_word_embeddings", False) else vocab * h
    return embed + layers * per_layer + h + head


def param_count(folder: str | Path) -> int:
    """Parameters of the model in ``folder``: exact from safetensors headers, else from config.json."""
    exact = safetensors_param_count(folder)
    return exact if exact is not None else config_param_count(read_config(folder))


def weight_bytes(folder: str | Path, dtype: str = "auto") -> int:
    """Bytes the model's weights take when an engine runs it in ``dtype``."""
    cfg = read_config(folder)
    return param_count(folder) * dtype_bytes(dtype, checkpoint_dtype(cfg))


def peak_rss_bytes() -> int:
    """This process's own peak resident memory: ``VmHWM``, the high-water mark of its address space
    (Linux). Not ``ru_maxrss``: after ``exec`` Linux keeps the *parent's* peak in it, so a process
    spawned by a large parent (a long pytest run) reports the parent's size as its own peak.
    Elsewhere (no /proc) ``ru_maxrss`` is the fallback."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass

    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, kilobytes on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
