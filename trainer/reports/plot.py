"""Training curves to PNG: reward, per-agent gradient norm and per-agent second-moment factor over steps.

    path, spread = plot_runs(["runs/tiny-grpo", "runs/tiny-drmas"], "grad_norms.png")

Left panel: ``critic/score/mean`` (mean trajectory reward) per step (thin) and its 5-step moving average (thick), one colour per
run, and with validation during training the held-out ``val/avg@n`` at each validated step (dashed,
dots; step 0 = before RL). Middle panel: ``agent/<agent>/actor/grad_norm`` (the pre-clip norm of the gradient of the agent's own loss,
see worker.py) on a log scale, one colour per run and one line style per agent. Right panel (when the
runs logged it): ``agent/<agent>/critic/moment_factor/mean``, the factor
``(sigma_k^2 + (mu_k - mu)^2) / sigma^2`` by which global statistics would scale the agent's gradient
second moment (trainer/moment_factor.py; 1 = no difference from Dr. MAS). ``spread`` is
``{run: {agent: {"max", "median", "spread" = max / median, "factor" = mean factor over the steps}}}``
(``factor`` only when logged).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from drmas_bench.types import UserError
from drmas_trainer import metric_names

_STYLES = ("-", "--", ":", "-.")


def moving_average(xs: list[float], w: int = 5) -> list[float]:
    """Each value's mean with the ``w - 1`` before it, non-finite ones left out (NaN where none is finite)."""
    out = []
    for i in range(len(xs)):
        win = [x for x in xs[max(0, i - w + 1): i + 1] if math.isfinite(x)]
        out.append(sum(win) / len(win) if win else float("nan"))
    return out


def validation_points(records: list[dict[str, Any]]) -> tuple[str, list[tuple[int, float]]] | None:
    """The validations of a step log as (step, micro avg@n) points, with the name plotted (``val/avg@n``,
    n the largest logged); None when the run has none."""
    keys = sorted({k for r in records for k in r if k.startswith("val/avg@")}, key=lambda k: int(k.split("@")[1]))
    if not keys:
        return None
    key = keys[-1]
    return key, [(int(r["step"]), float(r[key])) for r in records
                 if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]


def plot_runs(runs: list[str | os.PathLike], out: str | os.PathLike, title: str | None = None) -> tuple[Path, dict[str, Any]]:
    """Draw the runs' reward and per-agent grad-norm curves into ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from drmas_trainer.runlog import grad_norm_spread, read_metrics

    fig, (ax_r, ax_g, ax_f) = plt.subplots(1, 3, figsize=(19, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    spread: dict[str, Any] = {}
    for i, run in enumerate(runs):
        recs = [r for r in read_metrics(run) if metric_names.SCORE in r]
        if not recs:
            raise UserError(f"{run}: no step records to plot")
        label = Path(run).name if Path(run).is_dir() else Path(run).parent.name
        color = colors[i % len(colors)]
        steps = [r["step"] for r in recs]
        reward = [float(r[metric_names.SCORE]) if isinstance(r[metric_names.SCORE], (int, float)) else float("nan")
                  for r in recs]  # null (a non-finite value) in metrics.jsonl: a gap
        ax_r.plot(steps, reward, color=color, alpha=0.3, linewidth=1)
        ax_r.plot(steps, moving_average(reward), color=color, linewidth=2, label=f"{label} (5-step mean)")
        val = validation_points(read_metrics(run))  # held-out accuracy (drmas_trainer.validation), step 0 included
        if val:
            key, pts = val
            ax_r.plot([p[0] for p in pts], [p[1] for p in pts], color=color, linestyle="--", marker="o",
                      label=f"{label}: validation {key.removeprefix('val/')}")
        agents = metric_names.agents_with({k for r in recs for k in r}, metric_names.GRAD_NORM)
        for j, agent in enumerate(agents):
            key = metric_names.agent(agent, metric_names.GRAD_NORM)
            pts = [(r["step"], r[key]) for r in recs
                   if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) and r[key] > 0]
            if pts:
                ax_g.plot([p[0] for p in pts], [p[1] for p in pts], color=color, linestyle=_STYLES[j % len(_STYLES)],
                          linewidth=1.5, label=f"{label}: {agent}")
        spread[label] = grad_norm_spread(recs)
        for j, agent in enumerate(metric_names.agents_with({k for r in recs for k in r}, metric_names.MOMENT_FACTOR)):
            key = metric_names.agent(agent, metric_names.MOMENT_FACTOR)
            pts = [(r["step"], r[key]) for r in recs if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            if pts:
                ax_f.plot([p[0] for p in pts], [p[1] for p in pts], color=color, linestyle=_STYLES[j % len(_STYLES)],
                          linewidth=1.5, label=f"{label}: {agent}")
                spread[label].setdefault(agent, {})["factor"] = sum(p[1] for p in pts) / len(pts)
    _label_axes(ax_r, ax_g, ax_f)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out, spread


def _label_axes(ax_r: Any, ax_g: Any, ax_f: Any) -> None:
    """Titles, axis labels, scales and legends of the reward, grad-norm and moment-factor panels."""
    ax_r.set_xlabel("training step")
    ax_r.set_ylabel("mean trajectory reward")
    ax_r.set_title("reward")
    ax_r.grid(True, alpha=0.3)
    ax_r.legend(fontsize=8)
    ax_g.set_xlabel("training step")
    ax_g.set_ylabel("gradient norm (pre-clip, per agent)")
    ax_g.set_yscale("log")
    ax_g.set_title("per-agent gradient norm")
    ax_g.grid(True, which="both", alpha=0.3)
    if ax_g.get_legend_handles_labels()[0]:
        ax_g.legend(fontsize=8)
    ax_f.axhline(1.0, color="grey", linewidth=1)
    ax_f.set_xlabel("training step")
    ax_f.set_ylabel("(sigma_k^2 + (mu_k - mu)^2) / sigma^2")
    ax_f.set_title("per-agent second-moment factor (1 = Dr. MAS)")
    ax_f.grid(True, alpha=0.3)
    if ax_f.get_legend_handles_labels()[0]:
        ax_f.legend(fontsize=8)
    else:
        ax_f.text(0.5, 0.5, "not logged by these runs", transform=ax_f.transAxes, ha="center", va="center")
