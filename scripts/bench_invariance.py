"""Batch invariance of the ``hf`` engine at eval level, and its cost.

    python scripts/bench_invariance.py --out /tmp/bench-inv                 # everything (tens of minutes)
    python scripts/bench_invariance.py --out /tmp/bench-inv --only cost     # cost: the 4 timed runs
    python scripts/bench_invariance.py --out /tmp/bench-inv --only same --dtype float32

``cost``: the README's main job (the command under ``<!-- main-job -->``) and a bf16 toy eval of
smollm2-135m-instruct, each with today's padded batching (``--engine-args batch_invariant=false``)
and with the invariant default, one after the other in this run: wall seconds, CPU seconds (user +
system of the child), ratio. It also counts the records of the main job that differ between the two.

``same``: the toy eval (``--n 4 --limit 12 --max-new-tokens 48 --seed 0``) at ``--max-batch 1, 4, 32``,
``--concurrency 1, 3, 256``, ``--workers 1, 2``, a run killed after its first records and resumed,
and (``--pool``) a heterogeneous team (smollm2 solver, tiny-random checker) with ``--pool-budget 1``
against the same team with budget 2; each compared with the reference run (``--max-batch 32``)
record by record, clock fields and the run stamp aside (``check_identical_runs.scrub``). Add
``--also-old`` to run the max-batch pair with ``batch_invariant=false`` too (today's numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_identical_runs import scrub  # noqa: E402  (a sibling script)
from doc_blocks import main_job  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOY = ["--model", "smollm2-135m-instruct", "--suite", "toy", "--n", "4", "--limit", "12",
       "--max-new-tokens", "48", "--seed", "0"]
TEAM = ["--model-for", "solver=smollm2-135m-instruct", "--model-for", "checker=tiny-random", "--suite", "toy",
        "--n", "2", "--limit", "6", "--max-new-tokens", "48", "--seed", "0"]
VOLATILE = ("run", "run_id", "stamp", "worker", "pid")  # record keys naming the run or the process, not the episode


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def eval_run(out: Path, args: list[str], *, kill_after: int | None = None) -> dict[str, float]:
    """``drmas-bench eval ARGS --out OUT --fresh``; wall and CPU seconds. ``kill_after``: kill the run
    once it has written that many records, then resume it (same command, no ``--fresh``)."""
    cmd = [sys.executable, "-m", "drmas_bench", "-q", "eval", *args, "--out", str(out), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t0, c0 = time.perf_counter(), child_cpu()
    if kill_after is not None:
        p = subprocess.Popen([*cmd, "--fresh"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while p.poll() is None and len(records(out, missing_ok=True)) < kill_after:
            time.sleep(0.5)
        p.kill()
        p.wait()
        print(f"  killed after {len(records(out, missing_ok=True))} records; resuming", flush=True)
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    else:
        subprocess.run([*cmd, "--fresh"], env=env, check=True, stdout=subprocess.DEVNULL)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": child_cpu() - c0}


def records(run: Path, *, missing_ok: bool = False) -> dict[tuple, dict]:
    """The run's records by (benchmark, task id, sample index), clock fields and run names scrubbed."""
    path = run / "samples.jsonl"
    if missing_ok and not path.exists():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        key = (rec["task"]["benchmark"], str(rec["task"]["id"]), int(rec["sample_idx"]))
        out[key] = scrub({k: v for k, v in rec.items() if k not in VOLATILE})
    return out


def differing(a: Path, b: Path) -> tuple[int, int]:
    """(episodes whose records differ, episodes in ``a``); an episode missing from ``b`` differs."""
    ra, rb = records(a), records(b)
    return sum(rb.get(k) != v for k, v in ra.items()), len(ra)


