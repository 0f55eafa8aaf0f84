"""Benchmark the pool: a 3-agent non-shared team (three copies of one model, three worker groups with
separate engines) under memory budgets of 1, 2 and 3 models, next to a reference where ONE worker
group serves all three agents (the memory floor: one model resident, no pool switching).

    python scripts/bench_pool.py                                   # SmolLM2-135M: alone,1,2,3
    python scripts/bench_pool.py --model tiny-random --episodes 12 # quick
    python scripts/bench_pool.py --budgets 1,none --json out.json  # "none" = unlimited

Each budget runs in its own subprocess, so its peak RSS (``VmHWM``) is the peak of that run
alone. The load imitates the search workflow: ``--episodes`` episodes (``--concurrency`` at a time)
each call verifier -> searcher -> (a short "retrieval" pause) -> answerer, every prompt carrying the
previous agent's output, so 3 agents x ``--episodes`` requests arrive interleaved. Every request has
its own seed, so the completions must be identical under every budget; the script checks it and
exits non-zero if they differ.

Columns: ``peak RSS`` (whole process), ``over base`` (peak minus the RSS after importing the model's
code and reading its tokenizer, before any weights), ``load peak`` (peak RSS while the engines were created), ``footprint`` (one engine's parameters + buffers), ``load s`` (creating the three engines),
``serve s`` (the request load), ``batches`` / ``forwards`` (engine batches and model forward passes,
summed over the engines), ``wakes`` / ``sleeps`` / ``wake s`` (pool counters after loading),
``digest`` (hash of every completion's token ids).

Options: ``--model`` (alias or folder), ``--budgets`` (comma list of model counts or ``none``),
``--episodes``, ``--concurrency``, ``--max-new-tokens``, ``--temperature``, ``--device``
(``cpu`` | ``cuda`` | ``auto``), ``--max-batch``, ``--json PATH`` (write all rows),
``--worker`` (internal: run one budget in this process and print one JSON line).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

AGENTS = ("verifier", "searcher", "answerer")
SYSTEM = {
    "verifier": "You check whether the notes answer the question. Reply yes or no, with one reason.",
    "searcher": "You write one short web search query that would help answer the question.",
    "answerer": "You answer the question in a few words using the notes.",
}
QUESTIONS = [
    "Which river flows through the capital of Austria?",
    "Who wrote the novel that introduced Sherlock Holmes?",
    "What is the largest moon of Saturn?",
    "In which year did the first person walk on the Moon?",
    "Which element has the chemical symbol Fe?",
    "What language is mainly spoken in Brazil?",
    "Which composer wrote the Four Seasons?",
    "What is the tallest mountain in Africa?",
]


def rss_now() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def seed_for(episode: int, agent: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{episode}/{agent}".encode()).digest()[:4], "big") & 0x7FFFFFFF


async def run_load(pool: Any, args: argparse.Namespace, wg: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The synthetic search-like load: one record per request, in (episode, agent) order. ``wg`` maps
    agent -> worker group (default: each agent its own group named after it)."""
    wg = wg or {a: a for a in AGENTS}
    from drmas_bench.types import Request, Sampling

    sem = asyncio.Semaphore(args.concurrency)

    def request(e: int, agent: str, notes: str) -> Request:
        q = QUESTIONS[e % len(QUESTIONS)]
        user = f"Question: {q}\nNotes: {notes[:300] or 'none yet'}"
        return Request(agent, [{"role": "system", "content": SYSTEM[agent]}, {"role": "user", "content": user}],
                       Sampling(temperature=args.temperature, top_p=0.95, max_new_tokens=args.max_new_tokens,
                                seed=seed_for(e, agent)))

    async def episode(e: int) -> list[dict[str, Any]]:
        async with sem:
            out = []
            [v] = await pool.generate(wg["verifier"], [request(e, "verifier", "")])
            [s] = await pool.generate(wg["searcher"], [request(e, "searcher", v.text)])
            await asyncio.sleep(0.01 + 0.01 * (e % 5))  # "retrieval"
            [a] = await pool.generate(wg["answerer"], [request(e, "answerer", s.text)])
            for agent, c in zip(AGENTS, (v, s, a)):
                out.append({"episode": e, "agent": agent, "token_ids": c.token_ids, "text": c.text})
            return out

    rows = await asyncio.gather(*(episode(e) for e in range(args.episodes)))
    return [r for ep in rows for r in ep]


def import_model_code(model: str) -> None:
    """Import everything loading ``model`` will import (torch, transformers, the architecture's
    modeling module, the tokenizer classes), so the baseline RSS holds the code and not the weights."""
    import torch  # noqa: F401
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    import drmas_bench.engines.hf  # noqa: F401
    from drmas_bench.engines.base import resolve_model_path

    path = resolve_model_path(model)
    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(path))]
    AutoTokenizer.from_pretrained(path)


