#!/usr/bin/env python
"""Per-agent statistics or step-frequency weighting? The 2 x 2 of statistics x loss balance, paired by seed.

The reference's users asked (its issue #81) whether Dr. MAS's gain comes from per-agent statistics
or from weighting each agent's loss by how often it acts. This script trains, for every seed, the
four arms of that 2 x 2 from one shared warm start per setting:

    statistics  global (``grpo``: one mean / std per prompt over trajectory values) or
                per agent (``drmas``: one mean / std per (prompt, agent) over its rows)
    balance     off, or on (``algo.balance_loss_by_agent_freq``: each row's policy loss weighted by
                1/n of its (prompt, agent) pair over the batch mean, the reference's switch)

on two settings: ``fixer`` (the tiny_fixer recipe, where one agent's factor is far from 1) and
``toy4`` (the tiny_4agent recipe: four roles on the toy task). It then writes a Markdown page:
per arm the reward and each agent's pre-clip grad norms; the main effects of statistics and of
balance and their interaction, paired over seeds (mean with a bootstrap 95 % CI, Cohen's d_z, exact
sign test, Wilcoxon signed-rank test; statistics of scripts/stability_study.py); and per step, for
every agent, the reference's ``adv_diag/<agent>/inflation_factor_mean`` beside this project's
``agent/<agent>/critic/moment_factor/mean``, with how far they agree.

    python scripts/balance_study.py                                    # the committed study
    python scripts/balance_study.py --seeds 0-9 --seeds-4agent 0-4 --steps 8 --jobs 2
    python scripts/balance_study.py --report-only                      # the page from what is done

Resumable: a run whose ``study.json`` exists is not rerun, a killed run resumes from its last
checkpoint, the warm start is computed once per setting (``scripts/stability_study.py``'s
machinery: the same warm start, the run seed varies the RL stage). No final eval (``--eval-n`` N
adds one: toy suite, 64 questions x N samples).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stability_study as S  # noqa: E402  (the warm start, the paired statistics)

ROOT = S.ROOT
DEFAULT_MD = ROOT / "docs/results/balance.md"
SETTINGS = {s.name: s for s in (
    S.Setting("fixer", {}, "the tiny_fixer recipe: a solver, and a fixer that acts only after a wrong answer (up to "
              "twice), so its rows come from failing episodes and its factor sits far above 1", recipe="tiny_fixer"),
    S.Setting("toy4", {}, "the tiny_4agent recipe: solver -> critic -> refiner -> checker on the toy task (math_4agent's "
              "loop), four roles acting at different frequencies", recipe="tiny_4agent"),
)}
# (statistics, balance) -> arm name
CELLS = {("global", "off"): "grpo", ("global", "on"): "grpo+balance",
         ("per agent", "off"): "drmas", ("per agent", "on"): "drmas+balance"}
ARMS = tuple(CELLS.values())
DONE = "study.json"
LAST_K = 5  # the reward over the last LAST_K steps


def arm_overrides(arm: str) -> dict[str, Any]:
    """``ESTIMATOR`` or ``ESTIMATOR+balance`` -> config overrides."""
    est, _, bal = arm.partition("+")
    return {"algo.estimator": est, **({"algo.balance_loss_by_agent_freq": True} if bal == "balance" else {})}


def _config(setting: S.Setting, arm: str, seed: int, steps: int | None):
    from drmas_trainer.config.train import load_config

    ov = {**setting.overrides, **arm_overrides(arm), "seed": seed}
    if steps is not None:
        ov["steps"] = steps
    return load_config(setting.recipe, overrides=ov)


def one_run(out: Path, setting: str, arm: str, seed: int, steps: int | None, eval_n: int) -> dict[str, Any]:
    """Train (or resume) one arm from the setting's warm start; ``study.json`` records it."""
    from drmas_trainer.checkpoint import complete_checkpoints
    from drmas_trainer.trainer import train

    d = out / setting / f"{arm}-s{seed}"
    if (d / DONE).is_file():
        return json.loads((d / DONE).read_text())
    step0 = S.warm_start(out, SETTINGS[setting])
    ckpt = d / "ckpt"
    if not (ckpt.is_dir() and complete_checkpoints(ckpt)):
        shutil.rmtree(d, ignore_errors=True)
        ckpt.mkdir(parents=True)
        shutil.copytree(step0, ckpt / "step_0")
    t0, c0 = time.perf_counter(), time.process_time()
    summary = train(_config(SETTINGS[setting], arm, seed, steps), d, resume=True, use_ray=False, progress=False)
    rec: dict[str, Any] = {"setting": setting, "arm": arm, "seed": seed, "train_s": time.perf_counter() - t0,
                           "train_cpu_s": time.process_time() - c0, "reward_last5": summary["reward_last5"]}
    if eval_n:
        from drmas_bench.api import EvalConfig, evaluate

        ev = evaluate(EvalConfig(model=str(ckpt / "latest"), suite="toy", n=eval_n, out=str(d / "eval"),
                                 progress=False, seed=0))
        rec["eval_avg"] = ev.data["micro"]["avg@n"]
    (d / DONE).write_text(json.dumps(rec, indent=1))
    return rec


