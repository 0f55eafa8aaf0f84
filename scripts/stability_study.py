#!/usr/bin/env python
"""Gradient-norm stability of Dr. MAS vs GRPO on the CPU recipes, with paired statistics.

Runs the ``tiny`` recipe for every seed x estimator x setting on the local trainer, evaluates each
final checkpoint (toy suite, 64 questions x 16 samples, avg@16 with its bootstrap CI), then writes
a Markdown page and a PNG: per agent the grad-norm spread (max / median over the steps), the number
of steps with a grad norm above ``--spike-k`` x the run's median, the mean second-moment factor
``(sigma_k^2 + (mu_k - mu)^2) / sigma^2`` of the run's rollouts (trainer/moment_factor.py), reward
curves with seed bands and the final eval; every estimator is paired with ``--baseline`` by seed,
with an exact two-sided sign test, a Wilcoxon signed-rank test, the mean paired difference with a
bootstrap 95 % CI and Cohen's d_z, and a line per claim saying whether it holds here.

    python scripts/stability_study.py                                   # the committed study
    python scripts/stability_study.py --seeds 0-9 --settings nonshared,penalty,shared --jobs 2
    python scripts/stability_study.py --report-only                     # page + PNG from what is done

Options: ``--seeds`` (``0-9`` or ``0,3,5``), ``--estimators`` (any registered, default
``drmas,grpo``; the first is the baseline unless ``--baseline``), ``--settings`` (names of
:data:`SETTINGS`), ``--steps`` (RL steps, default the recipe's 40), ``--spike-k`` (default 2),
``--jobs`` (parallel training processes, 1 torch thread each), ``--out`` (run root, default
``runs/stability``), ``--md`` / ``--png`` (default ``docs/results/stability.{md,png}``),
``--report-only``.

Resumable: a run whose ``study.json`` exists is not rerun; a run killed midway resumes from its
last checkpoint; the warm start is computed once per setting and reused.

How the recipe is used (the only departures from ``drmas-bench train --recipe tiny --seed S``):
every run of a setting starts from ONE supervised warm start (the recipe's ``sft:`` stage, which
depends on ``sft.seed`` only), computed once and copied in as ``ckpt/step_0``; the run seed then
varies the RL stage (rollout sampling, mini-batch order). This saves ~50 s per run and makes the
pairs share their starting point.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Setting:
    """One arm family: recipe overrides shared by every estimator and seed.

    Attributes:
        name: directory and table name.
        overrides: ``--set``-style config overrides (``{"algo.c_inv": 0.5}``).
        about: one line for the page.
    """

    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    about: str = ""
    recipe: str = "tiny"


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("nonshared", {}, "the tiny recipe: one model per agent"),
    Setting("penalty", {"algo.c_inv": 0.5},
            "non-shared, format penalty c_inv 0.5 (recipe 0.1): meant to move the checker's reward mean away from "
            "the pooled mean through its unparsable verdicts (10-25 % of its calls) and so push its factor away "
            "from 1; the factor column shows how far it got"),
    Setting("shared", {"shared": True}, "one model (one worker group) for both agents"),
    Setting("fixer", {}, "the tiny_fixer recipe: a solver, and a fixer that acts only after a wrong answer (up to "
            "twice), so the fixer's rows come from failing episodes and its reward statistics differ from the team's",
            recipe="tiny_fixer"),
)}

DONE = "study.json"
DEFAULT_MD = ROOT / "docs/results/stability.md"
DEFAULT_PNG = ROOT / "docs/results/stability.png"


# ================================================================================= running


def run_dir(out: Path, setting: str, estimator: str, seed: int) -> Path:
    return out / setting / f"{estimator}-s{seed}"


def arm_overrides(arm: str) -> dict[str, Any]:
    """An arm's config overrides: ``NAME`` is an estimator; ``NAME@agent`` / ``NAME@uid`` also sets the
    reference's group index (``algo.group_by_agent`` true / false), which its estimator names need."""
    name, _, index = arm.partition("@")
    ov: dict[str, Any] = {"algo.estimator": name}
    if index:
        if index not in ("agent", "uid"):
            from drmas_bench.types import UserError

            raise UserError(f"arm {arm!r}: the group index after @ is agent or uid, not {index!r}")
        ov["algo.group_by_agent"] = index == "agent"
    return ov


def _config(setting: Setting, estimator: str, seed: int, steps: int | None):
    from drmas_trainer.config.train import load_config

    ov = dict(setting.overrides)
    ov.update(arm_overrides(estimator))
    ov["seed"] = seed
    if steps is not None:
        ov["steps"] = steps
    return load_config(setting.recipe, overrides=ov)


def warm_start(out: Path, setting: Setting) -> Path:
    """The setting's warm start: one training run of 1 RL step; its ``ckpt/step_0`` is reused."""
    from drmas_trainer.checkpoint import complete_checkpoints
    from drmas_trainer.trainer import train

    d = out / setting.name / "_warm"
    step0 = d / "ckpt" / "step_0"
    if not any(s == 0 for s, _ in (complete_checkpoints(d / "ckpt") if (d / "ckpt").is_dir() else [])):
        train(_config(setting, "drmas", 0, 1), d, fresh=True, use_ray=False, progress=False)
    return step0


