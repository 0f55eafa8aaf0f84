"""Cost studies (`cost_study`): accuracy, latency, tokens and dollars per team, recomputed from each
turn's recorded tokens with a price sheet (`pricing.turn_cost`) and the turn's worker-group model;
per-agent breakdowns that add up exactly (dollars are summed as exact fractions of the per-call
floats); the CSV (`cost_csv`) and a Pareto plot (`plot_pareto`). Markdown: `report.markdown`.
Team files for "which agent gets the big model?" are written by `drmas_bench.agents.assign`.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from drmas_bench.metrics import avg_values, pass_values, questions
from drmas_bench.pricing import call_cost
from drmas_bench.records import CallView, TurnView
from drmas_bench.report.runs import Run, differences
from drmas_bench.types import UserError


@dataclass
class AgentCost:
    """One agent's calls in a run: tokens (exact ints) and dollars (an exact sum of per-call floats)."""

    agent: str
    price_keys: list[str]
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: Fraction = Fraction(0)  # the calls with known usage
    latency_s: float = 0.0
    unknown_calls: int = 0  # calls without usage (metrics.usage_known): their tokens and dollars are unknown

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def known(self) -> bool:
        return self.unknown_calls == 0


@dataclass
class TeamCost:
    """Accuracy, latency, tokens and dollars of one run ("per question" = per trajectory: one answer)."""

    label: str
    run: Run
    questions: int
    trajectories: int
    avg: float  # micro avg@n
    pass_n: float  # micro pass@n (any success among each question's samples, metrics.pass_at_n)
    latency_p50: float  # of trajectory wall_s
    latency_p95: float
    call_latency_mean: float  # mean over trajectories of the summed per-call latency_s
    agents: dict[str, AgentCost]
    prompt_tokens: int
    completion_tokens: int
    usd: Fraction  # every call's cost, summed exactly

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def unknown_calls(self) -> int:
        return sum(a.unknown_calls for a in self.agents.values())

    @property
    def usd_per_1k(self) -> float | None:
        """Dollars per 1,000 questions answered (one trajectory each); None when some call's usage is
        unknown (a partial sum would read as a real, lower price)."""
        return None if self.unknown_calls else float(self.usd * 1000 / self.trajectories)

    def agent_usd_per_1k(self, agent: str) -> float | None:
        a = self.agents[agent]
        return float(a.usd * 1000 / self.trajectories) if a.known else None


def run_turn_cost(run: Run, turn: Any, prices: Any, as_alone: bool = False) -> float | None:
    """One call's dollars (`pricing.call_cost`) of a recorded turn (`records.TurnView` or a stored
    dict), priced as the run's worker group's model (`Run.price_key`); None when the call's usage is
    unknown. ``as_alone``: a call the call cache served costs what it cost when it was made
    (`alone_cost`), not the $0 this run paid."""
    t = TurnView.of(turn)
    key = run.price_key(t.wg or "")
    return alone_cost(t, prices, key) if as_alone else call_cost(t.call, prices, key)


def cache_hit(turn: Any) -> bool:
    """Whether a recorded call was served by the call cache (``completion.cache_hit``)."""
    return TurnView.of(turn).call.cache_hit


def alone_latency(turn: Any) -> float:
    """A call's latency as if its run had made it: a cached call's original latency
    (``completion.cached_latency_s``), else its own ``latency_s``."""
    c = TurnView.of(turn).call
    if c.cache_hit and c.cached_latency_s is not None:
        return c.cached_latency_s
    return c.latency_s


def alone_cost(turn: Any, prices: Any, key: str) -> float | None:
    """A call's dollars as if its run had made it: the price sheet on its tokens and its original
    latency (what a GPU-hour price multiplies), whether or not the cache served it; None when its
    usage is unknown."""
    c: CallView = TurnView.of(turn).call
    return call_cost(replace(c, cache_hit=False, latency_s=alone_latency(turn)), prices, key)


