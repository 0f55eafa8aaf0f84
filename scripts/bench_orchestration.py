"""Episodes/s of the concurrent, micro-batched runner vs the same episodes one at a time.

    python scripts/bench_orchestration.py                 # tiny-random, toy workflow, 8/32/128 episodes
    python scripts/bench_orchestration.py --model smollm2-135m-instruct --sizes 8,32
    python scripts/bench_orchestration.py --workflow math_refine --sizes 32   # the 2b protocol's prompt building

Both sides run the real runner (`drmas_bench.runner.run_episodes`) with the real hf engine in the
same process: "batched" lets C episodes run at once and the engine batch up to C calls; "one at a
time" runs one episode at a time with batches of one. Harness overhead = the share of the batched
run's wall time spent outside the engine's batched forward passes (prompt building, scheduling,
grading, bookkeeping).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def run(model: str, n_episodes: int, concurrent: bool, max_new_tokens: int, workflow: str = "toy") -> dict:
    from drmas_bench.agents.team import build_team
    from drmas_bench.engines import make_engine
    from drmas_bench.runner import EpisodeRun, TeamRuntime, run_episodes
    from drmas_bench.suites.toy.benchmarks import make_toy_tasks
    from drmas_bench.types import Sampling
    from drmas_bench.workflows import get_workflow

    wf = get_workflow(workflow)  # toy tasks also serve math_refine (its prompts, parsing and math grading)
    team = build_team(workflow, wf.agents, model=model)
    tasks = make_toy_tasks(n_episodes, seed=99)

    async def go() -> dict:
        engine = make_engine("hf", model, max_batch=n_episodes if concurrent else 1, max_wait_ms=2.0)
        busy = [0.0]
        inner = engine.batcher.run_batch

        def timed(items):
            t = time.perf_counter()
            try:
                return inner(items)
            finally:
                busy[0] += time.perf_counter() - t

        engine.batcher.run_batch = timed
        runtime = TeamRuntime(team, {"shared": engine}, Sampling(max_new_tokens=max_new_tokens))
        t0 = time.perf_counter()
        stats = await run_episodes(tasks, 1, EpisodeRun(runtime, wf, seed=0, progress=False,
                                                         concurrency=n_episodes if concurrent else 1))
        wall = time.perf_counter() - t0
        batches = engine.stats.batches
        await engine.close()
        return {"wall": wall, "busy": busy[0], "episodes": stats.episodes, "calls": stats.engine_calls, "batches": batches}

    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--sizes", default="8,32,128", help="concurrent episodes to compare")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--workflow", default="toy", choices=["toy", "math_refine"], help="episode function (default toy)")
    args = ap.parse_args()
    from tabulate import tabulate

    run(args.model, 4, True, args.max_new_tokens, args.workflow)  # warm-up: load, first-call costs
    rows = []
    for c in [int(x) for x in args.sizes.split(",")]:
        b = run(args.model, c, True, args.max_new_tokens, args.workflow)
        s = run(args.model, c, False, args.max_new_tokens, args.workflow)
        rows.append([c, b["calls"], b["batches"], f"{c / b['wall']:.2f}", s["batches"], f"{c / s['wall']:.2f}",
                     f"{s['wall'] / b['wall']:.1f}x", f"{100 * (1 - b['busy'] / b['wall']):.1f}%"])
    print(f"model {args.model}, {args.workflow} workflow, {args.max_new_tokens} new tokens per call, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, load average {os.getloadavg()[0]:.1f}")
    print(tabulate(rows, headers=["episodes", "calls", "batches", "batched ep/s", "serial batches",
                                  "one-at-a-time ep/s", "speed-up", "harness overhead (batched)"], tablefmt="github"))


if __name__ == "__main__":
    main()