def one_run(out: Path, setting_name: str, estimator: str, seed: int, steps: int | None) -> dict[str, Any]:
    """Train (or resume) one run from the setting's warm start, evaluate it, write ``study.json``."""
    from drmas_bench.api import EvalConfig, evaluate
    from drmas_trainer.checkpoint import complete_checkpoints
    from drmas_trainer.trainer import train

    setting = SETTINGS[setting_name]
    d = run_dir(out, setting_name, estimator, seed)
    if (d / DONE).is_file():
        return json.loads((d / DONE).read_text())
    step0 = warm_start(out, setting)
    ckpt = d / "ckpt"
    if not (ckpt.is_dir() and complete_checkpoints(ckpt)):
        if d.exists():
            shutil.rmtree(d)
        ckpt.mkdir(parents=True)
        shutil.copytree(step0, ckpt / "step_0")
    t0, c0 = time.perf_counter(), time.process_time()
    summary = train(_config(setting, estimator, seed, steps), d, resume=True, use_ray=False, progress=False)
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    c1 = time.process_time()
    ev = evaluate(EvalConfig(model=str(ckpt / "latest"), suite="toy", n=16, out=str(d / "eval"), progress=False, seed=0))
    micro = ev.data["micro"]
    # train_s / train_cpu_s: wall and CPU seconds of this process's training (a resumed run: its last part only)
    rec = {"setting": setting_name, "estimator": estimator, "seed": seed, "train_s": train_s,
           "train_cpu_s": train_cpu_s, "eval_cpu_s": time.process_time() - c1,
           "reward_first5": summary["reward_first5"], "reward_last5": summary["reward_last5"],
           "eval_avg": micro["avg@n"], "eval_ci95": micro["ci95"]["avg@n"], "eval_questions": micro["questions"],
           "eval_n": micro["n"]}
    (d / DONE).write_text(json.dumps(rec, indent=1))
    return rec


def run_all(out: Path, settings: list[str], estimators: list[str], seeds: list[int], steps: int | None,
            jobs: int) -> None:
    """Every missing run, ``jobs`` processes at a time (settings in the order given: earlier first)."""
    todo = [(s, e, k) for s in settings for k in seeds for e in estimators
            if not (run_dir(out, s, e, k) / DONE).is_file()]
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # warm starts first (the runs reuse them)
        list(pool.map(lambda s: _subprocess(out, s, None, None, steps), sorted({t[0] for t in todo})))
        futs = {pool.submit(_subprocess, out, s, e, k, steps): (s, e, k) for s, e, k in todo}
        for f in cf.as_completed(futs):
            s, e, k = futs[f]
            print(f"[study] {s} {e} seed {k}: {'done' if f.result() == 0 else 'FAILED (rc %d)' % f.result()}",
                  flush=True)


def _subprocess(out: Path, setting: str, estimator: str | None, seed: int | None, steps: int | None) -> int:
    cmd = [sys.executable, __file__, "--out", str(out), "--_one", setting, str(estimator), str(seed)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    log = out / setting / f"{estimator or '_warm'}-s{seed if seed is not None else 0}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(log, "a") as f:
        return subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)


# ================================================================================= statistics


#: bootstrap resamples of a paired difference's CI (10 pairs: cheap, so more than the report's 2000)
N_BOOT = 10_000


