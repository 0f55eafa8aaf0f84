"""Grading throughput: `grade_math_many` (process pool, hard timeouts) vs a one-by-one loop.

Builds `--pairs` (response, gold) pairs from MATH500 gold answers with perturbed predictions:
the gold itself, equivalent rewrites that need the symbolic path (`a/b` for `\\frac{a}{b}`, `x=`,
decimals, `2\\cdot\\frac{g}{2}`), other rows' golds (wrong), integer neighbours (wrong), and
responses with no box; each wrapped in some chain-of-thought text, some with a think block.
Grades them one by one in this process (the baseline, caches cleared), then with
`grade_math_many`: on its first call (the forkserver and the workers start inside the timing), on
new workers, and on a warm pool (workers started on other answers, caches cold for these), best of
`--repeat` runs each. Prints a table, the CPU seconds each side used (what the speed-up would be
with the CPUs free: on a shared machine, other sessions' load caps what the pool can get), and
fails if the pool lost or reordered any result (it must agree item by item with the baseline).

Example:
    python scripts/bench_grading.py --data-dir ../shared/data --pairs 5000 --workers 2
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time
from collections import Counter

from tabulate import tabulate

from drmas_bench.grading import GradingPool, grade_math_many, grade_one, shutdown_shared_pools
from drmas_bench.grading.latex import latex_to_sympy
from drmas_bench.grading.latex import to_sympy
from drmas_bench.grading.normalize import _normalize
from drmas_bench.benchmarks import load_tasks

FILLER = "We expand, simplify and check the cases one by one. "


def perturb(gold: str, other: str, rng: random.Random) -> tuple[str, str]:
    """(kind, predicted answer) for one gold: equal, rewritten, wrong, or missing."""
    kind = rng.choices(["same", "rewrite", "other", "neighbour", "nobox"], weights=[30, 30, 25, 10, 5])[0]
    if kind == "same":
        return kind, gold
    if kind == "rewrite":
        if gold.lstrip("-").isdigit():
            return kind, rng.choice([f"{gold}.0", f"x = {gold}", f"{gold}^{{1}}"])
        m = re.fullmatch(r"\\frac\{([^{}]+)\}\{([^{}]+)\}", gold)
        if m:
            return kind, f"({m.group(1)})/({m.group(2)})"
        return kind, rng.choice([f"2\\cdot\\frac{{{gold}}}{{2}}", f"\\left({gold}\\right)", f"1+{gold}-1"])
    if kind == "other":
        return kind, other
    if kind == "neighbour":
        return kind, str(int(gold) + 1) if gold.lstrip("-").isdigit() else f"{gold}+1"
    return kind, ""


def make_pairs(golds: list[str], n: int, seed: int = 0) -> tuple[list[tuple[str, str]], list[str]]:
    rng = random.Random(seed)
    pairs, kinds = [], []
    for i in range(n):
        gold = golds[i % len(golds)]
        kind, pred = perturb(gold, golds[rng.randrange(len(golds))], rng)
        text = FILLER * rng.randint(1, 30)
        if rng.random() < 0.2:
            text = f"<think>{text} maybe \\boxed{{0}}</think> " + FILLER
        response = text + (f"So the answer is $\\boxed{{{pred}}}$." if kind != "nobox" else "I am not sure.")
        pairs.append((response, gold))
        kinds.append(kind)
    return pairs, kinds


def clear_caches() -> None:
    """Forget parsed answers and sympy's own caches, so the baseline starts as cold as a new worker."""
    from sympy.core.cache import clear_cache

    to_sympy.cache_clear()
    latex_to_sympy.cache_clear()
    _normalize.cache_clear()
    clear_cache()


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_estimate(pairs, warmup, args) -> str | None:
    """CPU seconds of the baseline vs each pool worker on the same pairs (Linux only): what the
    speed-up would be with the CPUs free, independent of other load on the machine."""
    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        return None
    clear_caches()
    c0 = time.process_time()
    for r, g in pairs:
        grade_one(r, g)
    base = time.process_time() - c0
    with GradingPool(args.workers) as pool:
        pool.grade(warmup, timeout_s=args.timeout)
        pids = [w.proc.pid for w in pool.workers]
        before = [_cpu_seconds(p) for p in pids]
        c0 = time.process_time()
        pool.grade(pairs, timeout_s=args.timeout)
        parent = time.process_time() - c0
        used = [_cpu_seconds(p) - b for p, b in zip(pids, before)]
    return (f"CPU seconds: baseline {base:.2f}; pool workers {', '.join(f'{u:.2f}' for u in used)} "
            f"(parent {parent:.2f}) -> with free CPUs the warm pool would be about "
            f"{base / max(max(used), parent, 1e-9):.2f}x the baseline")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", required=True, help="folder holding math/math500/test.jsonl")
    ap.add_argument("--pairs", type=int, default=5000, help="number of (response, gold) pairs (default 5000)")
    ap.add_argument("--workers", type=int, default=None, help="pool processes (default: usable CPUs, at most 8)")
    ap.add_argument("--timeout", type=float, default=5.0, help="per-item timeout of the pool in seconds (default 5)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each grader; the best time is reported (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    golds = [t.answers[0] for t in load_tasks("math500", args.data_dir)]
    pairs, kinds = make_pairs(golds, args.pairs, args.seed)
    # warms a pool's processes without warming its caches for `pairs` (different golds)
    warmup, _ = make_pairs([t.answers[0] for t in load_tasks("olympiadbench", args.data_dir)], 200, args.seed)
    many = lambda ps: grade_math_many(ps, timeout_s=args.timeout, workers=args.workers)  # noqa: E731

    loop_s, cold_s, warm_s, outputs = [], [], [], []
    for _ in range(args.repeat):
        clear_caches()
        t, baseline = timed(lambda: [grade_one(r, g) for r, g in pairs])
        loop_s.append(t)
        shutdown_shared_pools()  # cold: worker start-up included (and the forkserver's, first time)
        t, got = timed(lambda: many(pairs))
        cold_s.append(t)
        outputs.append(("cold", got))
        shutdown_shared_pools()  # warm: processes started, caches cold for these pairs
        many(warmup)
        t, got = timed(lambda: many(pairs))
        warm_s.append(t)
        outputs.append(("warm", got))
    shutdown_shared_pools()

    n = len(pairs)
    t_loop, t_warm = min(loop_s), min(warm_s)
    rows = [["one-by-one loop in-process (baseline)", f"{t_loop:.2f}", f"{n / t_loop:.0f}", "1.00x"]]
    timed_rows = [("grade_math_many, first call (starts the server and workers)", cold_s[0])]
    if len(cold_s) > 1:
        timed_rows.append(("grade_math_many, new workers (server running)", min(cold_s[1:])))
    timed_rows.append(("grade_math_many, warm pool", t_warm))
    rows += [[name, f"{t:.2f}", f"{n / t:.0f}", f"{t_loop / t:.2f}x"] for name, t in timed_rows]
    print(f"{n} pairs from MATH500, workers={args.workers or 'default'}, timeout={args.timeout:g}s, "
          f"best of {args.repeat} runs, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} (other processes compete for the same CPUs when it exceeds the CPU count)")
    print(tabulate(rows, ["grader", "seconds", "items/s", "speed-up"], tablefmt="github", disable_numparse=True))
    by_kind = Counter((k, b.correct) for k, b in zip(kinds, baseline))
    print("pairs by kind (correct/incorrect):",
          ", ".join(f"{k} {by_kind[(k, True)]}/{by_kind[(k, False)]}" for k in ("same", "rewrite", "other", "neighbour", "nobox")))

    problems = []
    for name, got in outputs:
        if len(got) != n or any(r is None for r in got):
            problems.append(f"{name}: lost results ({sum(r is not None for r in got)} of {n})")
            continue
        bad = [i for i, (a, b) in enumerate(zip(baseline, got)) if (a.correct, a.extracted, a.status) != (b.correct, b.extracted, b.status)]
        if bad:
            problems.append(f"{name}: {len(bad)} results differ from the baseline (first at {bad[0]})")
    cpu_line = cpu_estimate(pairs, warmup, args)
    if cpu_line:
        print(cpu_line)
    statuses = Counter(r.status for _, got in outputs for r in got)
    print(f"pool statuses over all runs: {dict(statuses)}")
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print("OK: no lost or reordered results (every pooled item agrees with the baseline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
