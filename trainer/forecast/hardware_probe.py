"""The machine at hand as a row of the hours model's hardware table, measured on the spot
(``drmas-bench train --plan --gpu here``): a short matrix-product probe gives the FLOP/s, a
tensor-copy probe the memory bandwidth, both with torch on the CPU at the run's thread count and in
the dtype the run computes in. Nothing is read from a table: the figures are what this machine did
in the last second, loaded as it is now (the title says so).

The probes measure achieved rates, not a datasheet's peak, so the row's utilisations (``mfu``,
``mbu``) are 1: the hours model must not discount a measured rate a second time. A CPU has no
NVLink or PCIe hop; those figures are the copy bandwidth (a weight sync is a memory copy here).

    hw = probe()                       # a drmas_trainer.forecast.hardware.Hardware
    print(hw.title, hw.bf16_flops / 1e9, "GFLOP/s")
    dc = decode_cost(model_shape("smollm2-135m-instruct"), torch.bfloat16)   # the hf engine's decode here
    print(dc.source)

A CPU decode step is neither of the two rates, so :func:`decode_cost` measures the hf engine's
decode itself: the rate at which decode-shaped products read the weights, and a step's other
costs on narrow random models of the model's family (docs/trainer.md, "This machine, measured").
"""

from __future__ import annotations

import inspect
import os
import statistics
import time
import types
from dataclasses import dataclass, replace
from typing import Any

import torch

from drmas_trainer.forecast.hardware import Hardware

HERE = "here"  # --gpu's name for this machine, measured
MATMUL_N = 512  # the probe's square matrices: a 135M model's products are 576 x 576 and 576 x 1536
COPY_MIB = 128  # bytes copied per repeat: 4 x the 32 MiB L3 of this machine, so the copy runs at memory speed


def _best_rate(work: float, fn, seconds: float) -> float:
    """``work`` per second of ``fn``'s fastest repeat within about ``seconds`` (at least 3 repeats)."""
    fn()  # warm-up: allocation, first-touch pages, thread pool start
    best = float("inf")
    t_end = time.perf_counter() + seconds
    n = 0
    while n < 3 or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        n += 1
    return work / best


def matmul_flops(dtype: torch.dtype = torch.float32, seconds: float = 0.3, n: int = MATMUL_N) -> float:
    """FLOP/s of an n x n by n x n matrix product (2 n^3 FLOPs) in ``dtype``."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dtype)
    b = torch.randn(n, n, generator=g).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    return _best_rate(2.0 * n ** 3, lambda: torch.matmul(a, b, out=out), seconds)


def copy_bytes_s(seconds: float = 0.3, mib: int = COPY_MIB) -> float:
    """Bytes/s of memory traffic copying a ``mib`` MiB tensor (read once and written once: 2 x its size)."""
    src = torch.ones(mib * 2 ** 20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return _best_rate(2.0 * src.numel() * 4, lambda: dst.copy_(src), seconds)


def host_memory_gib() -> float:
    """The machine's physical memory, GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30


def probe(dtype: torch.dtype = torch.float32, threads: int | None = None, seconds: float = 0.3) -> Hardware:
    """This machine's row: ``threads`` torch threads (None: as set now), products in ``dtype``."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        flops = matmul_flops(dtype, seconds)
        bw = copy_bytes_s(seconds)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    name = str(dtype).removeprefix("torch.")
    return Hardware(f"this machine's CPU, {used} thread(s), measured", host_memory_gib(), bw, flops, bw, bw, bw, 1,
                    f"measured now: {MATMUL_N}^3 {name} matmul {flops / 1e9:.1f} GFLOP/s, {COPY_MIB} MiB copy "
                    f"{bw / 1e9:.1f} GB/s", mfu=1.0, mbu=1.0)


# --- the hf engine's decode, measured (what a CPU decode step costs beyond a plain copy's bandwidth) ---
#
# On a CPU a decode step is neither the copy bandwidth nor the square-matmul rate: the products of a
# few rows by each weight matrix run at a fraction of the copy's bandwidth (measured here: 5-8 GB/s of
# bf16 or fp32 weights at 1-16 rows against 28 GB/s for a copy; the kernel repacks each matrix), and
# each layer's ops, each row's attention (the batch-invariant decode loops over rows) and the
# sampling over the vocabulary cost time of their own. Both are measured, not assumed.

DECODE_ROWS = 8  # the rows of a decode product: drmas_bench.engines.invariant.BLOCK (its padded block)
DECODE_MIB = 64  # weights a decode probe streams: twice this machine's 32 MiB L3, as a step's come from memory


def decode_bytes_s(dtype: torch.dtype = torch.float32, rows: int = DECODE_ROWS, seconds: float = 0.3,
                   mib: int = DECODE_MIB) -> float:
    """Bytes/s of weights read by decode-shaped products: ``rows`` x 1024 activations times 4096 x
    1024 weight matrices in ``dtype``, ``mib`` MiB of them, one after another (each read once)."""
    g = torch.Generator().manual_seed(0)
    k, n = 1024, 4096
    size = torch.empty((), dtype=dtype).element_size()
    ws = [torch.randn(n, k, generator=g).to(dtype) for _ in range(max(1, mib * 2 ** 20 // (n * k * size)))]
    x = torch.randn(rows, k, generator=g).to(dtype)

    def run() -> None:
        for w in ws:
            torch.nn.functional.linear(x, w)

    return _best_rate(float(len(ws) * n * k * size), run, seconds)


@dataclass(frozen=True)
class DecodeCost:
    """The hf engine's decode of one model family on this machine, measured (:func:`decode_cost`):
    ``weight_bytes_s``, the rate at which a step reads the weights; and what a step costs beyond its
    products, ``fixed + layers x per_layer`` seconds with ``fixed`` and ``per_layer`` each
    ``(at 1 row, at rows rows)`` and linear in the rows (the invariant decode's attention and
    sampling are per row). ``source`` says what was measured."""

    weight_bytes_s: float
    fixed: tuple[float, float]
    per_layer: tuple[float, float]
    source: str
    weight_bytes: int = 4  # bytes per parameter in the engine's dtype
    invariant: bool = True  # the batch-invariant decode (products on blocks of `rows` rows), else padded
    rows: int = DECODE_ROWS  # the rows of the second measured point, and of the invariant decode's blocks

    def step_overhead_s(self, rows: float, layers: int) -> float:
        """Seconds of one forward of ``rows`` rows beyond its products: linear in ``rows`` through
        the two measured points (at least 0)."""
        at = [f + layers * p for f, p in zip(self.fixed, self.per_layer)]
        slope = (at[1] - at[0]) / (self.rows - 1)
        return max(0.0, at[0] + slope * (rows - 1))


def _tiny_family_model(shape: Any, layers: int, dtype: torch.dtype) -> Any:
    """A random model of ``shape``'s family (Llama, Qwen2 or Qwen3) and vocabulary with ``layers``
    narrow layers: its products cost next to nothing, so its step time is the step's other costs."""
    from transformers import AutoConfig, AutoModelForCausalLM

    family = "qwen3" if shape.qk_norm else "qwen2" if shape.qkv_bias else "llama"
    cfg = AutoConfig.for_model(family, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16, num_hidden_layers=layers, vocab_size=shape.vocab,
                               tie_word_embeddings=False)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return m.eval().requires_grad_(False)