def run_all(out: Path, plan: list[tuple[str, str, int]], steps: dict[str, int | None], jobs: int, eval_n: int) -> None:
    """Every missing run of ``plan`` ((setting, arm, seed)), ``jobs`` processes at a time, warm starts first."""
    todo = [t for t in plan if not (out / t[0] / f"{t[1]}-s{t[2]}" / DONE).is_file()]
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(lambda s: _subprocess(out, s, None, None, None, 0), sorted({t[0] for t in todo})))
        futs = {pool.submit(_subprocess, out, s, a, k, steps[s], eval_n): (s, a, k) for s, a, k in todo}
        for f in cf.as_completed(futs):
            s, a, k = futs[f]
            print(f"[balance] {s} {a} seed {k}: {'done' if f.result() == 0 else 'FAILED (rc %d)' % f.result()}",
                  flush=True)


def _subprocess(out: Path, setting: str, arm: str | None, seed: int | None, steps: int | None, eval_n: int) -> int:
    cmd = [sys.executable, __file__, "--out", str(out), "--eval-n", str(eval_n), "--_one", setting, str(arm), str(seed)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    log = out / setting / f"{arm or '_warm'}-s{seed if seed is not None else 0}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        return subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))


# ================================================================================= per-run figures


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else float("nan")


def run_figures(d: Path) -> dict[str, Any]:
    """Per step: reward; per agent grad norm, moment factor (ours), inflation factor (the reference's)."""
    from drmas_trainer import metric_names as N
    from drmas_trainer.runlog import read_metrics

    recs = [r for r in read_metrics(d) if N.SCORE in r]
    agents = sorted({k.split("/")[1] for r in recs for k in r if k.startswith("agent/") and k.endswith(N.GRAD_NORM)})
    done = json.loads((d / DONE).read_text())
    out: dict[str, Any] = {"reward": [_num(r[N.SCORE]) for r in recs], "train_cpu_s": done.get("train_cpu_s"),
                           "train_s": done.get("train_s"), "eval": done.get("eval_avg"), "agents": {}}
    for a in agents:
        g = [_num(r.get(N.agent(a, N.GRAD_NORM))) for r in recs]
        fin = [x for x in g if math.isfinite(x)]
        out["agents"][a] = {
            "grad": g, "max": max(fin, default=float("nan")),
            "median": statistics.median(fin) if fin else float("nan"),
            "moment": [_num(r.get(N.agent(a, N.MOMENT_FACTOR))) for r in recs],
            "inflation": [_num(r.get(f"adv_diag/{a}/inflation_factor_mean")) for r in recs]}
    return out


def load(out: Path, settings: list[str], seeds: dict[str, list[int]]) -> dict[str, dict[str, dict[int, Any]]]:
    data: dict[str, dict[str, dict[int, Any]]] = {}
    for s in settings:
        for a in ARMS:
            for k in seeds[s]:
                d = out / s / f"{a}-s{k}"
                if (d / DONE).is_file():
                    data.setdefault(s, {}).setdefault(a, {})[k] = run_figures(d)
    return data


# ================================================================================= the page


def _fmt(x: Any, nd: int = 3) -> str:
    return "n/a" if x is None or not math.isfinite(float(x)) else f"{float(x):.{nd}f}"


def _mean(xs: list[float]) -> float:
    fin = [x for x in xs if math.isfinite(x)]
    return statistics.fmean(fin) if fin else float("nan")


def _median(xs: list[float]) -> float:
    fin = [x for x in xs if math.isfinite(x)]
    return statistics.median(fin) if fin else float("nan")


def _value(run: dict[str, Any], key: str, agent: str | None) -> float:
    if key == "reward":
        return _mean(run["reward"][-LAST_K:])
    if key == "eval":
        return _num(run["eval"])
    return _num(run["agents"][agent][key]) if agent in run["agents"] else float("nan")


def effects(arms: dict[str, dict[int, Any]], key: str, agent: str | None) -> dict[str, Any] | None:
    """Main effects and interaction of the 2 x 2 on one figure, over the seeds every arm finished:
    statistics = mean over balance of (global - per agent); balance = mean over statistics of
    (on - off); interaction = (global on - global off) - (per agent on - per agent off)."""
    seeds = sorted(set.intersection(*(set(arms.get(a, {})) for a in ARMS)))
    if not seeds:
        return None
    v = {c: [_value(arms[a][k], key, agent) for k in seeds] for c, a in CELLS.items()}
    g_on, g_off, p_on, p_off = v[("global", "on")], v[("global", "off")], v[("per agent", "on")], v[("per agent", "off")]
    zeros = [0.0] * len(seeds)
    return {"n": len(seeds),
            "statistics": S.paired(zeros, [(a + b - c - d) / 2 for a, b, c, d in zip(g_on, g_off, p_on, p_off)]),
            "balance": S.paired(zeros, [(a + c - b - d) / 2 for a, b, c, d in zip(g_on, g_off, p_on, p_off)]),
            "interaction": S.paired(zeros, [(a - b) - (c - d) for a, b, c, d in zip(g_on, g_off, p_on, p_off)]),
            "balance_vs_stats": S.paired(p_off, g_on)}


def _eff(e: dict[str, Any]) -> str:
    if not e or not e.get("n"):
        return "n/a"
    lo, hi = e["ci"]
    return (f"{_fmt(e['diff'])} [{_fmt(lo)}, {_fmt(hi)}], d_z {_fmt(e['dz'], 2)}, positive in {e['b_greater']}/{e['n']}, "
            f"sign p {_fmt(e['sign_p'])}, Wilcoxon p {_fmt(e['wilcoxon_p'])}")


def _verdict(e: dict[str, Any]) -> str:
    """'yes (+)', 'yes (-)' when both tests give p < 0.05 in the same direction, else 'no'."""
    if not e or not e.get("n") or not (e["sign_p"] < 0.05 and e["wilcoxon_p"] < 0.05):
        return "no"
    return "yes (+)" if e["diff"] > 0 else "yes (-)"


def _claim(what: str, e: dict[str, Any], verbs: tuple[str, str] = ("raises it", "lowers it")) -> str:
    """One sentence: what raises / lowers the figure by how much, or that no effect is shown."""
    v = _verdict(e)
    if v == "no":
        return f"{what}: no effect shown (mean {_fmt(e.get('diff'))}, sign p {_fmt(e.get('sign_p'))})."
    verb = verbs[0] if v == "yes (+)" else verbs[1]
    return (f"{what} {verb}: {_fmt(abs(e['diff']))} on average ({e['b_greater'] if e['diff'] > 0 else e['n'] - e['b_greater']}"
            f"/{e['n']} seeds, sign p {_fmt(e['sign_p'])}, Wilcoxon p {_fmt(e['wilcoxon_p'])}).")


FIGURES = (("reward", f"reward, last {LAST_K} steps", None), ("max", "max grad norm", "agent"),
           ("median", "median grad norm (its level)", "agent"))


def setting_lines(name: str, arms: dict[str, dict[int, Any]], steps: int | None) -> list[str]:
    runs = [r for a in ARMS for r in arms.get(a, {}).values()]
    agents = sorted({x for r in runs for x in r["agents"]})
    if not runs:
        return [f"## Setting `{name}`", "", "No finished runs yet.", ""]
    infl = {a: _median([x for r in runs if a in r["agents"] for x in r["agents"][a]["inflation"]]) for a in agents}
    ours = {a: _mean([x for r in runs if a in r["agents"] for x in r["agents"][a]["moment"]]) for a in agents}
    focus = max(agents, key=lambda a: infl[a] if math.isfinite(infl[a]) else -1.0)
    cpu = [r["train_cpu_s"] for r in runs if r.get("train_cpu_s")]
    wall = [r["train_s"] for r in runs if r.get("train_s")]
    n_pairs = min(len(arms.get(a, {})) for a in ARMS)
    lines = [f"## Setting `{name}`: {SETTINGS[name].about}", "",
             "Finished runs: " + ", ".join(f"{a} {len(arms.get(a, {}))}" for a in ARMS)
             + (f". Training per run: median {statistics.median(cpu):.0f} s of CPU, {statistics.median(wall):.0f} s of "
                f"wall time on the shared machine; {sum(cpu) / 60:.1f} CPU-minutes in all (each run's process start "
                "and model loading come on top)." if cpu and wall else "."),
             f"With {n_pairs} paired seeds the smallest possible two-sided sign-test p is {2 / 2 ** n_pairs:.3f}"
             + (": no effect can be *shown* here, whatever its size." if n_pairs and 2 / 2 ** n_pairs >= 0.05 else "."), "",
             f"The agent whose factor is largest is **{focus}**: the reference's inflation_factor_mean "
             f"{_fmt(infl[focus])} (median over every run's steps), our moment factor {_fmt(ours[focus])} (mean); "
             "the grad-norm effects below are its.", "",
             "| arm (statistics, balance) | seeds | reward last 5 | " + " | ".join(
                 f"{a}: max / median grad norm" for a in agents) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in agents) + " |"]
    for (st, bal), arm in CELLS.items():
        rs = list(arms.get(arm, {}).values())
        cols = [f"{_fmt(_mean([_value(r, 'max', a) for r in rs]))} / {_fmt(_mean([_value(r, 'median', a) for r in rs]))}"
                for a in agents]
        lines.append(f"| {arm} ({st}, {bal}) | {len(rs)} | {_fmt(_mean([_value(r, 'reward', None) for r in rs]))} | "
                     + " | ".join(cols) + " |")
    lines += ["", "(means over seeds; grad norms are pre-clip, per worker group)", "",
              f"**Effects, paired by seed** (figures of {focus} where per agent; a difference with its bootstrap 95 % CI; "
              "an effect is *shown* when both tests give p < 0.05):", "",
              "| figure | statistics: global - per agent | balance: on - off | interaction | shown (stats / balance / interaction) |",
              "| --- | --- | --- | --- | --- |"]
    for key, label, who in FIGURES + ((("eval", "eval avg@n", None),) if any(r.get("eval") is not None for r in runs) else ()):
        e = effects(arms, key, focus if who else None)
        if e is None:
            continue
        lines.append(f"| {label} | {_eff(e['statistics'])} | {_eff(e['balance'])} | {_eff(e['interaction'])} | "
                     f"{_verdict(e['statistics'])} / {_verdict(e['balance'])} / {_verdict(e['interaction'])} |")
    e = effects(arms, "max", focus)
    if e is not None:
        lines += ["", f"Balance alone instead of per-agent statistics (grpo+balance - drmas, {focus}'s max grad norm): "
                  f"{_eff(e['balance_vs_stats'])}."]
        lines += ["", f"**In short ({e['n']} paired seeds, {focus}'s max grad norm).** "
                  + _claim("Switching from per-agent to global statistics", e["statistics"]) + " "
                  + _claim("Turning loss balance on", e["balance"]) + " "
                  + _claim("The interaction (balance's effect under global minus under per-agent statistics)",
                           e["interaction"], ("is positive", "is negative"))]
    lines += ["", *factor_lines(runs, agents, steps), ""]
    return lines