async def worker(args: argparse.Namespace) -> dict[str, Any]:
    from drmas_bench.pool import EngineSpec, LocalPool
    from drmas_bench.engines.footprint import peak_rss_bytes

    import_model_code(args.model)
    base = rss_now()
    alone = args.budget == "alone"  # reference: ONE worker group serves all three agents
    budget = None if args.budget in ("none", "inf", "alone") else float(args.budget)
    opts = {"device": args.device, "max_batch": args.max_batch}
    names = ("shared",) if alone else AGENTS
    specs = {a: EngineSpec("hf", args.model, dict(opts)) for a in names}
    pool = LocalPool(specs, budget_models=budget)
    t0 = time.perf_counter()
    await pool.start()
    load_s = time.perf_counter() - t0
    after_load = pool.stats()
    t0 = time.perf_counter()
    rows = await run_load(pool, args, {a: "shared" for a in AGENTS} if alone else None)
    serve_s = time.perf_counter() - t0
    st = pool.stats()
    engines = [pool.engine(n) for n in names]
    batches = sum(getattr(getattr(e, "stats", None), "batches", 0) for e in engines)
    forwards = sum(getattr(e, "forward_calls", 0) for e in engines)
    await pool.close()
    fp = max(g["footprint_bytes"] or 0 for g in st["groups"].values())
    digest = hashlib.sha256(json.dumps([[r["episode"], r["agent"], r["token_ids"]] for r in rows]).encode()).hexdigest()
    peak = peak_rss_bytes()  # this process's own VmHWM (ru_maxrss would hold the parent's peak)
    return {
        "budget_models": budget,
        "budget_bytes": st["budget_bytes"],
        "footprint_bytes": fp,
        "base_rss_bytes": base,
        "peak_rss_bytes": max(peak, st["peak_rss_bytes"]),
        "pool_peak_rss_bytes": st["peak_rss_bytes"],
        "load_peak_rss_bytes": after_load["peak_rss_bytes"],
        "peak_cuda_bytes": st["peak_cuda_bytes"],
        "peak_resident_bytes": st["peak_resident_bytes"],
        "load_s": load_s,
        "serve_s": serve_s,
        "requests": st["requests"],
        "wakes": st["wakes"] - after_load["wakes"],
        "sleeps": st["sleeps"] - after_load["sleeps"],
        "wake_s": st["wake_s"] - after_load["wake_s"],
        "engine_batches": batches,
        "forward_calls": forwards,
        "wakes_by_group": {g: v["wakes"] - after_load["groups"][g]["wakes"] for g, v in st["groups"].items()},
        "digest": digest,
        "sample": rows[0]["text"][:60],
    }


LABELS = {"none": "unlimited", "inf": "unlimited", "alone": "1 shared wg (ref)"}


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--budgets", default="alone,1,2,3", help="comma list of model counts, 'none' (unlimited) or "
                    "'alone' (reference: one worker group serves all agents); default alone,1,2,3")
    ap.add_argument("--episodes", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--json", help="write every row to this JSON file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--budget", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        print(json.dumps(asyncio.run(worker(args))))
        return 0

    rows = []
    for b in [x.strip() for x in args.budgets.split(",") if x.strip()]:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--budget", b, "--model", args.model,
               "--episodes", str(args.episodes), "--concurrency", str(args.concurrency),
               "--max-new-tokens", str(args.max_new_tokens), "--temperature", str(args.temperature),
               "--device", args.device, "--max-batch", str(args.max_batch)]
        env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            print(f"bench_pool: the run with budget {b} failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["budget"] = b
        rows.append(row)
        print(f"budget {b}: done in {row['load_s'] + row['serve_s']:.1f} s", file=sys.stderr)

    from tabulate import tabulate

    same = len({r["digest"] for r in rows}) == 1
    table = [[
        LABELS.get(r["budget"], f"{r['budget']} model(s)"),
        mib(r["peak_rss_bytes"]), mib(r["peak_rss_bytes"] - r["base_rss_bytes"]), mib(r["load_peak_rss_bytes"]),
        mib(r["footprint_bytes"]),
        mib(r["peak_cuda_bytes"]) if r["peak_cuda_bytes"] is not None else "-",
        f"{r['load_s']:.1f}", f"{r['serve_s']:.1f}", r["requests"], r.get("engine_batches", "-"),
        r.get("forward_calls", "-"), r["wakes"], r["sleeps"], f"{r['wake_s']:.2f}",
        r["digest"][:12],
    ] for r in rows]
    print(f"model {args.model}, 3 worker groups, {args.episodes} episodes x 3 agents, concurrency "
          f"{args.concurrency}, {args.max_new_tokens} new tokens, device {args.device}; base RSS "
          f"{mib(rows[0]['base_rss_bytes'])}")
    print(tabulate(table, headers=["budget", "peak RSS", "over base", "load peak", "footprint", "peak CUDA", "load s",
                                   "serve s", "requests", "batches", "forwards", "wakes", "sleeps", "wake s",
                                   "digest"],
                   tablefmt="github"))
    print(f"completions identical across budgets: {'yes' if same else 'NO'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k not in ("worker", "budget")},
                                               "rows": rows, "identical": same}, indent=2))
    return 0 if same else 2


if __name__ == "__main__":
    sys.exit(main())
