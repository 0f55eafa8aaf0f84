"""Per-step advantage metrics with the reference's names and definitions (its versions 755152e and
40f50a1 of ``compute_advantage``): group-std tracking ``adv_std/*``, normalised-advantage tails
``adv_norm/*`` and the Lemma 4.2 diagnostics ``adv_diag/*``. Pure tensor functions on one step's
rows (float64 on the CPU, no Python loop over rows or groups; one over agents).

Inputs everywhere: ``scores`` [N] row scores, ``uid`` [N] prompt group, ``traj`` [N] trajectory
(the pair (uid, traj) names a trajectory), ``agent`` [N] agent index into ``names`` (the labels
that go into the metric names). A *pool* with a single value gets mean 0 and std 1 (the estimator's
rule, kept by these statistics).

``adv_std/<b>/{mean,min,p5,median,max,num_groups,group_size_mean,frac_below_0.001,0.01,0.1}``
    the std of every pool the advantages divide by (before ``eps``), summarised per bucket ``b``.
    With the group index (uid, agent) the pools are each agent's rows in a prompt group and ``b`` is
    the agent; with the uid index they are the trajectory means of a prompt group and ``b`` is ``all``.
``adv_norm/<a>/{abs_max,abs_p99,abs_mean}``
    |advantage| per agent (``all`` in one bucket where 755152e reports it so: the uid index).
``adv_diag/<agent>/{mean_gap_*,var_ratio_*,inflation_factor_*}``
    for every (uid, agent) pool (its rows: mu_k, sigma_k) against the uid's pool of trajectory means
    (mu, sigma), computed whatever the run's estimator::

        mean_gap  = mu_k - mu
        var_ratio = sigma_k^2 / (sigma^2 + 1e-12)
        inflation = (sigma_k^2 + mean_gap^2) / (sigma^2 + 1e-12)

    summarised per agent: mean_gap {mean, abs_mean, abs_max}, var_ratio {mean, min, max},
    inflation_factor {mean, p95, max}. ``critic/moment_factor/mean`` (moment_factor.py) is another
    quantity; docs/advantages.md says how they differ.

Percentiles interpolate linearly (numpy's default). New families register with ``@adv_metric``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from drmas_bench.registry import Registry
from drmas_trainer.advantages import advantages64
from drmas_trainer.segments import dense_ids, segment_moments, take

__all__ = ["ADV_METRICS", "METRIC_VERSIONS", "Pools", "abs_adv_stats", "adv_metric", "group_std_stats",
           "lemma_diagnostics", "pools_by_agent", "reference_adv_metrics", "uid_agent_pools", "uid_traj_pools"]

STD_THRESHOLDS = (1e-3, 1e-2, 1e-1)
DIAG_DENOM_EPS = 1e-12


@dataclass(frozen=True)
class Pools:
    """Statistics of G pools. mean, std: [G] float64 (0 / 1 for a one-value pool); size: [G]
    int64; agent: [G] the agent index of each pool (-1: pools mix agents); uid: [G] dense uid."""

    mean: Tensor
    std: Tensor
    size: Tensor
    agent: Tensor
    uid: Tensor


def _lone_rule(mean: Tensor, std: Tensor, size: Tensor) -> tuple[Tensor, Tensor]:
    lone = size == 1
    return torch.where(lone, 0.0, mean), torch.where(lone, 1.0, std)


def _of_group(values: Tensor, seg: Tensor, n_seg: int) -> Tensor:
    """[S] the value each segment's members share (e.g. the segment's uid), from [N] values."""
    return torch.zeros(n_seg, dtype=values.dtype).index_copy_(0, seg, values)


def uid_agent_pools(scores: Tensor, uid: Tensor, agent: Tensor) -> Pools:
    """One pool per (uid, agent): that agent's row scores in the prompt group ([N] inputs)."""
    u, _ = dense_ids(uid)
    a, n_a = dense_ids(agent)
    seg, n_seg = dense_ids(u * n_a + a)
    mean, std, size = segment_moments(scores, seg, n_seg)
    mean, std = _lone_rule(mean, std, size)
    return Pools(mean, std, size, _of_group(agent, seg, n_seg), _of_group(u, seg, n_seg))


