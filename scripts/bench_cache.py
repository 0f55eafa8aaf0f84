"""The call cache's own cost per call against a model call on the hf engine (issue 26 item 4: under 2%).

    python scripts/bench_cache.py                       # tiny-random and smollm2-135m-instruct, JSON + lines
    python scripts/bench_cache.py --models tiny-random --calls 16 --json out.json

For each model, the same requests are sent (a) to the hf engine, one call at a time (the model call's
latency), and (b) through ``drmas_bench.call_cache.CachedEngine`` around an engine stand-in that answers at
once with the completions from (a): first every call a miss (key, lookup, the write after the engine
returned), then every call a hit (key, lookup, the stored completion rebuilt). (b) is then only the
cache's own work, with real prompt and completion sizes; the ratio is (b) / (a) per call. The sibling
``scripts/bench_sweep.py`` may import :func:`lookup_overhead`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WORDS = ("the sum of two numbers is seven and their product is twelve what is the larger one "
         "show your reasoning step by step then give the final answer in a box").split()


def _requests(n: int, prompt_words: int, max_new_tokens: int, seed: int = 0) -> list:
    from drmas_bench.types import Request, Sampling

    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(prompt_words))
        out.append(Request("solver", [{"role": "system", "content": "You are a careful solver."},
                                      {"role": "user", "content": text}],
                           Sampling(temperature=0.6, top_p=0.95, max_new_tokens=max_new_tokens, seed=1000 + i),
                           sample_idx=i % 4))
    return out


class _Answering:
    """An engine that answers at once with completions computed before (only the cache's work is timed)."""

    name = "stand-in"
    model = "stand-in"

    def __init__(self, completions: list) -> None:
        self.by_seed = {c[0]: c[1] for c in completions}

    async def generate(self, requests: list) -> list:
        from dataclasses import replace

        return [replace(self.by_seed[r.sampling.seed]) for r in requests]


def lookup_overhead(model: str = "tiny-random", calls: int = 16, prompt_words: int = 200, max_new_tokens: int = 32,
                    device: str = "cpu") -> dict[str, Any]:
    """Per-call seconds of a model call (hf engine, one call at a time) and of the cache's work on a
    miss and on a hit, and their ratios to the model call. -> a JSON-ready dict."""
    from drmas_bench.call_cache import CachedEngine, CallCache, group_identity
    from drmas_bench.engines import make_engine
    from drmas_bench.models import resolve_model
    from drmas_bench.files import model_identity

    reqs = _requests(calls, prompt_words, max_new_tokens)

    async def model_calls():
        engine = make_engine("hf", model, device=device, max_batch=1, max_wait_ms=0)
        try:
            await engine.generate([reqs[0]])  # warm-up (first-call allocations)
            got, times = [], []
            for r in reqs:
                t0 = time.perf_counter()
                [c] = await engine.generate([r])
                times.append(time.perf_counter() - t0)
                got.append((r.sampling.seed, c))
            return got, times
        finally:
            await engine.close()

    completions, model_s = asyncio.run(model_calls())
    where = resolve_model(model)
    mid = model_identity(where) if Path(str(where)).is_dir() else {"name": model}
    ident = group_identity("hf", model, mid, {"device": device})

    async def through_cache(cache: CallCache):
        wrapped = CachedEngine(_Answering(completions), cache, ident, {"model": model, "engine": "hf"})
        miss_s, hit_s = [], []
        for phase in (miss_s, hit_s):  # first pass: every call a miss (written), second: every call a hit
            for r in reqs:
                t0 = time.perf_counter()
                [c] = await wrapped.generate([r])
                phase.append(time.perf_counter() - t0)
        assert wrapped.hits == calls and wrapped.misses == calls
        return miss_s, hit_s

    with tempfile.TemporaryDirectory(prefix="drmas-bench-cache-") as d:
        with CallCache.open(d) as cache:
            miss_s, hit_s = asyncio.run(through_cache(cache))
    m = statistics.median(model_s)
    out = {
        "model": model, "device": device, "calls": calls, "prompt_words": prompt_words, "max_new_tokens": max_new_tokens,
        "prompt_tokens": statistics.median(c.prompt_tokens for _, c in completions),
        "completion_tokens": statistics.median(c.completion_tokens for _, c in completions),
        "model_call_s": m,
        "miss_overhead_s": statistics.median(miss_s),
        "hit_lookup_s": statistics.median(hit_s),
    }
    out["miss_ratio"] = out["miss_overhead_s"] / m
    out["hit_ratio"] = out["hit_lookup_s"] / m
    out["hit_speedup"] = m / out["hit_lookup_s"]
    return out


def line(r: dict[str, Any]) -> str:
    return (f"{r['model']} ({r['device']}, prompt {r['prompt_tokens']:.0f} tok, {r['completion_tokens']:.0f} new): model call "
            f"{r['model_call_s'] * 1e3:.1f} ms; cache work on a miss {r['miss_overhead_s'] * 1e6:.0f} us "
            f"({100 * r['miss_ratio']:.3f}% of the call), a hit {r['hit_lookup_s'] * 1e6:.0f} us "
            f"({100 * r['hit_ratio']:.3f}%, {r['hit_speedup']:.0f}x faster than the call)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny-random,smollm2-135m-instruct")
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--prompt-words", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    results = [lookup_overhead(m, args.calls, args.prompt_words, args.max_new_tokens, args.device)
               for m in args.models.split(",")]
    for r in results:
        print(line(r))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    worst = max(r["miss_ratio"] for r in results)
    print(f"worst cache overhead: {100 * worst:.3f}% of a model call ({'under' if worst < 0.02 else 'OVER'} the 2% bound)")
    return 0 if worst < 0.02 else 1


if __name__ == "__main__":
    sys.exit(main())