def wilcoxon_p(d: list[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value (scipy; exact for small n without ties), NaN if < 1 nonzero."""
    from scipy.stats import wilcoxon

    if sum(x != 0 for x in d) < 1:
        return float("nan")
    return float(wilcoxon(d, zero_method="wilcox", alternative="two-sided").pvalue)


def cohen_dz(d: list[float]) -> float:
    """Mean paired difference over its standard deviation."""
    if len(d) < 2:
        return float("nan")
    sd = statistics.stdev(d)
    return statistics.fmean(d) / sd if sd > 0 else float("nan")


def paired(a: list[float], b: list[float]) -> dict[str, Any]:
    """Paired comparison of ``b - a`` over the same seeds (finite pairs only)."""
    from drmas_bench.metrics import bootstrap_ci
    from drmas_bench.report.compare import sign_test_p

    d = [y - x for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)]
    if not d:
        return {"n": 0}
    lo, hi = bootstrap_ci(d, n_boot=N_BOOT, seed=0)  # the package's percentile bootstrap (numpy, seeded)
    return {"n": len(d), "mean_a": statistics.fmean(x for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)),
            "mean_b": statistics.fmean(y for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)),
            "diff": statistics.fmean(d), "ci": (lo, hi), "dz": cohen_dz(d), "b_greater": sum(x > 0 for x in d),
            "sign_p": sign_test_p(sum(x > 0 for x in d), sum(x < 0 for x in d)), "wilcoxon_p": wilcoxon_p(d)}


# ================================================================================= per-run metrics


def run_metrics(d: Path, spike_k: float) -> dict[str, Any]:
    """From a finished run: per agent spread, spikes, factor; reward curve; eval."""
    from drmas_trainer import metric_names as N
    from drmas_trainer.runlog import grad_norm_spread, read_metrics

    recs = [r for r in read_metrics(d) if N.SCORE in r]
    done = json.loads((d / DONE).read_text())
    spread = grad_norm_spread(recs)
    out: dict[str, Any] = {"reward": [r[N.SCORE] for r in recs], "eval": done["eval_avg"], "eval_ci": done["eval_ci95"],
                           "train_s": done.get("train_s"), "train_cpu_s": done.get("train_cpu_s"),
                           "eval_cpu_s": done.get("eval_cpu_s"),
                           "last10": statistics.fmean(r[N.SCORE] for r in recs[-10:]), "agents": {}}
    for a, s in spread.items():
        g = [r.get(N.agent(a, N.GRAD_NORM)) for r in recs]
        f = [r.get(N.agent(a, N.MOMENT_FACTOR)) for r in recs]
        finite_f = [x for x in f if isinstance(x, (int, float)) and math.isfinite(x)]
        m2 = [r[N.agent(a, N.ADV_MEAN)] ** 2 + r[N.agent(a, N.ADV_STD)] ** 2 for r in recs
              if all(isinstance(r.get(N.agent(a, q)), (int, float)) and math.isfinite(r[N.agent(a, q)])
                     for q in (N.ADV_MEAN, N.ADV_STD))]
        g_fin = [x for x in g if isinstance(x, (int, float)) and math.isfinite(x)]
        out["agents"][a] = {"spread": s["spread"], "max": s["max"], "median": s["median"],
                            "g2": statistics.fmean(x * x for x in g_fin) if g_fin else float("nan"),
                            "spikes": sum(1 for x in g if isinstance(x, (int, float)) and x > spike_k * s["median"]),
                            "factor": statistics.fmean(finite_f) if finite_f else float("nan"),
                            "adv_m2": statistics.fmean(m2) if m2 else float("nan"),
                            "steps": list(zip(g, f))}
    return out


# ================================================================================= report


METRICS = (  # (key, label, predicted sign of grpo - drmas under the paper's claim)
    ("spread", "grad-norm spread (max/median)", +1),
    ("spikes", "steps with grad norm > k x median", +1),
    ("max", "max grad norm", +1),
    ("median", "median grad norm (its level)", +1),
)


def _fmt(x: float, nd: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}f}"


def _recipe_line(recipe: str, steps: int | None) -> str:
    """One sentence describing a recipe's RL stage, read from the recipe itself."""
    from drmas_trainer.config.train import load_config

    cfg = load_config(recipe)
    if recipe == "tiny":
        return ("`tiny` recipe (toy a+b workflow, solver + checker, two copies of the 1.6M-param tiny-random "
                f"model, CPU): {steps or cfg.steps} RL steps (recipe: {cfg.steps}) of {cfg.rollout.prompts_per_step} "
                f"prompts x {cfg.rollout.n} rollouts, lr 3e-4, {cfg.algo.mini_batches} mini-batches.")
    from drmas_bench.workflows import get_workflow

    wf = get_workflow(cfg.workflow)
    return (f"`{recipe}` recipe (workflow `{cfg.workflow}`, agents {', '.join(wf.agents)}, one {cfg.model} model per "
            f"agent, {cfg.device.upper()}): {steps or cfg.steps} RL steps (recipe: {cfg.steps}) of "
            f"{cfg.rollout.prompts_per_step} prompts x {cfg.rollout.n} rollouts (T {cfg.rollout.temperature:g}), "
            f"lr {cfg.agent_defaults.get('lr', 'default')}, {cfg.algo.mini_batches} mini-batches, c_inv {cfg.algo.c_inv:g}.")


def report(out: Path, settings: list[str], estimators: list[str], baseline: str, seeds: list[int], spike_k: float,
           md: Path, png: Path, command: str, steps: int | None) -> None:
    data: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for s in settings:
        for e in estimators:
            for k in seeds:
                d = run_dir(out, s, e, k)
                if (d / DONE).is_file():
                    data.setdefault(s, {}).setdefault(e, {})[k] = run_metrics(d, spike_k)
    recipes = sorted({SETTINGS[s].recipe for s in settings})
    title = ("# Gradient-norm stability: Dr. MAS vs GRPO on the tiny recipe" if recipes == ["tiny"] else
             f"# Gradient-norm stability on the {', '.join(f'`{r}`' for r in recipes)} recipe: " + ", ".join(estimators))
    lines = [
        title,
        "",
        "Generated by `scripts/stability_study.py` (every number below is computed by it). Rerun / complete:",
        "",
        "```",
        command,
        "```",
        "",
        "The command is resumable: finished runs are kept, missing ones are trained, the page and PNG are rewritten.",
        "",
        "**Setup.** " + " ".join(_recipe_line(r, steps) for r in recipes) + " Every run of a setting "
        "starts from the same warm start (the recipe's `sft:` stage, computed once per setting); the seed varies "
        "the RL stage. Pairs: same seed, same warm start, same prompt order; only the estimator differs. "
        f"Eval: toy suite, 64 questions x 16 samples (T 0.6), avg@16 with its bootstrap 95 % CI. Spikes: steps with "
        f"`agent/<a>/actor/grad_norm` > {spike_k:g} x the run's median. Factor: the mean over steps of "
        "`agent/<a>/critic/moment_factor/mean`, Lemma 4.2's `(sigma_k^2 + (mu_k - mu)^2) / sigma^2` of the run's "
        "own rollouts (population moments per prompt group, groups with sigma > 0).",
        "",
        "Tests per metric, over seeds: difference = other - baseline, mean with a bootstrap 95 % CI, Cohen's d_z "
        "(mean / sd of the differences), exact two-sided sign test, two-sided Wilcoxon signed-rank test. "
        "A claim *holds here* when both tests give p < 0.05 in the predicted direction, is *contradicted* when "
        "both give p < 0.05 in the other direction, and is *not shown* otherwise.",
        "",
    ]
    claims: list[str] = []
    for s in settings:
        if s not in data:
            lines += [f"## Setting `{s}`: no finished runs yet", ""]
            continue
        arms = data[s]
        lines += [f"## Setting `{s}`: {SETTINGS[s].about}", ""]
        done = {e: sorted(arms.get(e, {})) for e in estimators}
        lines += ["Finished runs: " + ", ".join(f"{e} {len(v)} seeds ({_seed_list(v)})" for e, v in done.items()), ""]
        lines += _time_lines(arms)
        agents = sorted({a for e in arms.values() for r in e.values() for a in r["agents"]})
        lines += _summary_lines(arms, agents, baseline)
        # per-arm summary table
        lines += ["| estimator | seeds | reward last 10 | eval avg@16 (%) | " + " | ".join(
            f"{a}: spread / spikes / factor / E[A^2]" for a in agents) + " |",
            "| --- | --- | --- | --- | " + " | ".join("---" for _ in agents) + " |"]
        for e in estimators:
            rs = list(arms.get(e, {}).values())
            if not rs:
                continue
            cells = [e, str(len(rs)), _fmt(statistics.fmean(r["last10"] for r in rs)),
                     _fmt(100 * statistics.fmean(r["eval"] for r in rs), 1)]
            for a in agents:
                xs = [r["agents"][a] for r in rs if a in r["agents"]]
                cells.append(f"{_fmt(statistics.median(x['spread'] for x in xs), 2)} / "
                             f"{_fmt(statistics.fmean(x['spikes'] for x in xs), 1)} / "
                             f"{_fmt(statistics.fmean(x['factor'] for x in xs), 3)} / "
                             f"{_fmt(statistics.fmean(x['adv_m2'] for x in xs), 3)}")
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "(spread: median over seeds; spikes, factor and E[A^2] (the realised second moment of the agent's "
                  "advantages, `adv mean^2 + adv std^2` per step, averaged over steps): mean over seeds)", ""]
        for e in estimators:
            if e == baseline or not arms.get(e) or not arms.get(baseline):
                continue
            common = sorted(set(arms[e]) & set(arms[baseline]))
            lines += [f"### {e} vs {baseline}, paired by seed ({len(common)} pairs)", "",
                      f"| metric | {baseline} mean | {e} mean | diff ({e} - {baseline}) [95 % CI] | d_z | "
                      f"{e} higher in | sign p | Wilcoxon p |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
            rows: list[tuple[str, list[float], list[float], int]] = []
            for a in agents:
                for key, label, sign in METRICS:
                    rows.append((f"{a}: {label}", [arms[baseline][k]["agents"][a][key] for k in common],
                                 [arms[e][k]["agents"][a][key] for k in common], sign))
            rows.append(("reward, last 10 steps", [arms[baseline][k]["last10"] for k in common],
                         [arms[e][k]["last10"] for k in common], -1))
            rows.append(("eval avg@16 (fraction)", [arms[baseline][k]["eval"] for k in common],
                         [arms[e][k]["eval"] for k in common], -1))
            for label, xa, xb, sign in rows:
                p = paired(xa, xb)
                if not p["n"]:
                    continue
                lines.append(f"| {label} | {_fmt(p['mean_a'])} | {_fmt(p['mean_b'])} | {_fmt(p['diff'])} "
                             f"[{_fmt(p['ci'][0])}, {_fmt(p['ci'][1])}] | {_fmt(p['dz'], 2)} | {p['b_greater']}/{p['n']} "
                             f"| {_fmt(p['sign_p'])} | {_fmt(p['wilcoxon_p'])} |")
                if e == "grpo" and baseline == "drmas":
                    sig = p["sign_p"] < 0.05 and p["wilcoxon_p"] < 0.05
                    verdict = ("holds" if sig and p["diff"] * sign > 0 else
                               "contradicted (significant in the opposite direction)" if sig and p["diff"] * sign < 0
                               else "not shown")
                    want = "higher under GRPO" if sign > 0 else "lower under GRPO"
                    claims.append(f"- `{s}`, {label}: {want} (the paper's direction): "
                                  f"**{verdict}** (diff {_fmt(p['diff'])}, "
                                  f"sign p {_fmt(p['sign_p'])}, Wilcoxon p {_fmt(p['wilcoxon_p'])}, n {p['n']})")
            lines.append("")
        lines += _factor_lines(arms, agents, baseline, estimators)
        lines += _ratio_lines(arms, agents)
        fact, fclaims = _factorial_lines(s, arms, agents)
        lines += fact
        claims += fclaims
    lines += ["## Which claims hold here", ""] + (claims or ["- no complete pairs yet"]) + [""]
    lines += _closing(recipes, steps)
    png_rel = os.path.relpath(png, md.parent)
    steps_png = png.with_name(png.stem + "_steps" + png.suffix)
    lines += ["", f"![grad norm and factor over steps]({os.path.relpath(steps_png, md.parent)})", "",
              f"![stability]({png_rel})", ""]
    md.parent.mkdir(parents=True, exist_ok=True)
    plot(data, settings, estimators, png, spike_k)
    plot_steps(data, settings, estimators, steps_png)
    md.write_text("\n".join(lines))
    print(f"[study] wrote {md} and {png}")


def _time_lines(arms: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """Seconds per run, from the runs that recorded them (one process each, 1 torch thread)."""
    rs = [r for e in arms.values() for r in e.values() if isinstance(r.get("train_cpu_s"), (int, float))]
    if not rs:
        return []
    cpu = [r["train_cpu_s"] + (r.get("eval_cpu_s") or 0.0) for r in rs]
    wall = [r["train_s"] for r in rs if isinstance(r.get("train_s"), (int, float))]
    return [f"Time per run ({len(rs)} runs that recorded it): {statistics.median(cpu):.0f} s of CPU (median; "
            f"training {statistics.median(r['train_cpu_s'] for r in rs):.0f} s, the final eval the rest; the "
            f"warm start is shared), {statistics.median(wall):.0f} s of wall time for training on the shared 2-core "
            f"machine (median; range {min(wall):.0f}-{max(wall):.0f} s, set by the other jobs' load).", ""]


def _seed_list(v: list[int]) -> str:
    if v and v == list(range(v[0], v[-1] + 1)):
        return f"{v[0]}-{v[-1]}"
    return ",".join(map(str, v)) or "none"


def _factor_lines(arms: dict[str, dict[int, dict[str, Any]]], agents: list[str], baseline: str,
                  estimators: list[str]) -> list[str]:
    """Grad norm against the predicted factor: per agent, the Spearman correlation over (run, step)."""
    from scipy.stats import spearmanr

    out = ["Grad norm vs the predicted factor (Spearman rank correlation over every (run, step) of the arm; "
           "under GRPO a factor > 1 predicts a larger gradient, under Dr. MAS the factor should not matter):", "",
           "| estimator | " + " | ".join(f"{a}: rho (steps)" for a in agents) + " |",
           "| --- | " + " | ".join("---" for _ in agents) + " |"]
    for e in estimators:
        if not arms.get(e):
            continue
        cells = [e]
        for a in agents:
            pts = [(f, g) for r in arms[e].values() for g, f in r["agents"].get(a, {}).get("steps", [])
                   if isinstance(g, (int, float)) and isinstance(f, (int, float)) and math.isfinite(g) and math.isfinite(f)]
            rho = spearmanr([p[0] for p in pts], [p[1] for p in pts]).statistic if len(pts) > 2 else float("nan")
            cells.append(f"{_fmt(float(rho), 2)} ({len(pts)})")
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]



# The 2 x 2 of the ablation: (trajectory-level vs step-level) x (global vs per-agent statistics).
# REFERENCE 2c: with the uid as group index traj_traj is GRPO and agent_agent the global step-level
# estimator; with (uid, agent) agent_agent is Dr. MAS and traj_traj averages the agent's own rows
# per trajectory. An arm may name a cell by the project's name or the reference's.
CELLS: dict[str, tuple[str, str]] = {
    "grpo": ("traj", "global"), "traj_traj@uid": ("traj", "global"),
    "global_step": ("step", "global"), "agent_agent@uid": ("step", "global"),
    "traj_traj@agent": ("traj", "agent"),
    "drmas": ("step", "agent"), "agent_agent@agent": ("step", "agent"),
}


def _cell_arms(arms: dict[str, dict[int, dict[str, Any]]]) -> dict[tuple[str, str], str]:
    """The arm that fills each cell of the 2 x 2 (the first listed, when two name the same cell)."""
    out: dict[tuple[str, str], str] = {}
    for e in arms:
        if e in CELLS and CELLS[e] not in out:
            out[CELLS[e]] = e
    return out


def _effect_values(arms: dict[str, dict[int, dict[str, Any]]], agent: str | None, key: str,
                   effect: str) -> list[float]:
    """Per seed with all four cells of the 2 x 2: one main effect (or the interaction) of ``key``."""
    cells = _cell_arms(arms)
    gt, gs, at, as_ = (cells[("traj", "global")], cells[("step", "global")], cells[("traj", "agent")],
                       cells[("step", "agent")])
    out = []
    for k in sorted(set(arms[gt]) & set(arms[gs]) & set(arms[at]) & set(arms[as_])):
        v = {c: float(arms[c][k][key] if agent is None else arms[c][k]["agents"][agent][key]) for c in (gt, gs, at, as_)}
        out.append((v[gt] - v[at] + v[gs] - v[as_]) / 2 if effect == "statistics" else
                   (v[gt] - v[gs] + v[at] - v[as_]) / 2 if effect == "level" else
                   (v[gt] - v[at]) - (v[gs] - v[as_]))
    return out


def _summary_lines(arms: dict[str, dict[int, dict[str, Any]]], agents: list[str], baseline: str) -> list[str]:
    """The page's answer in a few lines: the agent whose factor is farthest above 1, Dr. MAS vs GRPO on
    it, and (with the 2 x 2) which change carries the difference. Every number is from the tests below."""
    if baseline not in arms or "grpo" not in arms or not agents:
        return []

    def factor(a: str) -> float:
        xs = [r["agents"][a]["factor"] for e in arms.values() for r in e.values() if a in r["agents"]]
        xs = [x for x in xs if math.isfinite(x)]
        return statistics.fmean(xs) if xs else float("nan")

    top = max(agents, key=lambda a: factor(a) if math.isfinite(factor(a)) else -1.0)
    common = sorted(set(arms["grpo"]) & set(arms[baseline]))
    out = [f"**In short.** The agent whose factor is farthest above 1 is the {top} (F = {factor(top):.2f}, "
           f"mean over every run's steps). {baseline} vs grpo on its pre-clip grad norm, paired over "
           f"{len(common)} seeds:", ""]
    for key, label, _ in METRICS:
        p = paired([arms[baseline][k]["agents"][top][key] for k in common],
                   [arms["grpo"][k]["agents"][top][key] for k in common])
        if p["n"]:
            out.append(f"- {label}: {_fmt(p['mean_a'])} under {baseline}, {_fmt(p['mean_b'])} under grpo; grpo higher "
                       f"in {p['b_greater']}/{p['n']} seeds (sign p {_fmt(p['sign_p'])}, Wilcoxon p "
                       f"{_fmt(p['wilcoxon_p'])})")
    if len(_cell_arms(arms)) == 4:
        out += ["", f"Which change carries it (the 2 x 2's main effects on the {top}, per seed, positive = global "
                    "statistics / trajectory level higher):", ""]
        for key, label, _ in METRICS:
            parts = []
            for effect in ("statistics", "level"):
                d = _effect_values(arms, top, key, effect)
                p = paired([0.0] * len(d), d)
                if p["n"]:
                    parts.append(f"{effect} {_fmt(p['diff'])} (positive in {p['b_greater']}/{p['n']}, sign p "
                                 f"{_fmt(p['sign_p'])}, Wilcoxon p {_fmt(p['wilcoxon_p'])})")
            out.append(f"- {label}: " + "; ".join(parts))
    return out + [""]


def _ratio_lines(arms: dict[str, dict[int, dict[str, Any]]], agents: list[str]) -> list[str]:
    """Predicted vs measured gradient ratio of global over per-agent statistics, per agent and level."""
    cells = _cell_arms(arms)
    pairs = [(cells[(lv, "global")], cells[(lv, "agent")]) for lv in ("step", "traj")
             if (lv, "global") in cells and (lv, "agent") in cells]
    if not pairs:
        return []
    out = ["Predicted vs measured gradient ratio, global over per-agent statistics (Lemma 4.2; "
           "`scripts/theory_check.py` checks the formula by Monte Carlo in its idealised model). Predicted: the "
           "factor F of the global arm's own rollouts (mean over steps and seeds), a ratio of second moments, so a "
           "grad-norm ratio of about sqrt(F). Measured, per seed then the median over seeds: E[A^2] ratio (the "
           "realised advantage second moments) and E[g^2] ratio (mean squared pre-clip grad norm over steps). "
           "The lemma is exact for step-level statistics; for trajectory-level ones F is a proxy. F compares global "
           "statistics with an agent-wise E[A^2] of 1; where an agent's per-prompt pools are small and often all "
           "equal (A = 0) its realised agent-wise E[A^2] is well below 1 and the measured ratio exceeds F by about "
           "that much.", "",
           "| global / per-agent | agent | predicted F | E[A^2] global / per-agent (mean) | measured E[A^2] ratio | "
           "measured E[g^2] ratio | predicted sqrt(F) | measured median grad-norm ratio | seeds |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for glob, agw in pairs:
        common = sorted(set(arms[glob]) & set(arms[agw]))
        for a in agents:
            f = [arms[glob][k]["agents"][a]["factor"] for k in common if a in arms[glob][k]["agents"]]
            f = [x for x in f if math.isfinite(x)]

            def ratio(key: str) -> float:
                rs = []
                for k in common:
                    x, y = arms[glob][k]["agents"].get(a, {}).get(key), arms[agw][k]["agents"].get(a, {}).get(key)
                    if isinstance(x, float) and isinstance(y, float) and math.isfinite(x) and math.isfinite(y) and y > 0:
                        rs.append(x / y)
                return statistics.median(rs) if rs else float("nan")

            def mean(e: str, key: str) -> float:
                xs = [arms[e][k]["agents"][a][key] for k in common if a in arms[e][k]["agents"]]
                xs = [x for x in xs if math.isfinite(x)]
                return statistics.fmean(xs) if xs else float("nan")

            pf = statistics.fmean(f) if f else float("nan")
            out.append(f"| `{glob}` / `{agw}` | {a} | {_fmt(pf, 2)} | {_fmt(mean(glob, 'adv_m2'), 2)} / "
                       f"{_fmt(mean(agw, 'adv_m2'), 2)} | {_fmt(ratio('adv_m2'), 2)} | {_fmt(ratio('g2'), 2)} "
                       f"| {_fmt(math.sqrt(pf) if pf == pf else pf, 2)} | {_fmt(ratio('median'), 2)} | {len(common)} |")
    return out + [""]


def _factorial_lines(setting: str, arms: dict[str, dict[int, dict[str, Any]]],
                     agents: list[str]) -> tuple[list[str], list[str]]:
    """Which of Dr. MAS's two changes carries an effect: the 2 x 2's main effects, paired by seed.

    Per seed, with the four cells g-traj (GRPO), g-step (global step-level), a-traj, a-step (Dr. MAS):
    statistics effect = ((g-traj - a-traj) + (g-step - a-step)) / 2 (global minus per-agent),
    level effect = ((g-traj - g-step) + (a-traj - a-step)) / 2 (trajectory minus step level),
    interaction = (g-traj - a-traj) - (g-step - a-step). Each is tested against 0 over seeds.
    """
    cells = _cell_arms(arms)
    if len(cells) < 4:
        return [], []
    gt, gs, at, as_ = (cells[("traj", "global")], cells[("step", "global")], cells[("traj", "agent")],
                       cells[("step", "agent")])
    common = sorted(set(arms[gt]) & set(arms[gs]) & set(arms[at]) & set(arms[as_]))
    lines = [f"### Which change carries it: the 2 x 2, paired by seed ({len(common)} seeds with all four cells)", "",
             f"Cells: global statistics at trajectory level `{gt}`, at step level `{gs}`; per-agent statistics at "
             f"trajectory level `{at}`, at step level `{as_}`. Per seed: *statistics* = mean over the two levels of "
             "(global - per-agent); *level* = mean over the two statistics of (trajectory - step); *interaction* = "
             "(global - per-agent at trajectory level) - (the same at step level). Each tested against 0 over seeds.", "",
             "| metric | effect | mean [95 % CI] | d_z | positive in | sign p | Wilcoxon p |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    claims: list[str] = []

    rows = [(a, key, label) for a in agents for key, label, _ in METRICS]
    rows += [(None, "last10", "reward, last 10 steps"), (None, "eval", "eval avg@16 (fraction)")]
    for a, key, label in rows:
        name = f"{a}: {label}" if a else label
        for effect in ("statistics", "level", "interaction"):
            d = _effect_values(arms, a, key, effect)
            p = paired([0.0] * len(d), d)
            if not p["n"]:
                continue
            lines.append(f"| {name} | {effect} | {_fmt(p['diff'])} [{_fmt(p['ci'][0])}, {_fmt(p['ci'][1])}] | "
                         f"{_fmt(p['dz'], 2)} | {p['b_greater']}/{p['n']} | {_fmt(p['sign_p'])} | {_fmt(p['wilcoxon_p'])} |")
            if effect != "interaction" and a is not None:
                sig = p["sign_p"] < 0.05 and p["wilcoxon_p"] < 0.05
                what = ("global statistics raise it (per-agent statistics lower it)" if effect == "statistics"
                        else "trajectory-level normalisation raises it (step level lowers it)")
                verdict = ("yes" if sig and p["diff"] > 0 else "the opposite (significant)" if sig and p["diff"] < 0
                           else "not shown")
                claims.append(f"- `{setting}`, {name}, {effect} effect: {what}? **{verdict}** (mean {_fmt(p['diff'])}, "
                              f"sign p {_fmt(p['sign_p'])}, Wilcoxon p {_fmt(p['wilcoxon_p'])}, n {p['n']})")
    return lines + [""], claims


def _closing(recipes: list[str], steps: int | None) -> list[str]:
    if "tiny_fixer" in recipes:
        return _closing_fixer(steps)
    return [
        "## Reading",
        "",
        "- The factor is a property of the rollouts; in the toy workflow every agent's rows carry the same "
        "trajectory reward R, so the agents' statistics differ only through the format penalty and through "
        "action weighting (the solver acts twice in rejected trajectories). GRPO here normalises trajectory "
        "means over trajectories, not the global step-level statistics of the lemma, so the factor is the "
        "lemma's prediction for global statistics, used as a proxy.",
        "- A 1.6M-parameter model on one-digit sums with 64 trajectories per step: per-step rewards are noisy "
        "(+-0.1) and the eval CIs of one run are +-7 points; conclusions are about this setting only.",
        "- E[A^2] under Dr. MAS is below 1 by construction: (n-1)/n from the unbiased std, times the share of "
        "(prompt, agent) groups whose scores are not all equal (those get A = 0). The checker acts once per "
        "trajectory, so its E[A^2] is the same under both estimators; the solver's differs under GRPO because "
        "its rows over-weight the rejected (retried) trajectories.",
        "- Many metrics are tested at once with no multiple-comparison correction: a single p just under 0.05 "
        "is weak evidence; look at the direction across agents and settings.",
        "- A setting where the factor is far from 1 (a fixer that acts only on failing episodes), with the "
        "step-vs-agent 2 x 2: [fixer.md](fixer.md).",
    ]


def _closing_fixer(steps: int | None) -> list[str]:
    return [
        "## Reading",
        "",
        "- Why the factor is far from 1 here: every row of an episode carries the episode's reward, and the fixer "
        "acts only in episodes whose first answer was wrong (twice in those it cannot fix at once), so its rows' "
        "mean sits far below the group's pooled mean while the solver's sits above it. The factor belongs to the "
        "rollouts (logged in every arm) and grows as the solver improves: fewer failures, each a smaller share of "
        "its group.",
        "- What it predicts: with global statistics a failing episode's rows get an advantage of about "
        "-mean/std of the group, large when most of the group succeeds, and the fixer's rows are almost all such "
        "rows; with per-agent statistics the fixer's rows are normalised among themselves and are often all "
        "equal (A = 0) or a single row (the reference's rule: A = the raw score). So under per-agent statistics "
        "the fixer's gradient is often exactly 0, which pulls its median down: the spike count (steps above "
        "k x the run's median) then also counts ordinary steps, and a level raised at every step (the median) is "
        "no spike at all by that count. Read spikes with the max, the median and E[g^2].",
        "- Step level vs trajectory level: in this workflow all rows of an episode share its reward (up to the "
        "format penalty), so the two levels differ only in how the statistics weight episodes: step level counts "
        "a failing episode once per row (up to 3), trajectory level once. For the per-agent cells that changes "
        "only the fixer's pool (the solver acts once per episode).",
        "- What it can say about the paper's 3B-8B runs: the mechanism of Lemma 4.2, measured on a real trainer "
        "loop with a team whose agents' reward statistics differ by construction, as a searcher's or a "
        "re-solver's do when they act mostly on failing episodes. What it cannot say: whether such gradients "
        "destabilise a large model's training (a 1.6M-parameter model, "
        f"{steps or 30} RL steps, lr 3e-4, gradient clipping at 1.0 bounds every update whatever the pre-clip norm), nor the effect on accuracy at scale (the solver is "
        "near its ceiling on one-digit sums and the fixer rarely fixes), nor anything about response lengths, "
        "PPO clipping at long horizons, or the paper's benchmarks.",
        "- `agent_traj@agent` (what the reference's ablation branch runs by default under its search script: "
        "the row pool's mean, the cell pool's std) puts the numerator outside the std's pool: where an agent's "
        "cell averages in a prompt group are all equal but its rows are not (two fixer rows of one episode, one "
        "with the format penalty), the std is 0 and A = (x - mean) / 1e-6, about 5e4 for a 0.05 gap. Its E[A^2] "
        "and max grad norm in the tables are those events; `algo.std_floor` guards against them.",
        "- Many metrics are tested at once with no multiple-comparison correction: a single p just under 0.05 "
        "is weak evidence; look at the direction across agents, metrics and the 2 x 2's cells.",
    ]


def plot(data: dict[str, Any], settings: list[str], estimators: list[str], png: Path, spike_k: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [s for s in settings if s in data] or settings[:1]
    fig, axes = plt.subplots(len(rows), 4, figsize=(20, 4.2 * len(rows)), squeeze=False)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {e: c for e, c in zip(estimators, palette)}
    markers = ("o", "s", "^", "D")
    for i, s in enumerate(rows):
        arms = data.get(s, {})
        ax_r, ax_s, ax_f, ax_e = axes[i]
        agents = sorted({a for e in arms.values() for r in e.values() for a in r["agents"]})
        for e in estimators:
            rs = list(arms.get(e, {}).values())
            if not rs:
                continue
            n = min(len(r["reward"]) for r in rs)
            m = np.array([[x if isinstance(x, (int, float)) else np.nan for x in r["reward"][:n]] for r in rs])
            x = np.arange(1, n + 1)
            mean = np.nanmean(m, 0)
            ax_r.plot(x, mean, color=colors[e], label=f"{e} (mean of {len(rs)} seeds)")
            ax_r.fill_between(x, np.nanpercentile(m, 10, 0), np.nanpercentile(m, 90, 0), color=colors[e], alpha=0.2)
        ax_r.set(title=f"{s}: reward per step (band: 10-90 % over seeds)", xlabel="step", ylabel="mean trajectory reward")
        ax_r.legend(fontsize=8)
        # spread per seed, paired: x = drmas, y = other
        base = estimators[0]
        for j, a in enumerate(agents):
            for e in estimators[1:]:
                common = sorted(set(arms.get(e, {})) & set(arms.get(base, {})))
                xs = [arms[base][k]["agents"][a]["spread"] for k in common]
                ys = [arms[e][k]["agents"][a]["spread"] for k in common]
                ax_s.scatter(xs, ys, marker=markers[j % 4], label=f"{a}: {e} vs {base}", color=colors[e])
        lim = ax_s.get_xlim()[1] if agents else 1
        top = max(lim, ax_s.get_ylim()[1])
        ax_s.plot([1, top], [1, top], color="grey", linewidth=1)
        ax_s.set_xscale("log")
        ax_s.set_yscale("log")
        ax_s.set(title="grad-norm spread (max/median), one point per seed", xlabel=f"{base}", ylabel="other estimator")
        ax_s.legend(fontsize=8)
        for e in estimators:
            for j, a in enumerate(agents):
                pts = [(f, g) for r in arms.get(e, {}).values() for g, f in r["agents"].get(a, {}).get("steps", [])
                       if isinstance(g, (int, float)) and isinstance(f, (int, float))
                       and math.isfinite(g) and math.isfinite(f) and g > 0]
                if pts:
                    ax_f.scatter([p[0] for p in pts], [p[1] for p in pts], s=6, alpha=0.35, color=colors[e],
                                 marker=markers[j % 4], label=f"{e}: {a}")
        ax_f.set_yscale("log")
        ax_f.axvline(1.0, color="grey", linewidth=1)
        ax_f.set(title="per step: grad norm vs predicted factor", xlabel="(sigma_k^2 + (mu_k - mu)^2) / sigma^2",
                 ylabel="agent grad norm (pre-clip)")
        ax_f.legend(fontsize=8, markerscale=2)
        for q, e in enumerate(estimators):
            rs = sorted(arms.get(e, {}).items())
            for t, (k, r) in enumerate(rs):
                lo, hi = r["eval_ci"]
                xx = q + (t - len(rs) / 2) * 0.04
                ax_e.errorbar([xx], [100 * r["eval"]], yerr=[[100 * (r["eval"] - lo)], [100 * (hi - r["eval"])]],
                              fmt="o", color=colors[e], markersize=3, linewidth=0.8)
            if rs:
                ax_e.hlines(100 * statistics.fmean(r["eval"] for _, r in rs), q - 0.3, q + 0.3, color="black")
        ax_e.set_xticks(range(len(estimators)), estimators)
        ax_e.set(title="final eval avg@16 per seed (95 % CI), line = mean", ylabel="avg@16 (%)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)
    plt.close(fig)



def plot_steps(data: dict[str, Any], settings: list[str], estimators: list[str], png: Path) -> None:
    """Per setting: each agent's grad norm over steps for every arm (mean over seeds, 10-90 % band), and
    each agent's factor over steps (mean over seeds and arms: the factor belongs to the rollouts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [s for s in settings if s in data] or settings[:1]
    agents_of = {s: sorted({a for e in data.get(s, {}).values() for r in e.values() for a in r["agents"]}) for s in rows}
    ncol = max(1, max(len(v) for v in agents_of.values())) + 1
    fig, axes = plt.subplots(len(rows), ncol, figsize=(6 * ncol, 4.2 * len(rows)), squeeze=False)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {e: c for e, c in zip(estimators, palette)}

    def curve(rs: list[dict[str, Any]], a: str, which: int) -> np.ndarray:
        n = min(len(r["agents"][a]["steps"]) for r in rs)
        return np.array([[x[which] if isinstance(x[which], (int, float)) else np.nan for x in r["agents"][a]["steps"][:n]]
                         for r in rs], dtype=float)

    import warnings

    warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)  # a step where no run logged a factor
    warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
    for i, s in enumerate(rows):
        arms = data.get(s, {})
        agents = agents_of[s]
        ax_f = axes[i][ncol - 1]
        for j, a in enumerate(agents):
            ax = axes[i][j]
            for e in estimators:
                rs = [r for r in arms.get(e, {}).values() if a in r["agents"]]
                if not rs:
                    continue
                m = curve(rs, a, 0)
                x = np.arange(1, m.shape[1] + 1)
                ax.plot(x, np.nanmean(m, 0), color=colors[e], label=f"{e} ({len(rs)} seeds)")
                ax.fill_between(x, np.nanpercentile(m, 10, 0), np.nanpercentile(m, 90, 0), color=colors[e], alpha=0.15)
            ax.set_yscale("log")
            ax.set(title=f"{s}: {a} grad norm per step (band 10-90 % over seeds)", xlabel="step",
                   ylabel="pre-clip grad norm")
            ax.legend(fontsize=8)
            every = [r for e in estimators for r in arms.get(e, {}).values() if a in r["agents"]]
            if every:
                f = curve(every, a, 1)
                x = np.arange(1, f.shape[1] + 1)
                ax_f.plot(x, np.nanmean(f, 0), color=palette[(len(estimators) + j) % len(palette)], label=a)
        ax_f.axhline(1.0, color="grey", linewidth=1)
        ax_f.set(title=f"{s}: factor F per step (mean over runs)", xlabel="step",
                 ylabel="factor")
        ax_f.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)
    plt.close(fig)


# ================================================================================= CLI


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--estimators", default="drmas,grpo")
    p.add_argument("--baseline", default=None, help="default: the first estimator")
    p.add_argument("--settings", default="nonshared,penalty,shared")
    p.add_argument("--steps", type=int, default=None, help="RL steps (default: the recipe's 40)")
    p.add_argument("--spike-k", type=float, default=2.0)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", default="runs/stability")
    p.add_argument("--md", default=str(DEFAULT_MD))
    p.add_argument("--png", default=str(DEFAULT_PNG))
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--_one", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out = Path(args.out)
    if args._one:
        import torch

        torch.set_num_threads(1)
        setting, est, seed = args._one
        if est == "None":
            warm_start(out, SETTINGS[setting])
        else:
            one_run(out, setting, est, int(seed), args.steps)
        return 0
    from drmas_bench.types import UserError
    from drmas_trainer.advantages import check_group_index, estimator_names

    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    seeds = parse_seeds(args.seeds)
    bad = [e for e in estimators if e.partition("@")[0] not in estimator_names()] + [s for s in settings if s not in SETTINGS]
    for e in estimators:
        if e.partition("@")[0] in estimator_names():
            try:
                check_group_index(e.partition("@")[0], arm_overrides(e).get("algo.group_by_agent"))
            except ValueError as err:
                raise UserError(f"stability_study: arm {e!r}: {err}") from None
    if bad or not seeds or len(estimators) < 2:
        raise UserError(f"stability_study: unknown estimator/setting {bad} (settings: {', '.join(SETTINGS)}), "
                        f"or fewer than 2 estimators / no seeds")
    baseline = args.baseline or estimators[0]
    if not args.report_only:
        run_all(out, settings, estimators, seeds, args.steps, args.jobs)
    command = ("python scripts/stability_study.py --seeds " + args.seeds + " --estimators " + args.estimators
               + " --settings " + args.settings + (f" --steps {args.steps}" if args.steps else "")
               + f" --jobs {args.jobs} --out {args.out}")
    for flag, value, default in (("--md", args.md, DEFAULT_MD), ("--png", args.png, DEFAULT_PNG)):
        if Path(value).resolve() != default:
            command += f" {flag} {os.path.relpath(Path(value).resolve(), ROOT)}"
    report(out, settings, estimators, baseline, seeds, args.spike_k, Path(args.md), Path(args.png), command, args.steps)
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
