"""Throughput of one engine under many concurrent callers (the way workflows use engines).

Examples:
    python scripts/bench_engine.py --engine hf --model tiny-random --requests 64 --max-new-tokens 32
    python scripts/bench_engine.py --engine hf --model smollm2-135m-instruct -o max_batch=16
    python scripts/bench_engine.py --engine openai --model tiny -o base_url=http://127.0.0.1:8000/v1

Options:
    --engine           backend kind (hf | openai | sglang)
    --model            alias, folder or hub id (openai: the served model name)
    --requests         number of requests, each from its own coroutine
    --max-new-tokens   per request
    --temperature      sampling temperature (top_p 0.95, seed = request index)
    -o KEY=VALUE       an engine option (repeatable); VALUE is parsed as YAML (16, true, {a: 1})
Prints one JSON line: start_s, wall_s, req_per_s, tokens_per_s, latency p50/p95, batches.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import yaml

from drmas_bench.engines import make_engine
from drmas_bench.types import Request, Sampling, UserError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE")
    return ap.parse_args(argv)


async def bench(args: argparse.Namespace) -> dict:
    opts = {}
    for kv in args.option:
        key, sep, value = kv.partition("=")
        if not sep:
            raise UserError(f"-o expects KEY=VALUE, got {kv!r}")
        opts[key] = yaml.safe_load(value)
    t0 = time.perf_counter()
    eng = make_engine(args.engine, args.model, **opts)
    start_s = time.perf_counter() - t0
    reqs = [
        Request(
            "bench",
            [{"role": "user", "content": f"Question {i}: what is {i} + {i * 7}? " * (1 + i % 4)}],
            Sampling(temperature=args.temperature, top_p=0.95, max_new_tokens=args.max_new_tokens, seed=i),
        )
        for i in range(args.requests)
    ]
    await eng.generate(reqs[:1])  # warm-up
    t1 = time.perf_counter()
    outs = await asyncio.gather(*(eng.generate([r]) for r in reqs))
    wall = time.perf_counter() - t1
    comps = [o[0] for o in outs]
    lat = sorted(c.latency_s for c in comps)
    toks = sum(c.completion_tokens for c in comps)
    stats = getattr(eng, "stats", None)
    await eng.close()
    return {
        "engine": args.engine,
        "model": args.model,
        "requests": args.requests,
        "start_s": round(start_s, 2),
        "wall_s": round(wall, 3),
        "req_per_s": round(args.requests / wall, 2),
        "tokens": toks,
        "tokens_per_s": round(toks / wall, 1),
        "latency_p50_s": round(statistics.median(lat), 3),
        "latency_p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 3),
        "batches": getattr(stats, "batches", None),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        print(json.dumps(asyncio.run(bench(args))))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
