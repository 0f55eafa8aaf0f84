"""Batch-invariant decoding for the ``hf`` engine: a request's tokens and log-probs do not depend on
which other requests share its batch (``batch_invariant=true``, the default; docs/engines.md,
"Same command, same number").

Every op that reduces keeps one order per row, whatever the batch:

- **Prefill** runs each request alone at its own shape ``(1, T_i)``, without padding, so nothing of
  another request enters its prompt's pass. Its keys and values go into the request's own buffers.
- **Attention** (prefill and decode) runs per request over its own keys only (no padded keys: the
  softmax and the weighted sum reduce over exactly that request's ``T_i + t`` positions), through
  transformers' sdpa function on a ``(1, heads, q, d)`` query. It is installed as an attention
  implementation (``NAME``) on the loaded model; the per-request buffers travel in a thread-local.
  A forward of the model outside this decoding (a test, a scorer) gets plain sdpa.
- **Linear layers** in decode run on blocks of exactly ``BLOCK`` rows (the batch's rows, padded with
  zero rows to a multiple of ``BLOCK``): the BLAS kernel and its tiling depend on the row count
  (measured on CPU fp32 with MKL: 1, 2 and 3 rows, and with 2 threads also 5-7 and 9-11 rows, give
  other last bits than 4, 8 or 300 rows), so a fixed row count keeps one kernel; within a block a
  row's result is the same at every position and whatever its neighbours (measured at 1, 2, 4, 8
  threads, fp32 and bf16). bf16 GEMMs (oneDNN) gave the same rows at every count already. The blocks
  are one batched matmul of ``(n/BLOCK, BLOCK, k)`` slices, reached through ``nn.Linear.forward``
  while a thread-local flag says an invariant decode step runs in this thread.
- **Norms, activations, rotary embeddings, log-softmax and sampling** work row by row (reductions
  over the hidden size or the vocabulary of one row), which the tests check end to end.

Rows that finish leave; their buffers go with them. The cost is a loop over requests per layer
for attention and up to ``BLOCK - 1`` padding rows per linear call.

Supported: Llama- and Qwen-family decoders (``SUPPORTED``) with sdpa attention; others are refused
with the way out (``batch_invariant=false``).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from drmas_bench.engines.base import EngineError
from drmas_bench.engines.decoding import Rows

NAME = "drmas_batch_invariant"
BLOCK = 8  # rows per linear call in decode (see module docstring)
SUPPORTED = ("llama", "qwen2", "qwen3")  # model_type values whose decoder this module was checked on

_local = threading.local()  # .rows: the _KV of each row of the forward pass running in this thread


class _KV:
    """One request's keys and values, per layer, in buffers sized for its whole call."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.n = 0  # positions filled
        self.keys: dict[int, Any] = {}
        self.values: dict[int, Any] = {}

    def add(self, layer: int, key: Any, value: Any) -> tuple[Any, Any]:
        """Append ``key``/``value`` (``(1, kv_heads, q, d)``) to ``layer``; returns all of it so far."""
        if layer not in self.keys:
            shape = (1, key.shape[1], self.capacity, key.shape[3])
            self.keys[layer] = key.new_empty(shape)
            self.values[layer] = value.new_empty(shape)
        end = self.n + key.shape[2]
        self.keys[layer][:, :, self.n : end] = key
        self.values[layer][:, :, self.n : end] = value
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


def _attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> tuple[Any, None]:
    """Attention of each row over its own keys (module docstring); the ``(B, q, heads, d)`` output
    transformers' attention functions return."""
    rows = getattr(_local, "rows", None)
    if rows is None:  # a plain forward of the model (a test, a scorer): exactly sdpa
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if kwargs.get("sliding_window"):
        raise EngineError("hf engine: batch_invariant does not support sliding-window attention; "
                          "pass --engine-args batch_invariant=false")
    q_len, outs = query.shape[2], []
    for b, kv in enumerate(rows):
        k, v = kv.add(module.layer_idx, key[b : b + 1], value[b : b + 1])
        out, _ = sdpa_attention_forward(module, query[b : b + 1], k, v, None, dropout=0.0,
                                        scaling=kwargs.get("scaling"), is_causal=q_len > 1)
        outs.append(out)
    return torch.cat(outs), None


