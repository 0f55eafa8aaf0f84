"""One eval in one process against the same eval split over worker processes (``--workers N``).

    nice -n 10 python scripts/bench_split.py --data-dir ../shared/data                  # ~20k episodes, 1 and 2 workers
    nice -n 10 python scripts/bench_split.py --data-dir ../shared/data --episodes 2000 --workers 1,2,4

The run is scripts/bench_scale.py's: the real command line (``drmas-bench eval --suite search --n 16
--limit L --concurrency 256``, L per benchmark chosen so that the episodes come closest to
``--episodes``) served by its ``InstantDoubleEngine``, a test double of an engine registered in the
engine registry that answers at once in the reference's tags (4 calls and 1 retrieval an episode,
BM25 over the mini corpus). With the model's cost taken out, what is measured is the harness: the
episodes' orchestration and retrieval (in the workers when split) and the recording (grading,
writing, the summary: always in the coordinating process).

Each configuration runs fresh in a process of its own. Per run: wall, the coordinator's CPU and peak
RSS (``getrusage(RUSAGE_SELF)``), the workers' CPU (all of them together) and the largest worker's
peak RSS (as each reported them: summary.json's ``pool.workers``), the load average before and after.
The runs' records are then compared (by key, clock fields aside: scripts/check_identical_runs.py).
It prints a Markdown table with each row's wall and CPU as a ratio to the first row.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_scale  # noqa: E402  (the double, the sizes and the eval command line)
from check_identical_runs import scrub  # noqa: E402


def child(report: Path, argv: list[str]) -> int:
    """``drmas-bench ARGV`` in this process with the double registered; its figures to ``report``."""
    main_module = sys.modules["__main__"]
    sys.modules.setdefault(Path(__file__).stem, main_module)
    bench_scale.register_double()
    from drmas_bench.cli import main as cli_main

    t0 = time.perf_counter()
    rc = 1
    try:
        rc = cli_main(argv)
    finally:
        me = resource.getrusage(resource.RUSAGE_SELF)
        report.write_text(json.dumps({"rc": rc, "wall_s": time.perf_counter() - t0,
                                      "cpu_s": me.ru_utime + me.ru_stime, "peak_rss_mb": me.ru_maxrss / 1024}))
    return rc


def worker_figures(run: Path) -> dict[str, float]:
    """The workers' CPU seconds in all and the largest one's peak RSS, as each reported it when it
    closed (summary.json's ``pool.workers``: ``process.cpu_s``, the pool meter's sampled ``peak_rss_bytes``)."""
    workers = json.loads((run / "summary.json").read_text())["pool"].get("workers") or []
    return {"workers_cpu_s": sum(w["process"]["cpu_s"] for w in workers),
            "worker_peak_rss_mb": max((w["peak_rss_bytes"] / 2**20 for w in workers), default=0.0)}


def measured(argv: list[str], log: Path) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        report = Path(f.name)
    load0 = os.getloadavg()[0]
    with open(log, "ab") as out:
        r = subprocess.run([sys.executable, __file__, "--child", str(report), "--", *argv], stdout=out,
                           stderr=subprocess.STDOUT)
    fig = json.loads(report.read_text()) if report.stat().st_size else {"rc": r.returncode}
    report.unlink()
    if r.returncode != 0 or fig.get("rc") != 0:
        sys.exit(f"bench_split: `drmas-bench {' '.join(argv)}` failed (exit {r.returncode}); see {log}")
    return {**fig, "load_before": load0, "load_after": os.getloadavg()[0]}


def records(run: Path) -> dict[tuple, str]:
    """(benchmark, task id, sample) -> a hash of the record with its clock fields scrubbed."""
    out = {}
    with open(run / "samples.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            text = json.dumps(scrub(r), sort_keys=True).encode()
            out[(r["task"]["benchmark"], r["task"]["id"], r["sample_idx"])] = hashlib.sha256(text).hexdigest()
    return out


def table(rows: list[dict[str, Any]], episodes: int) -> str:
    base = rows[0]
    lines = ["| workers | wall (s) | wall ratio | coordinator CPU (s) | workers' CPU (s) | CPU in all (s) | CPU ratio | "
             "coordinator peak RSS (MB) | largest worker peak RSS (MB) | episodes / wall s | load avg before / after |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    total = lambda r: r["cpu_s"] + r["workers_cpu_s"]  # noqa: E731
    for r in rows:
        worker_rss = f"{r['worker_peak_rss_mb']:.0f}" if r["worker_peak_rss_mb"] else "-"
        lines.append(f"| {r['workers']} | {r['wall_s']:.0f} | {r['wall_s'] / base['wall_s']:.2f} | {r['cpu_s']:.0f} | "
                     f"{r['workers_cpu_s']:.0f} | {total(r):.0f} | {total(r) / total(base):.2f} | {r['peak_rss_mb']:.0f} | "
                     f"{worker_rss} | {episodes / r['wall_s']:.0f} | "
                     f"{r['load_before']:.1f} / {r['load_after']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=20000, help="episodes per run (default 20000)")
    ap.add_argument("--workers", default="1,2", help="worker counts to run, comma-separated; 1 = one process")
    ap.add_argument("--data-dir", default=os.environ.get("DRMAS_DATA_DIR"), help="benchmark files (default $DRMAS_DATA_DIR)")
    ap.add_argument("--keep", metavar="DIR", help="keep the run directories and logs here (default: a temp dir)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.child:
        return child(Path(args.child), rest[1:] if rest[:1] == ["--"] else rest)
    if not args.data_dir:
        ap.error("give --data-dir (or set DRMAS_DATA_DIR): the search suite's files and the mini corpus")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-split-"))
    work.mkdir(parents=True, exist_ok=True)
    limit, episodes = bench_scale.limit_for(args.episodes)
    # one tiny run first: the BM25 index of the mini corpus is built (and cached) outside the figures
    measured(bench_scale.eval_argv(work / "warm-up", args.data_dir, 1) + ["--n", "1", "--fresh"], work / "log-warm-up.txt")
    rows = []
    for n in (int(x) for x in args.workers.split(",")):
        run = work / f"run-{n}"
        shutil.rmtree(run, ignore_errors=True)
        print(f"[bench_split] {episodes} episodes (--limit {limit} x 16), {n} worker(s)", file=sys.stderr, flush=True)
        argv = bench_scale.eval_argv(run, args.data_dir, limit) + ["--workers", str(n), "--no-progress"]
        rows.append({"workers": n, **measured(argv, work / f"log-{n}.txt"), **worker_figures(run)})
        print(table(rows, episodes), file=sys.stderr, flush=True)
    first = records(work / f"run-{rows[0]['workers']}")
    same = {r["workers"]: records(work / f"run-{r['workers']}") == first for r in rows[1:]}
    print(table(rows, episodes))
    print(f"\n{episodes} episodes; records identical to the first row's (by key, clocks aside): {same}")
    if args.json:
        Path(args.json).write_text(json.dumps({"episodes": episodes, "limit": limit, "rows": rows, "identical": same}, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
