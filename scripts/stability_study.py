#!/usr/bin/env python
"""Gradient-norm stability of Dr. MAS vs GRPO on the tiny recipe, with statistics (issue 17).

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


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("nonshared", {}, "the tiny recipe: one model per agent"),
    Setting("penalty", {"algo.c_inv": 0.5},
            "non-shared, format penalty c_inv 0.5 (recipe 0.1): meant to move the checker's reward mean away from "
            "the pooled mean through its unparsable verdicts (10-25 % of its calls) and so push its factor away "
            "from 1; the factor column shows how far it got"),
    Setting("shared", {"shared": True}, "one model (one worker group) for both agents"),
)}

DONE = "study.json"


# ================================================================================= running


def run_dir(out: Path, setting: str, estimator: str, seed: int) -> Path:
    return out / setting / f"{estimator}-s{seed}"


def _config(setting: Setting, estimator: str, seed: int, steps: int | None):
    from drmas_trainer.config import load_config

    ov = dict(setting.overrides)
    ov.update({"algo.estimator": estimator, "seed": seed})
    if steps is not None:
        ov["steps"] = steps
    return load_config("tiny", overrides=ov)


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
    t0 = time.perf_counter()
    summary = train(_config(setting, estimator, seed, steps), d, resume=True, use_ray=False, progress=False)
    train_s = time.perf_counter() - t0
    ev = evaluate(EvalConfig(model=str(ckpt / "latest"), suite="toy", n=16, out=str(d / "eval"), progress=False, seed=0))
    micro = ev.data["micro"]
    rec = {"setting": setting_name, "estimator": estimator, "seed": seed, "train_s": train_s,
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
                           "last10": statistics.fmean(r[N.SCORE] for r in recs[-10:]), "agents": {}}
    for a, s in spread.items():
        g = [r.get(N.agent(a, N.GRAD_NORM)) for r in recs]
        f = [r.get(N.agent(a, N.MOMENT_FACTOR)) for r in recs]
        finite_f = [x for x in f if isinstance(x, (int, float)) and math.isfinite(x)]
        m2 = [r[N.agent(a, N.ADV_MEAN)] ** 2 + r[N.agent(a, N.ADV_STD)] ** 2 for r in recs
              if all(isinstance(r.get(N.agent(a, q)), (int, float)) and math.isfinite(r[N.agent(a, q)])
                     for q in (N.ADV_MEAN, N.ADV_STD))]
        out["agents"][a] = {"spread": s["spread"], "max": s["max"], "median": s["median"],
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
)


def _fmt(x: float, nd: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}f}"


def report(out: Path, settings: list[str], estimators: list[str], baseline: str, seeds: list[int], spike_k: float,
           md: Path, png: Path, command: str, steps: int | None) -> None:
    data: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for s in settings:
        for e in estimators:
            for k in seeds:
                d = run_dir(out, s, e, k)
                if (d / DONE).is_file():
                    data.setdefault(s, {}).setdefault(e, {})[k] = run_metrics(d, spike_k)
    lines = [
        "# Gradient-norm stability: Dr. MAS vs GRPO on the tiny recipe (issue 17)",
        "",
        "Generated by `scripts/stability_study.py` (every number below is computed by it). Rerun / complete:",
        "",
        "```",
        command,
        "```",
        "",
        "The command is resumable: finished runs are kept, missing ones are trained, the page and PNG are rewritten.",
        "",
        "**Setup.** `tiny` recipe (toy a+b workflow, solver + checker, two copies of the 1.6M-param tiny-random "
        f"model, CPU): {steps or 40} RL steps (recipe: 40) of 8 prompts x 8 rollouts, lr 3e-4, 2 mini-batches. Every run of a setting "
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
        agents = sorted({a for e in arms.values() for r in e.values() for a in r["agents"]})
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
    lines += ["## Which claims hold here", ""] + (claims or ["- no complete pairs yet"]) + [""]
    lines += _closing()
    png_rel = os.path.relpath(png, md.parent)
    lines += ["", f"![stability]({png_rel})", ""]
    md.parent.mkdir(parents=True, exist_ok=True)
    plot(data, settings, estimators, png, spike_k)
    md.write_text("\n".join(lines))
    print(f"[study] wrote {md} and {png}")


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


def _closing() -> list[str]:
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
                ax_s.scatter(xs, ys, marker=markers[j % 4], label=f"{a}: {e} vs {base}",
                             color=palette[(len(estimators) + j) % len(palette)])
        lim = ax_s.get_xlim()[1] if agents else 1
        top = max(lim, ax_s.get_ylim()[1])
        ax_s.plot([1, top], [1, top], color="grey", linewidth=1)
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
    p.add_argument("--md", default=str(ROOT / "docs/results/stability.md"))
    p.add_argument("--png", default=str(ROOT / "docs/results/stability.png"))
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
    from drmas_trainer.advantages import estimator_names

    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    seeds = parse_seeds(args.seeds)
    bad = [e for e in estimators if e not in estimator_names()] + [s for s in settings if s not in SETTINGS]
    if bad or not seeds or len(estimators) < 2:
        raise UserError(f"stability_study: unknown estimator/setting {bad} (settings: {', '.join(SETTINGS)}), "
                        f"or fewer than 2 estimators / no seeds")
    baseline = args.baseline or estimators[0]
    if not args.report_only:
        run_all(out, settings, estimators, seeds, args.steps, args.jobs)
    command = ("python scripts/stability_study.py --seeds " + args.seeds + " --estimators " + args.estimators
               + " --settings " + args.settings + (f" --steps {args.steps}" if args.steps else "")
               + f" --jobs {args.jobs} --out {args.out}")
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
