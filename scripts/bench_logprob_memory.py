"""Peak memory of the trainer's log-prob computation: the chunked path (``head_logprobs``, what the
worker groups run) against the full-logits path it replaced (``full_head_logprobs``), at a real
vocabulary size.

    python scripts/bench_logprob_memory.py                        # CPU: V 151,936, 4096 tokens, hidden 1024
    python scripts/bench_logprob_memory.py --device cuda --tokens 16384 --dtype bfloat16
    python scripts/bench_logprob_memory.py --tokens 512 --vocab 32000 --hidden 256   # quick

Both variants compute, from the same hidden states ``h`` [tokens, hidden] and output layer ``W``
[vocab, hidden] (seeded random), the log-probs of random targets and the per-token entropy, then
backpropagate ``sum(g * logp)`` (+ ``sum(g2 * entropy)`` with ``--entropy-grad``) into ``h`` and
``W``. The baseline is the trainer's old path (all [tokens, vocab] float32 logits, entropy with
gradients whatever its coefficient); ours runs the entropy without gradients unless
``--entropy-grad`` (the trainer's rule: gradients only when ``entropy_coef`` != 0).

Each variant runs in its own subprocess. Peak memory: on CUDA ``torch.cuda.max_memory_allocated``
after the inputs exist (so: the computation's own peak); on CPU the process's RSS high-water mark
(``VmHWM`` in /proc/self/status) minus its RSS once the inputs exist. ``inputs`` is what both
variants hold anyway (h, W and W's gradient are counted in the peak: W's gradient is needed by any
path). The parent compares the variants' log-probs, entropies and gradients (max |difference|) and
exits 1 when log-probs differ by more than ``--tol`` (1e-5) or the ratio is below ``--min-ratio``.

Options: ``--tokens``, ``--vocab``, ``--hidden``, ``--chunk`` (tokens per projection, the worker's
``logprob_chunk``), ``--device`` (cpu | cuda | auto), ``--dtype`` (float32 | bfloat16: the matmul
dtype, as under bf16 autocast), ``--entropy-grad``, ``--seed``, ``--tol``, ``--min-ratio`` (0 = no
check), ``--json PATH``, ``--worker VARIANT OUT`` (internal).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = ("chunked", "full")


def rss_kib(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process in KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def run_worker(variant: str, out: str, args: argparse.Namespace) -> None:
    """One variant in this process: inputs, forward + backward, peak memory; results to ``out``."""
    import torch

    from drmas_trainer.logprobs import full_head_logprobs, head_logprobs

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1)))
    dev = torch.device(args.device)
    cdtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(args.seed)
    h = torch.randn(args.tokens, args.hidden, generator=gen).to(dev).requires_grad_()
    w = (torch.randn(args.vocab, args.hidden, generator=gen) * 0.02).to(dev).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=gen).to(dev)
    g_lp = torch.randn(args.tokens, generator=gen).to(dev)
    g_ent = torch.randn(args.tokens, generator=gen).to(dev)
    w.grad = torch.zeros_like(w)  # W's gradient exists in every variant (the trainer keeps it): count it as input
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    base_rss = rss_kib("VmRSS") * 1024
    t0 = time.perf_counter()
    if variant == "chunked":
        lp, ent = head_logprobs(h, w, None, targets, chunk=args.chunk, entropy_grad=args.entropy_grad, cdtype=cdtype)
    else:  # the old trainer path: entropy always with gradients
        lp, ent = full_head_logprobs(h, w, None, targets, entropy_grad=True, cdtype=cdtype)
    loss = (g_lp * lp).sum()
    if args.entropy_grad:
        loss = loss + (g_ent * ent).sum()
    loss.backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = rss_kib("VmHWM") * 1024 - base_rss
    seconds = time.perf_counter() - t0
    torch.save({"logp": lp.detach().cpu(), "entropy": ent.detach().cpu(), "grad_h": h.grad.cpu(),
                "grad_w": w.grad.cpu(), "peak": peak, "seconds": seconds,
                "inputs": (h.numel() + 2 * w.numel()) * 4}, out)


def run_variant(variant: str, out: Path, args: argparse.Namespace) -> None:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", variant, str(out)] + passthrough(args)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"bench_logprob_memory: variant {variant} failed (exit {proc.returncode}): " + " | ".join(tail))


def passthrough(args: argparse.Namespace) -> list[str]:
    out = ["--tokens", str(args.tokens), "--vocab", str(args.vocab), "--hidden", str(args.hidden),
           "--chunk", str(args.chunk), "--device", args.device, "--dtype", args.dtype, "--seed", str(args.seed)]
    return out + (["--entropy-grad"] if args.entropy_grad else [])


def gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def compare(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-logprob-") as tmp:
        for v in VARIANTS:
            run_variant(v, Path(tmp) / f"{v}.pt", args)
            res[v] = torch.load(Path(tmp) / f"{v}.pt", weights_only=True)
    a, b = res["chunked"], res["full"]
    diffs = {k: float((a[k].float() - b[k].float()).abs().max()) for k in ("logp", "entropy", "grad_h", "grad_w")}
    return {
        "device": args.device, "dtype": args.dtype, "tokens": args.tokens, "vocab": args.vocab, "hidden": args.hidden,
        "chunk": args.chunk, "entropy_grad": args.entropy_grad, "inputs_bytes": a["inputs"],
        "peak_chunked": a["peak"], "peak_full": b["peak"], "ratio": b["peak"] / max(1, a["peak"]),
        "seconds_chunked": a["seconds"], "seconds_full": b["seconds"],
        "max_abs_diff": diffs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--entropy-grad", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--min-ratio", type=float, default=4.0)
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs=2, metavar=("VARIANT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.worker:
        run_worker(args.worker[0], args.worker[1], args)
        return 0
    r = compare(args)
    where = "CUDA max_memory_allocated" if args.device.startswith("cuda") else "CPU RSS high-water"
    print(f"log-prob memory, {where}: {r['tokens']} tokens x V {r['vocab']:,}, hidden {r['hidden']}, "
          f"{r['dtype']} matmuls, chunk {r['chunk']}, entropy grad {'on' if r['entropy_grad'] else 'off (coef 0)'}; "
          f"inputs (h, W, W.grad) {gib(r['inputs_bytes'])}")
    print(f"{'variant':<10} {'peak over inputs':>17} {'seconds':>8}")
    print(f"{'full':<10} {gib(r['peak_full']):>17} {r['seconds_full']:>8.1f}")
    print(f"{'chunked':<10} {gib(r['peak_chunked']):>17} {r['seconds_chunked']:>8.1f}")
    d = r["max_abs_diff"]
    print(f"ratio full / chunked: {r['ratio']:.1f}x; max |diff| logp {d['logp']:.2e}, entropy {d['entropy']:.2e}, "
          f"grad h {d['grad_h']:.2e}, grad W {d['grad_w']:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    fails = []
    if args.dtype == "float32" and d["logp"] > args.tol:
        fails.append(f"log-probs differ by {d['logp']:.2e} > {args.tol}")
    if args.min_ratio and r["ratio"] < args.min_ratio:
        fails.append(f"peak ratio {r['ratio']:.2f} < {args.min_ratio}")
    for f in fails:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
