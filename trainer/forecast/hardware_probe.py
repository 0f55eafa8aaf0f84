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
"""

from __future__ import annotations

import os
import time

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