BLOWN = 1e6  # a reference factor above this comes from a prompt whose trajectory means have sigma 0 (its 1e-12)


def factor_lines(runs: list[dict[str, Any]], agents: list[str], steps: int | None) -> list[str]:
    """Per step, over every run: our moment factor (mean) beside the reference's inflation factor
    (median, and how many runs' values exceed BLOWN); then per agent both factors' summaries, their
    Pearson correlation over the (run, step) cells where the reference's is below BLOWN, and the share
    of cells within 10 %."""
    n = max(len(r["reward"]) for r in runs)
    out = ["**Factors per step** (every run of the setting, all arms: both are functions of the step's scores, "
           "whatever the estimator). Ours: `agent/<a>/critic/moment_factor/mean`, the mean over prompt groups with "
           "sigma > 0 of `(sigma_k^2 + (mu_k - mu)^2) / sigma^2`, population moments over the agent's rows and the "
           "group's rows. The reference's: `adv_diag/<a>/inflation_factor_mean`, the mean over (prompt, agent) pools "
           "of the same ratio with torch's unbiased std, mu and sigma over trajectory means, a one-value pool taken "
           "as (0, 1) and 1e-12 in the denominator, so one prompt whose trajectories all scored alike puts ~1e12 "
           f"into it (docs/advantages.md). Shown: ours as the mean over runs; the reference's as the median over "
           f"runs, with the number of runs whose value is above {BLOWN:g}.", "",
           "| step | " + " | ".join(f"{a}: ours (mean) / reference (median) [runs > {BLOWN:g}]" for a in agents) + " |",
           "| --- | " + " | ".join("---" for _ in agents) + " |"]
    for t in range(n):
        cells = []
        for a in agents:
            rs = [r["agents"][a] for r in runs if a in r["agents"] and t < len(r["agents"][a]["moment"])]
            ref = [x["inflation"][t] for x in rs if math.isfinite(x["inflation"][t])]
            med = statistics.median(ref) if ref else float("nan")
            cells.append(f"{_fmt(_mean([x['moment'][t] for x in rs]))} / {_fmt(med)} [{sum(v > BLOWN for v in ref)}/{len(ref)}]")
        out.append(f"| {t + 1} | " + " | ".join(cells) + " |")
    out += ["", f"| agent | ours: mean, median | reference: median; cells > {BLOWN:g} | Pearson r (cells <= {BLOWN:g}) "
            "| cells within 10 % |", "| --- | --- | --- | --- | --- |"]
    for a in agents:
        pairs = [(m, i) for r in runs if a in r["agents"] for m, i in zip(r["agents"][a]["moment"], r["agents"][a]["inflation"])
                 if math.isfinite(m) and math.isfinite(i)]
        if len(pairs) < 3:
            out.append(f"| {a} | n/a | n/a | n/a | n/a |")
            continue
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        tame = [(x, y) for x, y in pairs if y <= BLOWN]
        tx, ty = [p[0] for p in tame], [p[1] for p in tame]
        r = (statistics.correlation(tx, ty) if len(tame) >= 3 and statistics.pstdev(tx) > 0 and statistics.pstdev(ty) > 0
             else float("nan"))
        close = sum(abs(x - y) <= 0.1 * max(abs(y), 1e-12) for x, y in pairs) / len(pairs)
        out.append(f"| {a} | {_fmt(_mean(xs))}, {_fmt(statistics.median(xs))} | {_fmt(statistics.median(ys))}; "
                   f"{sum(y > BLOWN for y in ys)} of {len(ys)} | {_fmt(r, 2)} ({len(tame)} cells) | {100 * close:.0f} % |")
    return out


