"""Benchmark `drmas-bench sweep`: a 4-assignment sweep through the call cache against the same four
evals run independently (no cache), on math and on search, in one process, same run.

    python scripts/bench_sweep.py                                   # math + search, --limit 3 --n 2
    python scripts/bench_sweep.py --suites math --limit 4 --json out.json

The two candidate models are two distinct tiny models prepared offline: the registry's
``tiny-random`` (seed 0) and the same recipe with seed 1 (``models.tiny.build_tiny_random``, other
random weights, the same tokenizer), written once to ``OUT/models/tiny-b``. Math sweeps the solver
and the verifier (2 x 2); search sweeps the verifier and the answerer (2 x 2), the searcher on
tiny-random. Each suite runs, in this order, the four independent evals (``api.evaluate``, no
cache), then the sweep (``sweep.run_sweep``, a fresh cache folder), on the hf engine; every figure
is measured in this process.

Columns: ``calls sent`` (the sweep's calls that reached an engine) against ``calls alone`` (the
independent evals' calls, which equal the sweep's recorded calls), their ratio, the wall time of
each side and its ratio, and ``identical``: every assignment's samples (every turn's text and token
count, the reward, the final answer) and its avg@n / pass@k / pass^k equal the independent eval's. Exits 1
when any assignment differs. The JSON (``--json``, default ``OUT/bench_sweep.json``) holds every
row and each assignment's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CANDIDATES = {"math": ("solver", "verifier"), "search": ("verifier", "answerer")}
BENCHMARKS = {"math": "math500", "search": "hotpotqa"}


def tiny_b(out: Path) -> Path:
    """The second tiny model (seed 1), built once into OUT/models/tiny-b."""
    from drmas_bench.models.tiny import build_tiny_random

    dest = out / "models" / "tiny-b"
    if not (dest / "model.safetensors").is_file():
        build_tiny_random(dest, seed=1, log=lambda s: None)
    return dest


def essence(run: Path) -> dict:
    """What must be identical between a sweep's run and an independent one, per sample."""
    out = {}
    for line in (run / "samples.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        out[(r["task"]["benchmark"], r["task"]["id"], r["sample_idx"])] = (
            r.get("reward"), r.get("final_answer"),
            tuple((t["agent"], t["completion"]["text"], t["completion"]["completion_tokens"]) for t in r["turns"]))
    return out


def has_cache() -> bool:
    from drmas_bench.api import EvalConfig

    return "cache" in {f.name for f in fields(EvalConfig)}


def bench_suite(suite: str, out: Path, models: list[str], args: argparse.Namespace) -> dict[str, Any]:
    from drmas_bench import sweep, sweep_design
    from drmas_bench.api import EvalConfig, evaluate
    from drmas_bench.report.runs import load_run
    from drmas_bench.suites.registry import get_suite
    from drmas_bench.workflows import get_workflow

    wf = get_workflow(get_suite(suite).workflow)
    d = sweep_design.design(wf.name, wf.agents, "tiny-random", candidates={a: list(models) for a in CANDIDATES[suite]})
    base = EvalConfig(model="tiny-random", suite=suite, benchmarks=BENCHMARKS[suite], limit=args.limit, n=args.n,
                      max_new_tokens=args.max_new_tokens, data_dir=args.data_dir, seed=args.seed, progress=False,
                      prices=args.prices)
    root = out / suite
    names = sweep_design.run_names(d.assignments)
    t0 = time.monotonic()
    alone = []
    for asg, name in zip(d.assignments, names):
        s = evaluate(sweep.assignment_config(base, asg, root / "alone" / name))
        alone.append({"run": str(s.run_dir), "calls": sum(len(r["turns"]) for r in load_run(s.run_dir).records)})
    wall_alone = time.monotonic() - t0
    cached = has_cache()
    if cached:
        import shutil
        from dataclasses import replace

        shutil.rmtree(root / "cache", ignore_errors=True)
        base = replace(base, cache=str(root / "cache"))
    t0 = time.monotonic()
    doc = sweep.run_sweep(base, d, root / "sweep")
    wall_sweep = time.monotonic() - t0
    same = []
    for a, ind in zip(doc["assignments"], alone):
        ra = load_run(ind["run"])
        fa = sweep.assignment_figures(ra)
        same.append(essence(Path(a["run"])) == essence(Path(ind["run"])) and fa["avg@n"] == a["avg@n"]
                    and fa["pass@k"] == a["pass@k"] and fa["pass^k"] == a["pass^k"])
    calls_alone = sum(x["calls"] for x in alone)
    return {
        "suite": suite, "workflow": wf.name, "benchmark": BENCHMARKS[suite], "assignments": len(d.assignments),
        "limit": args.limit, "n": args.n, "max_new_tokens": args.max_new_tokens, "cache": cached,
        "calls_sent": doc["model_calls"], "calls_recorded": doc["calls_without_cache"], "calls_alone": calls_alone,
        "calls_ratio": doc["model_calls"] / calls_alone if calls_alone else None,
        "wall_sweep_s": round(wall_sweep, 2), "wall_alone_s": round(wall_alone, 2),
        "wall_ratio": round(wall_sweep / wall_alone, 3) if wall_alone else None,
        "identical": all(same), "identical_per_assignment": same,
        "per_assignment": [{k: a[k] for k in ("label", "avg@n", "pass@k", "pass^k", "model_calls", "cache_hits", "latency_s",
                                              "tokens", "usd", "usd_paid")} for a in doc["assignments"]],
    }


def warm_up(out: Path) -> None:
    """One tiny toy eval before anything is timed, so neither side pays the first imports."""
    import shutil

    from drmas_bench.api import EvalConfig, evaluate

    shutil.rmtree(out / "warm-up", ignore_errors=True)
    evaluate(EvalConfig(model="tiny-random", suite="toy", n=1, limit=1, max_new_tokens=4, progress=False,
                        out=str(out / "warm-up")))


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| suite | assignments | calls sent (sweep) | calls alone | calls ratio | wall sweep s | wall alone s "
            "| wall ratio | identical |\n|---|---|---|---|---|---|---|---|---|")
    body = [f"| {r['suite']} | {r['assignments']} | {r['calls_sent']} | {r['calls_alone']} | {r['calls_ratio']:.3f} | "
            f"{r['wall_sweep_s']:.1f} | {r['wall_alone_s']:.1f} | {r['wall_ratio']:.3f} | "
            f"{'yes' if r['identical'] else 'NO'} |" for r in rows]
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/bench_sweep", help="work folder (default runs/bench_sweep)")
    ap.add_argument("--suites", default="math,search")
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=os.environ.get("DRMAS_DATA_DIR"))
    ap.add_argument("--prices", default=None, help="price sheet for the $ figures (default: none)")
    ap.add_argument("--json", default=None, help="default OUT/bench_sweep.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from drmas_bench import log

    log.setup(log.level_for(0, 1))  # warnings only: the table is the output
    out = Path(args.out)
    import shutil

    for suite in args.suites.split(","):  # the same run every time: no run dir to resume from
        shutil.rmtree(out / suite, ignore_errors=True)
    models = ["tiny-random", str(tiny_b(out))]
    warm_up(out)
    rows = [bench_suite(s.strip(), out, models, args) for s in args.suites.split(",") if s.strip()]
    print(table(rows))
    if not all(r["cache"] for r in rows):
        print("(no call cache in this checkout: the sweep ran uncached)")
    path = Path(args.json) if args.json else out / "bench_sweep.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": rows, "models": models}, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