def uid_traj_pools(scores: Tensor, uid: Tensor, traj: Tensor) -> Pools:
    """One pool per uid: the mean score of each of its trajectories ((uid, traj) pairs; [N] inputs)."""
    u, _ = dense_ids(uid)
    t, n_t = dense_ids(traj)
    cell, n_cell = dense_ids(u * n_t + t)
    cell_mean, _, _ = segment_moments(scores, cell, n_cell)
    cell_uid = _of_group(u, cell, n_cell)
    g, n_g = dense_ids(cell_uid)
    mean, std, size = segment_moments(cell_mean, g, n_g)
    mean, std = _lone_rule(mean, std, size)
    return Pools(mean, std, size, torch.full((n_g,), -1, dtype=torch.int64), _of_group(cell_uid, g, n_g))


def _q(x: Tensor, q: float) -> float:
    return float(torch.quantile(x, q, interpolation="linear"))


def _buckets(label: Tensor, names: Sequence[str]) -> list[tuple[str, Tensor]]:
    """(bucket name, bool mask) per bucket in order of first appearance; label -1 = ``all``."""
    order = dict.fromkeys(label.tolist())
    return [("all" if k < 0 else names[k], label == k) for k in order]


def group_std_stats(pools: Pools, names: Sequence[str], prefix: str = "adv_std") -> dict[str, float]:
    """``adv_std/<b>/*`` of the pools (b: each pool's agent, or ``all``)."""
    out: dict[str, float] = {}
    for b, sel in _buckets(pools.agent, names):
        s, n = pools.std[sel], pools.size[sel].to(torch.float64)
        out |= {f"{prefix}/{b}/mean": float(s.mean()), f"{prefix}/{b}/min": float(s.min()),
                f"{prefix}/{b}/p5": _q(s, 0.05), f"{prefix}/{b}/median": _q(s, 0.5), f"{prefix}/{b}/max": float(s.max()),
                f"{prefix}/{b}/num_groups": float(s.numel()), f"{prefix}/{b}/group_size_mean": float(n.mean())}
        for th in STD_THRESHOLDS:
            out[f"{prefix}/{b}/frac_below_{th:g}"] = float((s < th).to(torch.float64).mean())
    return out


def abs_adv_stats(adv: Tensor, label: Tensor, names: Sequence[str], prefix: str = "adv_norm") -> dict[str, float]:
    """``adv_norm/<a>/{abs_max,abs_p99,abs_mean}`` of advantages ``adv`` [N] per ``label`` [N] (-1: ``all``)."""
    out: dict[str, float] = {}
    x = adv.detach().to("cpu", torch.float64).abs()
    for b, sel in _buckets(label, names):
        v = x[sel]
        out |= {f"{prefix}/{b}/abs_max": float(v.max()), f"{prefix}/{b}/abs_p99": _q(v, 0.99),
                f"{prefix}/{b}/abs_mean": float(v.mean())}
    return out


def lemma_diagnostics(scores: Tensor, uid: Tensor, traj: Tensor, agent: Tensor, names: Sequence[str],
                      prefix: str = "adv_diag") -> dict[str, float]:
    """``adv_diag/<agent>/*``: each (uid, agent) pool against its uid's pool of trajectory means.

    Shapes: scores, uid, traj, agent [N]; names[k] labels agent index k. Returns a flat dict.
    """
    x = scores.detach().to("cpu", torch.float64)
    ids = [t.detach().to("cpu", torch.int64) for t in (uid, traj, agent)]
    per_agent = uid_agent_pools(x, ids[0], ids[2])
    glob = uid_traj_pools(x, ids[0], ids[1])
    # glob.uid is 0..G-1 in order (dense ids are sorted), so the uid's global pool is glob[uid]
    mu, sigma = take(glob.mean, per_agent.uid), take(glob.std, per_agent.uid)
    gap = per_agent.mean - mu
    denom = sigma.square() + DIAG_DENOM_EPS
    var_ratio = per_agent.std.square() / denom
    inflation = (per_agent.std.square() + gap.square()) / denom
    out: dict[str, float] = {}
    for b, sel in _buckets(per_agent.agent, names):
        g, vr, inf = gap[sel], var_ratio[sel], inflation[sel]
        out |= {f"{prefix}/{b}/mean_gap_mean": float(g.mean()), f"{prefix}/{b}/mean_gap_abs_mean": float(g.abs().mean()),
                f"{prefix}/{b}/mean_gap_abs_max": float(g.abs().max()), f"{prefix}/{b}/var_ratio_mean": float(vr.mean()),
                f"{prefix}/{b}/var_ratio_min": float(vr.min()), f"{prefix}/{b}/var_ratio_max": float(vr.max()),
                f"{prefix}/{b}/inflation_factor_mean": float(inf.mean()), f"{prefix}/{b}/inflation_factor_p95": _q(inf, 0.95),
                f"{prefix}/{b}/inflation_factor_max": float(inf.max())}
    return out


