"""The FSDP step of scripts/gpu_smoke.sh: a worker group sharded over 2 GPUs (FSDP2, NCCL) makes
two AdamW steps on random rows of a model, and its weights are compared with a single-process group
on the same rows; prints one ``RESULT {json}`` line (max |diff|, seconds, peak memory per rank).

    python scripts/fsdp_smoke.py --model DIR --device cuda     # needs 2 GPUs, else SKIP (exit 3)
    python scripts/fsdp_smoke.py --model DIR --device cpu      # the same with 2 gloo processes

Exit 0 when the weights agree within --atol (and the steps moved them by more than 10 x --atol),
1 when not, 3 (SKIP) with fewer than 2 GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import torch

from drmas_trainer.config.train import AgentConfig
from drmas_trainer.fsdp.sharding import spawn_ranks
from drmas_trainer.worker import LossSettings, Row, WorkerGroup


def rows(n: int, seed: int, vocab: int, prompt: int, response: int) -> list[Row]:
    rng = random.Random(seed)
    return [Row("solver", [rng.randrange(5, vocab) for _ in range(prompt)], [rng.randrange(5, vocab) for _ in range(response)],
                [-rng.uniform(0.5, 6) for _ in range(response)], rng.uniform(-1, 1)) for _ in range(n)]


def settings(dtype: str) -> AgentConfig:
    return AgentConfig(lr=1e-4, micro_batch_size=2, dtype=dtype, gradient_checkpointing=True)


def one_rank(rank: int, world: int, model: str, device: str, dtype: str, rs: list[Row]) -> dict:
    from drmas_trainer.fsdp.worker import ShardedWorkerGroup

    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    wg = ShardedWorkerGroup("solver", ["solver"], settings(dtype), model, rank=rank, world=world, init_method="",
                            device=dev)
    t0 = time.perf_counter()
    out = asyncio.run(wg.update(rs, loss=LossSettings(), mini_batches=2))
    secs = time.perf_counter() - t0
    state = {k: wg._full(v).detach().float().cpu() for k, v in wg.policy.state_dict().items()}
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
    return {"grad_norm": out["grad_norm"], "seconds": secs, "peak_gib": peak, "state": state if rank == 0 else {}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model folder (HF causal LM)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--atol", type=float, default=2e-5, help="max |weight difference| allowed (lr 1e-4: 20 %% of a step)")
    a = ap.parse_args()
    if a.device == "cuda" and torch.cuda.device_count() < 2:
        print(f"SKIP fsdp: {torch.cuda.device_count()} GPU(s) visible; the FSDP step needs 2")
        return 3
    single = WorkerGroup("solver", ["solver"], settings(a.dtype), a.model, device="cuda:0" if a.device == "cuda" else "cpu")
    rs = rows(a.rows, 0, int(single.policy.config.vocab_size), a.prompt, a.response)
    before = {k: v.detach().float().cpu().clone() for k, v in single.policy.state_dict().items()}
    asyncio.run(single.update(rs, loss=LossSettings(), mini_batches=2))
    ref = {k: v.detach().float().cpu() for k, v in single.policy.state_dict().items()}
    del single
    if a.device == "cuda":
        torch.cuda.empty_cache()
    got = spawn_ranks(one_rank, 2, a.model, a.device, a.dtype, rs, device=a.device)
    diff = max(float((got[0]["state"][k] - ref[k]).abs().max()) for k in ref)
    moved = max(float((before[k] - ref[k]).abs().max()) for k in ref)  # the steps did change the weights
    print("RESULT " + json.dumps({"ranks": 2, "device": a.device, "dtype": a.dtype, "max_abs_diff": diff,
                                  "max_step": moved,
                                  "update_s": round(max(g["seconds"] for g in got), 2),
                                  "peak_gib_per_rank": [round(g["peak_gib"], 2) for g in got]}))
    return 0 if diff <= a.atol and moved > 10 * a.atol else 1


if __name__ == "__main__":
    sys.exit(main())