def team_cost(run: Run, prices: Any, label: str | None = None, as_alone: bool = False) -> TeamCost:
    """The cost-study numbers of one run, recomputed from its recorded turns with `prices`;
    ``as_alone`` (a sweep's runs): calls the call cache served count their original latency and
    dollars (`alone_latency`, `alone_cost`)."""
    qs = questions(run.views)
    agents: dict[str, AgentCost] = {a: AgentCost(a, []) for a in run.agents}
    total = Fraction(0)
    prompt = completion = 0
    call_lat = []
    for r in run.views:
        lat = 0.0
        for t in r.turns:
            name = t.agent
            ac = agents.setdefault(name, AgentCost(name, []))
            key = run.price_key(t.wg or "")
            if key not in ac.price_keys:
                ac.price_keys.append(key)
            c = t.call
            cost = run_turn_cost(run, t, prices, as_alone)
            latency = alone_latency(t) if as_alone else c.latency_s
            ac.calls += 1
            ac.latency_s += latency
            lat += latency
            if cost is None:  # no usage: neither its tokens nor its dollars are known
                ac.unknown_calls += 1
                continue
            usd = Fraction(cost)
            ac.prompt_tokens += c.prompt_tokens
            ac.completion_tokens += c.completion_tokens
            ac.usd += usd
            prompt += c.prompt_tokens
            completion += c.completion_tokens
            total += usd
        call_lat.append(lat)
    for a, ac in agents.items():  # an agent that never acted still names its model
        if not ac.price_keys and (wg := run.agent_wg(a)):
            ac.price_keys.append(run.price_key(wg))
    walls = np.array([r.wall_s for r in run.views])
    return TeamCost(
        label=label or run.name, run=run, questions=len(qs), trajectories=len(run.records),
        avg=float(avg_values(list(qs.values())).mean()),
        pass_n=float(pass_values(list(qs.values())).mean()),
        latency_p50=float(np.percentile(walls, 50)), latency_p95=float(np.percentile(walls, 95)),
        call_latency_mean=float(np.mean(call_lat)), agents=agents,
        prompt_tokens=prompt, completion_tokens=completion, usd=total,
    )


def cost_study(runs: Sequence[Run], prices: Any, labels: Sequence[str] | None = None,
               as_alone: bool = False) -> list[TeamCost]:
    """`team_cost` for each run (labels default to the run names)."""
    labels = list(labels) if labels else [r.name for r in runs]
    if len(labels) != len(runs):
        raise UserError(f"--labels: {len(labels)} labels for {len(runs)} runs")
    return [team_cost(r, prices, lab, as_alone) for r, lab in zip(runs, labels)]


def cost_notes(costs: Sequence[TeamCost]) -> list[str]:
    """Flags on what makes the teams' numbers not directly comparable with the first team's
    (`report.runs.differences`: benchmarks, question ids, grader, prompts, protocol, n, sampling)."""
    base = costs[0]
    return [f"{c.label}: {d}" for c in costs[1:] for d in differences(c.run, base.run, base.label)]


def cost_csv(costs: Sequence[TeamCost]) -> str:
    """One line per (team, agent) plus a `total` line per team; raw numbers."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["team", "run", "agent", "priced_as", "questions", "n", "trajectories", "avg_at_n", "pass_at_n",
                "latency_p50_s", "latency_p95_s", "call_latency_mean_s", "calls", "prompt_tokens",
                "completion_tokens", "usd", "usd_per_1k_questions", "usage_unknown_calls"])
    unknown = lambda x, known: repr(float(x)) if known and x is not None else "unknown"  # noqa: E731
    for c in costs:
        common = [c.label, str(c.run.path)]
        for a, ac in c.agents.items():
            w.writerow(common + [a, "|".join(ac.price_keys), c.questions, c.run.n, c.trajectories, "", "", "", "", "",
                                 ac.calls, ac.prompt_tokens, ac.completion_tokens, unknown(ac.usd, ac.known),
                                 unknown(c.agent_usd_per_1k(a), ac.known), ac.unknown_calls])
        w.writerow(common + ["total", "", c.questions, c.run.n, c.trajectories, repr(c.avg), repr(c.pass_n),
                             repr(c.latency_p50), repr(c.latency_p95), repr(c.call_latency_mean),
                             sum(x.calls for x in c.agents.values()), c.prompt_tokens, c.completion_tokens,
                             unknown(c.usd, not c.unknown_calls), unknown(c.usd_per_1k, not c.unknown_calls),
                             c.unknown_calls])
    return buf.getvalue()


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (cost, accuracy) that no other point dominates (cost <= and accuracy >=,
    one strictly), sorted by cost. Lower cost and higher accuracy are better."""
    front = []
    for i, (ci, ai) in enumerate(points):
        dominated = any((cj <= ci and aj >= ai) and (cj < ci or aj > ai) for j, (cj, aj) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))