def pools_by_agent(estimator: str, group_by_agent: bool | None) -> bool:
    """The index of the pools a run's advantages divide by, for ``adv_std``: the reference's
    ``group_by_agent`` where the estimator takes it, else (uid, agent) for the project's estimators
    whose std runs over one agent's rows (``drmas``, ``drmas_std_only``), the uid otherwise."""
    if group_by_agent is not None:
        return group_by_agent
    return estimator in ("drmas", "drmas_std_only")


# ------------------------------------------------------------------------------------ the registry


@dataclass(frozen=True)
class StepRows:
    """One step's rows for the metric families: scores, uid, traj, agent [N] (CPU; float64 / int64),
    adv [N] the advantages trained with, names (agent labels), group_by_agent (the pools' index)."""

    scores: Tensor
    uid: Tensor
    traj: Tensor
    agent: Tensor
    adv: Tensor
    names: Sequence[str]
    group_by_agent: bool


ADV_METRICS: Registry[Callable[[StepRows], dict[str, float]]] = Registry("advantage metric family", error=ValueError)


def adv_metric(name: str) -> Callable[[Callable[[StepRows], dict[str, float]]], Callable[[StepRows], dict[str, float]]]:
    """Register a metric family ``fn(rows: StepRows) -> {name: value}`` under ``name`` (refused twice)."""
    return ADV_METRICS.register(name)


@adv_metric("adv_std")
def _adv_std(r: StepRows) -> dict[str, float]:
    pools = uid_agent_pools(r.scores, r.uid, r.agent) if r.group_by_agent else uid_traj_pools(r.scores, r.uid, r.traj)
    return group_std_stats(pools, r.names)


@adv_metric("adv_norm")
def _adv_norm(r: StepRows) -> dict[str, float]:
    return abs_adv_stats(r.adv, r.agent, r.names)


@adv_metric("adv_norm_all_by_uid")
def _adv_norm_755152e(r: StepRows) -> dict[str, float]:
    return abs_adv_stats(r.adv, r.agent if r.group_by_agent else torch.full_like(r.agent, -1), r.names)


@adv_metric("adv_diag")
def _adv_diag(r: StepRows) -> dict[str, float]:
    return lemma_diagnostics(r.scores, r.uid, r.traj, r.agent, r.names)


#: the families each reference version logs
METRIC_VERSIONS: dict[str, tuple[str, ...]] = {
    "40f50a1": ("adv_std", "adv_diag", "adv_norm"),
    "755152e": ("adv_std", "adv_norm_all_by_uid"),
    "none": (),
}


def reference_adv_metrics(scores: Tensor, uid: Tensor, traj: Tensor, agent: Tensor, names: Sequence[str], *,
                          group_by_agent: bool, version: str = "40f50a1", adv: Tensor | None = None,
                          norm_by_std: bool = True, eps: float = 1e-6) -> dict[str, float]:
    """The dict the reference's ``compute_advantage`` logs at ``version`` (see :data:`METRIC_VERSIONS`).

    Args:
        scores, uid, traj, agent: [N] one step's rows (agent: index into ``names``).
        names: agent labels for the metric names.
        group_by_agent: the pools' index: (uid, agent) when True, uid (trajectory means) when False.
        version: ``40f50a1`` (adv_std, adv_diag, per-agent adv_norm) | ``755152e`` | ``none``.
        adv: [N] the advantages trained with; None computes the reference's own (``master``
            estimator at ``group_by_agent``, ``norm_by_std``, ``eps``) in float64.

    Returns:
        ``{metric name: float}``; empty for no rows.
    """
    if version not in METRIC_VERSIONS:
        raise ValueError(f"unknown advantage-metric version {version!r}; known: {', '.join(METRIC_VERSIONS)}")
    if scores.numel() == 0 or not METRIC_VERSIONS[version]:
        return {}
    x = scores.detach().to("cpu", torch.float64)
    u, t, a = (v.detach().to("cpu", torch.int64) for v in (uid, traj, agent))
    if adv is None:
        adv = advantages64(x, u, t, a, "master", norm_by_std=norm_by_std, eps=eps, group_by_agent=group_by_agent)
    rows = StepRows(x, u, t, a, adv.detach().to("cpu", torch.float64), names, group_by_agent)
    out: dict[str, float] = {}
    for family in METRIC_VERSIONS[version]:
        out |= ADV_METRICS.get(family)(rows)
    return out