def _step_s(model: Any, rows: int, invariant: bool, steps: int = 40, prompt: int = 32) -> float:
    """Median seconds of a decode step of ``rows`` rows through the hf engine's decode path
    (invariant: drmas_bench.engines.invariant; else the padded batch over transformers' cache),
    the sampling and log-probs of drmas_bench.engines.decoding included."""
    from drmas_bench.engines import invariant as inv
    from drmas_bench.engines.decoding import sample

    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    gens = [torch.Generator().manual_seed(r) for r in range(rows)]
    temps, top_ps = torch.ones(rows), torch.ones(rows)
    times = []
    with torch.inference_mode():
        if invariant:
            inv.install(model)
            eng = types.SimpleNamespace(_hf_model=model, _logits_kw="logits_to_keep", forward_calls=0)
            kvs = [inv._KV(prompt + steps + 4) for _ in range(rows)]
            logits = torch.cat([inv._forward(eng, [kv], torch.randint(0, V, (1, prompt), generator=g),
                                             torch.arange(prompt)[None, :], False) for kv in kvs])
        else:
            kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
            out = model(input_ids=torch.randint(0, V, (rows, prompt), generator=g), use_cache=True, logits_to_keep=1)
            cache, logits = getattr(out, "cache", None) or out.past_key_values, out.logits[:, -1, :].float()
            mask = torch.ones(rows, prompt, dtype=torch.long)
        for i in range(steps + 3):
            t0 = time.perf_counter()
            tokens = sample(logits, temps, top_ps, gens)
            torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])
            if invariant:
                pos = torch.tensor([[kv.n] for kv in kvs])
                logits = inv._forward(eng, kvs, tokens[:, None], pos, True)
            else:
                mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=1)
                out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=torch.full((rows, 1), mask.shape[1] - 1),
                            use_cache=True, logits_to_keep=1, **{kw: cache})
                cache, logits = getattr(out, "cache", None) or out.past_key_values, out.logits[:, -1, :].float()
            if i >= 3:  # the first steps warm up
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode_cost(shape: Any, dtype: torch.dtype = torch.float32, invariant: bool = True,
                threads: int | None = None, seconds: float = 0.3) -> DecodeCost:
    """The hf engine's decode of ``shape``'s family and vocabulary in ``dtype`` on this machine,
    measured now: the decode products' weight bandwidth (:func:`decode_bytes_s`); per layer, the
    step time of a random narrow model of 9 layers less that of 1 layer, over 8 (a 256-token
    vocabulary, so the layers are all that differs); fixed, the step of a 1-layer narrow model with
    the real vocabulary (embedding, output layer, sampling and log-probs over it) less one layer;
    each at 1 and ``DECODE_ROWS`` rows."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        bw = decode_bytes_s(dtype, DECODE_ROWS if invariant else 1, seconds)
        small = replace(shape, vocab=256)
        models = {k: _tiny_family_model(small, k, dtype) for k in (1, 9)}
        real = _tiny_family_model(shape, 1, dtype)
        rows = (1, DECODE_ROWS)
        per_layer = tuple(max(0.0, (_step_s(models[9], r, invariant) - _step_s(models[1], r, invariant)) / 8)
                          for r in rows)
        fixed = tuple(max(0.0, _step_s(real, r, invariant) - p) for r, p in zip(rows, per_layer))
    finally:
        torch.set_num_threads(before)
    name = str(dtype).removeprefix("torch.")
    mode = "batch-invariant" if invariant else "padded"
    return DecodeCost(bw, fixed, per_layer,  # type: ignore[arg-type]
                      weight_bytes=torch.empty((), dtype=dtype).element_size(), invariant=invariant, source=
                      f"hf engine's {mode} decode in {name}, measured now: products at {bw / 1e9:.1f} GB/s of weights; "
                      f"a step's other costs {fixed[0] * 1e3:.2f} + {per_layer[0] * 1e3:.2f} ms per layer at 1 row, "
                      f"{fixed[1] * 1e3:.2f} + {per_layer[1] * 1e3:.2f} at {DECODE_ROWS}")