class ParetoPoint(Protocol):
    """What `plot_pareto` reads of a team (a `TeamCost`, or a sweep's own point)."""

    label: str
    avg: float

    @property
    def usd_per_1k(self) -> float | None: ...

    @property
    def latency_p50(self) -> float: ...


def plot_pareto(costs: Sequence[ParetoPoint], path: str | Path, title: str = "", prices_source: str = "price sheet",
                latency_label: str = "latency per question: p50 trajectory wall time (s)") -> Path:
    """Accuracy vs $ per 1k questions and vs p50 latency, one marker per team, the Pareto front marked.
    Reads of each team only ``label``, ``avg``, ``usd_per_1k`` and ``latency_p50`` (a sweep passes
    its own points, with ``latency_label`` saying what its latency is)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5 + 0.25 * len(costs)))
    markers = "osD^vP*Xh<>p"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    panels = [  # an unknown cost (calls without usage) is left out of the cost panel, not drawn at $0
        ([float("nan") if c.usd_per_1k is None else c.usd_per_1k for c in costs],
         f"cost: $ per 1,000 questions (USD, {prices_source})"),
        ([c.latency_p50 for c in costs], latency_label),
    ]
    acc = [100 * c.avg for c in costs]
    for ax, (xs, xlabel) in zip(axes, panels):
        for i, c in enumerate(costs):
            ax.scatter(xs[i], acc[i], marker=markers[i % len(markers)], color=colors[i % len(colors)], s=90,
                       zorder=3, label=f"{i + 1}: {c.label}")
        spots: dict[tuple[float, float], list[int]] = {}
        for i in range(len(costs)):  # one label per spot: coinciding teams read "2,3"
            spots.setdefault((round(xs[i], 9), round(acc[i], 9)), []).append(i + 1)
        for (x, y), ids in spots.items():
            ax.annotate(",".join(map(str, ids)), (x, y), textcoords="offset points", xytext=(7, 7), fontsize=10,
                        fontweight="bold")
        shown = [i for i in range(len(costs)) if xs[i] == xs[i]]
        front = [shown[j] for j in pareto_front([(xs[i], acc[i]) for i in shown])]
        fx, fy = [xs[i] for i in front], [acc[i] for i in front]
        ax.step(fx, fy, where="post", color="black", linestyle="--", linewidth=1.2, zorder=2,
                label="Pareto front (cheaper/faster and more accurate)")
        ax.scatter(fx, fy, s=260, facecolors="none", edgecolors="black", linewidths=1.3, zorder=4)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy: avg@n over all questions (%)")
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.15, y=0.15)
        xs = [x for x in xs if x == x] or [0.0]
        lo, hi = min(acc), max(acc)
        if hi - lo < 1:
            ax.set_ylim(lo - 5, hi + 5)
        y0, y1 = ax.get_ylim()
        ax.set_ylim(max(y0, -3.0), min(y1, 103.0))  # accuracy lives in [0, 100]
        if max(xs) == min(xs):
            ax.set_xlim(min(xs) - 1, max(xs) + 1)
    handles, labels = axes[0].get_legend_handles_labels()
    ncol = 1 if max(len(x) for x in labels) > 45 else 2
    rows = math.ceil(len(labels) / ncol)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=9, frameon=True)
    fig.suptitle(title or "Cost study: accuracy vs cost and latency (up and left is better)")
    fig.tight_layout(rect=(0, min(0.45, 0.04 + 0.04 * rows), 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
