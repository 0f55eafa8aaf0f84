"""The hours model met by real runs on this CPU: each recipe trains a few RL steps
here, then ``train --plan --gpu here --local --workload RUN`` predicts the same run on this
machine's measured rates (drmas_trainer.forecast.hardware_probe) from the workload the run logged, and the
table sets the predicted seconds per phase beside the measured ones (the mean over the steps after
the first, which warms up): wall (``timing_s/<phase>``) and the trainer process's CPU seconds
(``cpu_s/<phase>``; runs are ``--local``, so that is all of the work). On a machine shared with other
jobs the wall time grows with the load and the CPU seconds do not: read the CPU column there.

    python scripts/bench_plan.py                       # smollm2_toy and tiny, 3 steps each
    python scripts/bench_plan.py --recipes tiny --steps 4 --out runs/bench_plan

Phases: rollout = ``timing_s/gen``; old log-probs = ``timing_s/old_log_prob`` (predicted: the update
phase's forward passes' share that recomputes them); update = ``timing_s/update_actor``; sync =
``timing_s/sync_weights``; step = ``timing_s/step`` (also its checkpoint and what no phase covers).
On this machine the model measures the hf engine's decode (its products' weight bandwidth and a
step's other costs: drmas_trainer.forecast.hardware_probe.decode_cost); it has no term for a
step's checkpoint and bookkeeping ("other") nor for start-up, which the table shows apart. On a
shared, loaded machine absolute seconds are inflated: the ratio is what to read, and CPU seconds
are printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from drmas_trainer.metric_names import cpu

RECIPES = ("smollm2_toy", "tiny")
COST = "bench_cost.json"  # RUN/bench_cost.json: the training run's wall and CPU seconds (--reuse reads it)
# tiny without its 240-step warm start: the timing of RL steps is what is compared
OVERRIDES = {"tiny": ["sft.steps=0", "sft.agent_steps={}", "val.every=0", "val.before_train=false"]}
PHASES = (("rollout", "timing_s/gen"), ("old log-probs", "timing_s/old_log_prob"),
          ("update", "timing_s/update_actor"), ("sync", "timing_s/sync_weights"), ("step", "timing_s/step"))


def train(recipe: str, steps: int, out: Path) -> dict[str, float]:
    """Train ``recipe`` for ``steps`` steps into ``out``; its wall and CPU seconds."""
    sets = [x for s in OVERRIDES.get(recipe, []) for x in ("--set", s)]
    cmd = [sys.executable, "-m", "drmas_bench", "train", "--recipe", recipe, "--steps", str(steps), "--out", str(out),
           "--local", "--no-progress", "--fresh", *sets]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cost = {"wall_s": wall, "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}
    (out / COST).write_text(json.dumps(cost), encoding="utf-8")
    return cost


def measured(run: Path) -> dict[str, float]:
    """The mean seconds per phase over the steps after the first (all of them if only one)."""
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    recs = [r for r in recs if "timing_s/gen" in r]
    use = recs[1:] or recs
    out = {name: statistics.fmean(float(r.get(key, 0.0)) for r in use) for name, key in PHASES}
    out.update({"cpu " + name: statistics.fmean(float(r.get(cpu(key), 0.0)) for r in use) for name, key in PHASES})
    for pre in ("", "cpu "):
        out[pre + "other"] = out[pre + "step"] - sum(out[pre + n] for n, _ in PHASES[:-1])
    out["steps"] = len(recs)
    out["rl_s"] = sum(float(r["timing_s/step"]) for r in recs)
    return out


def predicted(recipe: str, run: Path) -> tuple[dict[str, float], object]:
    """The plan's seconds per phase for ``recipe`` here, from the workload ``run`` measured."""
    from drmas_bench.commands.train import plan_recipe
    from drmas_trainer.config.train import load_config, parse_override

    cfg = load_config(recipe, dict(parse_override(s) for s in OVERRIDES.get(recipe, [])))
    _, est = plan_recipe(cfg, gpu="here", local=True, workload=str(run))
    a = cfg.algo
    passes = (1 if cfg.rollout.old_logprobs == "recompute" else 0) + (1 if a.use_kl_in_reward else 0) \
        + a.ppo_epochs * (3 + (1 if cfg.agent_defaults.get("gradient_checkpointing") else 0))
    old = est.update_wall_s * (1 if cfg.rollout.old_logprobs == "recompute" else 0) / passes
    out = {"rollout": est.rollout_s, "old log-probs": old, "update": est.update_wall_s - old, "sync": est.sync_s,
           "step": est.step_s, "other": 0.0}
    return out, est.hardware


def table(recipe: str, pred: dict[str, float], meas: dict[str, float], cost: dict[str, float]) -> list[str]:
    lines = [f"\n{recipe}: {meas['steps']:.0f} steps, wall {cost['wall_s']:.0f} s ({cost['cpu_s']:.0f} CPU s), of "
             f"which RL steps {meas['rl_s']:.0f} s and start-up, the team before RL and the end "
             f"{cost['wall_s'] - meas['rl_s']:.0f} s (no term of the model)",
             "| phase | predicted s | measured wall s | measured CPU s | wall / predicted | CPU / predicted |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in [n for n, _ in PHASES] + ["other"]:
        p, m, c = pred[name], meas[name], meas["cpu " + name]
        ratios = f"{m / p:.2f} | {c / p:.2f}" if p > 0 else "(no term) | (no term)"
        lines.append(f"| {name} | {p:.2f} | {m:.2f} | {c:.2f} | {ratios} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="runs/bench_plan", help="folder of the runs (default runs/bench_plan)")
    ap.add_argument("--reuse", action="store_true", help="predict again for runs already trained into --out")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first step warms up and is left out)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"machine load now: {os.getloadavg()[0]:.1f} (1-minute average) on {os.cpu_count()} CPU(s)")
    for recipe in args.recipes:
        run = Path(args.out) / recipe
        reuse = args.reuse and (run / COST).is_file()
        cost = json.loads((run / COST).read_text()) if reuse else train(recipe, args.steps, run)
        pred, hw = predicted(recipe, run)
        print(f"\nprobe ({recipe}): {hw.source}")
        print("\n".join(table(recipe, pred, measured(run), cost)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