def cost(out: Path) -> list[str]:
    """The main job and the bf16 toy eval, padded batching vs invariant: wall, CPU, ratio."""
    main = shlex.split(main_job((ROOT / "README.md").read_text(encoding="utf-8")))
    main = main[main.index("eval") + 1 :]
    main = [a.replace("../shared/data", os.environ.get("DRMAS_DATA_DIR", "../shared/data")) for a in main]
    jobs = {"main job (fp32)": main, "toy eval (bf16)": [*TOY, "--engine-args", "dtype=bfloat16"]}
    lines = ["| job | padded (batch_invariant=false) wall / CPU s | invariant wall / CPU s | CPU ratio |",
             "|---|---|---|---|"]
    for name, args in jobs.items():
        tag = name.split()[0]
        old_args = [*args[:-1], args[-1] + ",batch_invariant=false"] if "--engine-args" in args else \
            [*args, "--engine-args", "batch_invariant=false"]
        old = eval_run(out / f"{tag}_old", old_args)
        new = eval_run(out / f"{tag}_inv", args)
        lines.append(f"| {name} | {old['wall_s']:.0f} / {old['cpu_s']:.0f} | {new['wall_s']:.0f} / "
                     f"{new['cpu_s']:.0f} | {new['cpu_s'] / old['cpu_s']:.2f} |")
        n, total = differing(out / f"{tag}_old", out / f"{tag}_inv")
        lines.append(f"|  records that differ, padded vs invariant | {n} of {total} | | |")
        print(lines[-2], lines[-1], sep="\n", flush=True)
    return lines


def same(out: Path, dtype: str, also_old: bool, pool: bool) -> list[str]:
    """Every batching knob against the reference run: episodes whose records differ."""
    ea = ["--engine-args", f"dtype={dtype}"]
    variants = {"max-batch 1": ["--max-batch", "1"], "max-batch 4": ["--max-batch", "4"],
                "concurrency 1": ["--concurrency", "1"], "concurrency 3": ["--concurrency", "3"],
                "concurrency 256": ["--concurrency", "256"], "workers 2": ["--workers", "2"]}
    ref = out / f"ref_{dtype}"
    eval_run(ref, [*TOY, *ea, "--max-batch", "32"])
    lines = [f"| {dtype}, vs --max-batch 32 | episodes that differ |", "|---|---|"]
    for name, extra in variants.items():
        run = out / f"{dtype}_{name.replace(' ', '')}"
        t = eval_run(run, [*TOY, *ea, *extra])
        n, total = differing(ref, run)
        lines.append(f"| {name} | {n} of {total} ({t['wall_s']:.0f} s) |")
        print(lines[-1], flush=True)
    run = out / f"{dtype}_resumed"
    eval_run(run, [*TOY, *ea, "--max-batch", "32"], kill_after=10)
    lines.append("| killed after 10 records, resumed | %d of %d |" % differing(ref, run))
    print(lines[-1], flush=True)
    if pool:
        eval_run(out / "team_budget2", [*TEAM, *ea, "--pool-budget", "2"])
        eval_run(out / "team_budget1", [*TEAM, *ea, "--pool-budget", "1"])
        lines.append("| heterogeneous team, --pool-budget 1 vs 2 | %d of %d |"
                     % differing(out / "team_budget2", out / "team_budget1"))
        print(lines[-1], flush=True)
    if also_old:
        for mb in ("32", "1"):
            eval_run(out / f"old_{dtype}_mb{mb}", [*TOY, "--engine-args", f"dtype={dtype},batch_invariant=false",
                                                   "--max-batch", mb])
        lines.append("| batch_invariant=false: max-batch 1 vs 32 | %d of %d |"
                     % differing(out / f"old_{dtype}_mb32", out / f"old_{dtype}_mb1"))
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--only", choices=("cost", "same"))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--also-old", action="store_true", help="the max-batch pair with batch_invariant=false too")
    ap.add_argument("--pool", action="store_true", help="the heterogeneous team with --pool-budget 1 vs 2")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    lines = []
    if a.only in (None, "cost"):
        lines += cost(a.out)
    if a.only in (None, "same"):
        lines += same(a.out, a.dtype, a.also_old, a.pool)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