AttentionInterface.register(NAME, _attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the mask is built as for sdpa (and ignored)


def blocked_linear(x: Any, weight: Any, bias: Any = None) -> Any:
    """``F.linear`` computed on blocks of exactly ``BLOCK`` rows (zero rows pad the last block)."""
    lead, k = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, k)
    n = flat.shape[0]
    pad = -n % BLOCK
    if pad:
        flat = torch.cat([flat, flat.new_zeros((pad, k))])
    out = torch.matmul(flat.view(-1, BLOCK, k), weight.t())  # one batched GEMM of (BLOCK, k) slices
    if bias is not None:
        out = out + bias
    return out.reshape(-1, out.shape[-1])[:n].reshape(*lead, out.shape[-1])


_PLAIN_LINEAR_FORWARD = torch.nn.Linear.forward


def _linear_forward(self: Any, input: Any) -> Any:
    """``nn.Linear.forward`` while this module is imported: in a thread running an invariant decode
    step (``_local.fixed_rows``) the layer runs as ``blocked_linear``; everywhere else (the trainer's
    own forward, a plain forward of the model, another thread) exactly as before. Patching the class,
    rather than intercepting every op of the step, costs one attribute read per linear call, and
    reaches the adapters' layers (LoRA's ``lora_A`` / ``lora_B``) whenever they are added."""
    if getattr(_local, "fixed_rows", False):
        return blocked_linear(input, self.weight, self.bias)
    return _PLAIN_LINEAR_FORWARD(self, input)


torch.nn.Linear.forward = _linear_forward  # type: ignore[method-assign]


def check_model(model: Any, attn_implementation: str | None, model_name: str) -> None:
    """Refuse, before any decoding, a model or attention option the invariant path cannot honour."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in SUPPORTED:
        raise EngineError(f"hf engine: batch_invariant decoding supports {', '.join(SUPPORTED)} models, and "
                          f"{model_name!r} is {kind!r}; pass --engine-args batch_invariant=false")
    if attn_implementation not in (None, "sdpa"):
        raise EngineError(f"hf engine: batch_invariant computes attention itself (sdpa per request), so "
                          f"attn_implementation={attn_implementation!r} cannot be honoured; drop it or pass "
                          f"batch_invariant=false")


def install(model: Any) -> None:
    """Make ``model`` (and any submodel sharing its config) use the per-request attention."""
    model.config._attn_implementation = NAME


def _forward(engine: Any, kvs: list[_KV], ids: Any, positions: Any, fixed_rows: bool) -> Any:
    """One forward pass of the rows ``kvs``; returns each row's last logits as float32."""
    kw: dict[str, Any] = {"position_ids": positions, "use_cache": False}
    if engine._logits_kw:
        kw[engine._logits_kw] = 1
    _local.rows, _local.fixed_rows = kvs, fixed_rows
    try:
        out = engine._hf_model(input_ids=ids, **kw)
    finally:
        _local.rows, _local.fixed_rows = None, False
    engine.forward_calls += 1
    for kv in kvs:
        kv.n += ids.shape[1]
    return out.logits[:, -1, :].float()


def invariant_decode(engine: Any, rows: Rows) -> None:
    """Decode ``rows``: each prompt prefilled alone, then every step of the active rows together
    with per-row attention and fixed-row linear layers (module docstring)."""
    dev, B = engine.device, len(rows.rows)
    kvs = [_KV(len(rows.prompt(b)) + rows.max_new[b]) for b in range(B)]
    firsts = []
    for b in range(B):
        p = torch.tensor([rows.prompt(b)], dtype=torch.long, device=dev)
        firsts.append(_forward(engine, [kvs[b]], p, torch.arange(p.shape[1], device=dev)[None, :], False))
    logits = torch.cat(firsts)
    active = list(range(B))
    while True:
        tokens, still = rows.take(logits, active)
        if not still:
            return
        active = [active[k] for k in still]
        step = [kvs[r] for r in active]
        positions = torch.tensor([[kv.n] for kv in step], dtype=torch.long, device=dev)
        logits = _forward(engine, step, tokens[still][:, None], positions, True)