def report(out: Path, settings: list[str], seeds: dict[str, list[int]], steps: dict[str, int | None], md: Path,
           command: str) -> None:
    from drmas_trainer.config.train import load_config

    data = load(out, settings, seeds)
    lines = ["# Per-agent statistics or loss balance? The 2 x 2 on `tiny_fixer` and the 4-agent toy team", "",
             "Generated by `scripts/balance_study.py` (every number below is computed by it). Rerun / complete:", "",
             "```", command, "```", "",
             "The command is resumable: finished runs are kept, missing ones are trained, the page is rewritten.", ""]
    setup = []
    for s in settings:
        cfg = load_config(SETTINGS[s].recipe)
        setup.append(f"`{s}`: recipe `{SETTINGS[s].recipe}` (workflow `{cfg.workflow}`), {steps[s] or cfg.steps} RL steps "
                     f"(recipe: {cfg.steps}) of {cfg.rollout.prompts_per_step} prompts x {cfg.rollout.n} rollouts, "
                     f"seeds {S._seed_list(seeds[s])}")
    lines += ["**Setup.** " + "; ".join(setup) + ". Arms: statistics global (`grpo`) or per agent (`drmas`) x loss "
              "balance off or on (`algo.balance_loss_by_agent_freq`). Every run of a setting starts from one warm "
              "start (the recipe's `sft:` stage); the seed varies the RL stage, so the four arms of a seed share "
              "their start and prompt order. No final eval: the reward is the training reward of the last "
              f"{LAST_K} steps. Tests: the statistics of `scripts/stability_study.py` (paired by seed).", "",
              "**Size.** The runs are short (RL steps and seeds above) because the whole study had to fit about 20 "
              "minutes of a 2-core machine shared with other work; the factors and grad norms are per step, so "
              "short runs measure them, but the reward barely moves from the warm start in so few steps. The "
              "full-length study is the command above without `--steps` / `--steps-4agent` and with "
              "`--seeds-4agent 0-9`, into a new `--out` (a finished run is kept as it is).", ""]
    for s in settings:
        lines += setting_lines(s, data.get(s, {}), steps[s])
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(lines).rstrip() + "\n")
    print(f"[balance] wrote {md}")


# ================================================================================= CLI


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0-9", help="seeds of the fixer setting (0-9 or 0,3,5)")
    p.add_argument("--seeds-4agent", default="0-9", help="seeds of the toy4 setting")
    p.add_argument("--settings", default="fixer,toy4")
    p.add_argument("--steps", type=int, default=None, help="RL steps of the fixer setting (default: the recipe's)")
    p.add_argument("--steps-4agent", type=int, default=None, help="RL steps of the toy4 setting (default: the recipe's)")
    p.add_argument("--eval-n", type=int, default=0, help="samples per question of a final toy eval (0: none)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", default="runs/balance")
    p.add_argument("--md", default=str(DEFAULT_MD))
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--_one", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out = Path(args.out)
    if args._one:
        import torch

        torch.set_num_threads(1)
        setting, arm, seed = args._one
        if arm == "None":
            S.warm_start(out, SETTINGS[setting])
        else:
            one_run(out, setting, arm, int(seed), args.steps, args.eval_n)
        return 0
    from drmas_bench.types import UserError

    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not settings or any(s not in SETTINGS for s in settings):
        raise UserError(f"balance_study: settings are {', '.join(SETTINGS)}, got {args.settings!r}")
    seeds = {"fixer": S.parse_seeds(args.seeds), "toy4": S.parse_seeds(args.seeds_4agent)}
    steps = {"fixer": args.steps, "toy4": args.steps_4agent}
    if not args.report_only:
        plan = [(s, a, k) for s in settings for k in seeds[s] for a in ARMS]
        run_all(out, plan, steps, args.jobs, args.eval_n)
    command = (f"python scripts/balance_study.py --settings {args.settings} --seeds {args.seeds} "
               f"--seeds-4agent {args.seeds_4agent}" + (f" --steps {args.steps}" if args.steps else "")
               + (f" --steps-4agent {args.steps_4agent}" if args.steps_4agent else "")
               + (f" --eval-n {args.eval_n}" if args.eval_n else "") + f" --jobs {args.jobs} --out {args.out}")
    if Path(args.md).resolve() != DEFAULT_MD:
        command += f" --md {os.path.relpath(Path(args.md).resolve(), ROOT)}"
    report(out, settings, seeds, steps, Path(args.md), command)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - a UserError is one line
        from drmas_bench.types import UserError

        if isinstance(e, UserError):
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        raise
