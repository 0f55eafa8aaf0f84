"""Agent-wise advantage estimators (Dr. MAS) and their GRPO baselines, vectorised.

One *row* is one agent action (one LLM call). Every row carries a score ``x_i`` (the trajectory
reward minus a format penalty, see :func:`row_scores`), a prompt group ``u(i)``, a trajectory
``t(i)`` and a logical agent ``k(i)``. Every estimator has the same shape::

    A_i = (x_i - mean_P) / (max(std_P', std_floor) + eps)        (norm_by_std=True)
    A_i =  x_i - mean_P                                          (norm_by_std=False)

and differs only in the numerator ``x_i`` and the populations ``P`` (for the mean) and ``P'``
(for the std) that the row is compared against:

==================  ====================  ======================  ======================
estimator           numerator             mean over               std over
==================  ====================  ======================  ======================
``grpo``            trajectory value v_t  trajectory values of u  trajectory values of u
``grpo_first_row``  row score x_i         first-row scores of u   first-row scores of u
``drmas``           row score x_i         rows of (u, k)          rows of (u, k)
``drmas_mean_only`` row score x_i         rows of (u, k)          trajectory values of u
``drmas_std_only``  row score x_i         trajectory values of u  rows of (u, k)
``traj_traj``       row score x_i         trajectory values of u  trajectory values of u
``global_step``     row score x_i         rows of u (all agents)  rows of u (all agents)
==================  ====================  ======================  ======================

with ``v_t`` = mean of the scores of trajectory t's rows (all agents). Aliases (the reference's
ablation names, mean-source x std-source): ``agent_agent`` = ``drmas``, ``agent_traj`` =
``drmas_mean_only``, ``traj_agent`` = ``drmas_std_only``. "Rows of (u, k)" is action-weighted: a
trajectory in which agent k acted three times contributes three values.

Rules shared by all estimators:

* std is unbiased (divides by N-1).
* A statistic computed over a single value (a population of size 1) follows ``single_row``:
  ``"reference"`` uses mean 0 / std 1 for that statistic (so A is about the raw score, as in the
  reference), ``"zero"`` gives the row advantage 0.
* A group whose values are all equal gets std exactly 0 and, when the numerator belongs to that
  population, numerator exactly 0, hence A = 0. (Means are computed shifted by a group member, so
  "all equal" is exact, not 1e-17-ish.)
* ``std_floor`` clamps the std from below before ``eps`` is added; it guards estimators whose
  numerator is not in the std population (``grpo_first_row``, ``traj_traj``, the mixed ones) from
  advantages of size penalty / eps.
* Statistics see exactly the rows passed in: call this *before* padding a batch to a divisor (the
  reference pads first, so its duplicated rows enter the statistics; we deliberately do not).

Implementation: group ids come from a counting pass (compact ids) or
``torch.unique(return_inverse=True)`` (spread-out ids), sums from ``index_add_``, variance in two
passes, all in float64 on the CPU (deterministic across runs and thread counts, exact to ~1e-15);
the result is float32 on the input's device. No Python loop runs over rows or groups. A new
estimator is one function decorated with :func:`register_estimator`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "ESTIMATORS",
    "Moments",
    "Rows",
    "Terms",
    "advantage_stats",
    "compute_advantages",
    "estimator_names",
    "register_estimator",
    "row_scores",
]

SingleRow = Literal["reference", "zero"]

# ----------------------------------------------------------------------------------------------
# segment statistics
# ----------------------------------------------------------------------------------------------


def _take(values: Tensor, index: Tensor) -> Tensor:
    """``values[index]`` for 1-D tensors (``index_select``: several times faster than advanced indexing)."""
    return values.index_select(0, index)


def _dense_ids(ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer ids to 0..G-1 in sorted order; returns (index per row, G).

    Ids spanning a range at most 4x the row count are densified by counting (presence table +
    cumulative sum, O(N + range), no sort); others go through ``torch.unique`` (a sort). Both give
    the same answer.
    """
    n = ids.numel()
    lo, hi = int(ids.min()), int(ids.max())
    span = hi - lo + 1  # Python ints: no overflow for ids spread over all of int64
    if span <= 4 * n + 64:
        offset = ids - lo
        present = torch.zeros(span, dtype=torch.int64).index_fill_(0, offset, 1)
        rank = torch.cumsum(present, 0) - 1
        return _take(rank, offset), int(rank[-1]) + 1
    uniq, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    return inverse, int(uniq.numel())


def _segment_moments(x: Tensor, seg: Tensor, n_seg: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-segment (mean, unbiased std, count) of float64 values ``x`` with segment ids ``seg``.

    Two passes. The first pass sums ``x - shift`` where ``shift`` is the segment's maximum (a
    member of the segment), so a segment of equal values has mean exactly equal to them and std
    exactly 0. Segments of size 1 get std 0 (a placeholder: the single-value rule replaces it).
    Every segment id in ``0..n_seg-1`` must occur (as produced by :func:`_dense_ids`).
    """
    count = torch.zeros(n_seg, dtype=torch.int64).index_add_(0, seg, torch.ones_like(seg))
    n = count.to(torch.float64)
    shift = torch.full((n_seg,), -torch.inf, dtype=torch.float64)
    shift.scatter_reduce_(0, seg, x, reduce="amax", include_self=True)
    s1 = torch.zeros(n_seg, dtype=torch.float64).index_add_(0, seg, x - _take(shift, seg))
    mean = shift + s1 / n
    dev = x - _take(mean, seg)
    ss = torch.zeros(n_seg, dtype=torch.float64).index_add_(0, seg, dev * dev)
    std = torch.sqrt(ss / (n - 1.0).clamp(min=1.0))
    return mean, std, count


@dataclass(frozen=True)
class Moments:
    """One population's statistics, broadcast to rows.

    Attributes:
        mean: [N] float64, the mean of the population the row is compared against.
        std: [N] float64, its unbiased std (0 where ``n == 1``).
        n: [N] int64, the population size (the single-value rule applies where ``n == 1``).
    """

    mean: Tensor
    std: Tensor
    n: Tensor


@dataclass(frozen=True)
class Terms:
    """What an estimator returns: ``A = (x - mean_from.mean) / (std_from.std + eps)``.

    Attributes:
        x: [N] float64 numerator per row.
        mean_from: population whose mean is subtracted.
        std_from: population whose std divides (ignored when ``norm_by_std=False``).
    """

    x: Tensor
    mean_from: Moments
    std_from: Moments


class Rows:
    """A batch of rows with lazily computed groupings and populations (all on CPU, float64).

    Each population below is computed at most once per call, and only if an estimator asks.

    Attributes:
        score: [N] float64 row scores ``x_i``.
        uid, traj, agent: [N] int64 raw ids.
    """

    def __init__(self, score: Tensor, uid: Tensor, traj: Tensor, agent: Tensor) -> None:
        self.score = score
        self.uid = uid
        self.traj = traj
        self.agent = agent
        self.n_rows = int(score.numel())

    # --- groupings ---------------------------------------------------------------------------
    @cached_property
    def uid_idx(self) -> tuple[Tensor, int]:
        """Dense prompt-group index per row and the number of groups."""
        return _dense_ids(self.uid)

    @cached_property
    def traj_idx(self) -> tuple[Tensor, int]:
        """Dense trajectory index per row and the number of trajectories."""
        return _dense_ids(self.traj)

    @cached_property
    def uid_agent_idx(self) -> tuple[Tensor, int]:
        """Dense (prompt group, agent) index per row and the number of such groups."""
        u, _ = self.uid_idx
        a, n_agents = _dense_ids(self.agent)
        return _dense_ids(u * n_agents + a)

    @cached_property
    def traj_uid(self) -> Tensor:
        """[n_traj] dense uid index of each trajectory; a trajectory spanning two uids is an error."""
        t, n_traj = self.traj_idx
        u, _ = self.uid_idx
        lo = torch.full((n_traj,), torch.iinfo(torch.int64).max, dtype=torch.int64)
        hi = torch.full((n_traj,), -1, dtype=torch.int64)
        lo.scatter_reduce_(0, t, u, reduce="amin", include_self=True)
        hi.scatter_reduce_(0, t, u, reduce="amax", include_self=True)
        if not torch.equal(lo, hi):
            bad = int(torch.unique(self.traj)[(lo != hi).nonzero()[0, 0]])
            raise ValueError(f"trajectory id {bad} appears under more than one uid; trajectory ids must be globally unique")
        return lo

    # --- trajectory-level values -------------------------------------------------------------
    @cached_property
    def traj_value(self) -> Tensor:
        """[n_traj] v_t = mean score of the trajectory's rows (all agents)."""
        t, n_traj = self.traj_idx
        mean, _, _ = _segment_moments(self.score, t, n_traj)
        return mean

    @cached_property
    def traj_first_score(self) -> Tensor:
        """[n_traj] score of the trajectory's first row (lowest row index in the batch)."""
        t, n_traj = self.traj_idx
        first = torch.full((n_traj,), self.n_rows, dtype=torch.int64)
        first.scatter_reduce_(0, t, torch.arange(self.n_rows), reduce="amin", include_self=True)
        return _take(self.score, first)

    @cached_property
    def v(self) -> Tensor:
        """[N] the row's trajectory value v_t(i) (the GRPO numerator)."""
        t, _ = self.traj_idx
        return _take(self.traj_value, t)

    # --- populations, broadcast to rows -----------------------------------------------------
    def _per_traj_over_uid(self, values: Tensor) -> Moments:
        """Moments of one value per trajectory, pooled over the trajectories of each uid."""
        u, n_uid = self.uid_idx
        mean, std, n = _segment_moments(values, self.traj_uid, n_uid)
        return Moments(_take(mean, u), _take(std, u), _take(n, u))

    @cached_property
    def traj_pool(self) -> Moments:
        """Moments of the trajectory values v_t over the trajectories of the row's uid."""
        return self._per_traj_over_uid(self.traj_value)

    @cached_property
    def first_row_pool(self) -> Moments:
        """Moments of the first-row scores over the trajectories of the row's uid."""
        return self._per_traj_over_uid(self.traj_first_score)

    @cached_property
    def agent_pool(self) -> Moments:
        """Moments of every row of the row's agent in the row's uid (action-weighted)."""
        g, n_g = self.uid_agent_idx
        mean, std, n = _segment_moments(self.score, g, n_g)
        return Moments(_take(mean, g), _take(std, g), _take(n, g))

    @cached_property
    def step_pool(self) -> Moments:
        """Moments of every row of the row's uid, all agents pooled (action-weighted)."""
        u, n_uid = self.uid_idx
        mean, std, n = _segment_moments(self.score, u, n_uid)
        return Moments(_take(mean, u), _take(std, u), _take(n, u))


# ----------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------

Estimator = Callable[[Rows], Terms]
ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str, *aliases: str) -> Callable[[Estimator], Estimator]:
    """Register ``fn(rows: Rows) -> Terms`` under ``name`` and any ``aliases``.

    Example (a new estimator is just this)::

        @register_estimator("my_est")
        def my_est(r: Rows) -> Terms:
            return Terms(x=r.score, mean_from=r.step_pool, std_from=r.agent_pool)
    """

    def deco(fn: Estimator) -> Estimator:
        for key in (name, *aliases):
            if key in ESTIMATORS:
                raise ValueError(f"estimator {key!r} is already registered")
            ESTIMATORS[key] = fn
        return fn

    return deco


def estimator_names() -> list[str]:
    """All registered estimator names and aliases, sorted."""
    return sorted(ESTIMATORS)


@register_estimator("grpo")
def grpo(r: Rows) -> Terms:
    """Multi-agent GRPO (reference master): A_i = (v_t - mean_u(v)) / (std_u(v) + eps).

    v_t is the mean score of trajectory t's rows; the statistics run over the trajectories of the
    uid; every row of trajectory t gets the same advantage.
    """
    return Terms(x=r.v, mean_from=r.traj_pool, std_from=r.traj_pool)


@register_estimator("grpo_first_row")
def grpo_first_row(r: Rows) -> Terms:
    """Older reference variant: A_i = (x_i - mean_u(x_first)) / (std_u(x_first) + eps).

    Statistics over each trajectory's first row (lowest row index); numerator the row's own score.
    Known pathology: equal first rows and a penalised later row give A of about -penalty/eps.
    """
    return Terms(x=r.score, mean_from=r.first_row_pool, std_from=r.first_row_pool)


@register_estimator("drmas", "agent_agent")
def drmas(r: Rows) -> Terms:
    """Dr. MAS agent-wise: A_i = (x_i - mean_{u,k}) / (std_{u,k} + eps), over every row of agent k in u."""
    return Terms(x=r.score, mean_from=r.agent_pool, std_from=r.agent_pool)


@register_estimator("drmas_mean_only", "agent_traj")
def drmas_mean_only(r: Rows) -> Terms:
    """Agent-wise mean, trajectory std: A_i = (x_i - mean_{u,k}) / (std_u(v) + eps)."""
    return Terms(x=r.score, mean_from=r.agent_pool, std_from=r.traj_pool)


@register_estimator("drmas_std_only", "traj_agent")
def drmas_std_only(r: Rows) -> Terms:
    """Trajectory mean, agent-wise std: A_i = (x_i - mean_u(v)) / (std_{u,k} + eps)."""
    return Terms(x=r.score, mean_from=r.traj_pool, std_from=r.agent_pool)


@register_estimator("traj_traj")
def traj_traj(r: Rows) -> Terms:
    """Trajectory statistics, row numerator: A_i = (x_i - mean_u(v)) / (std_u(v) + eps)."""
    return Terms(x=r.score, mean_from=r.traj_pool, std_from=r.traj_pool)


@register_estimator("global_step")
def global_step(r: Rows) -> Terms:
    """Global step-level: A_i = (x_i - mean_u) / (std_u + eps), over every row of u (all agents)."""
    return Terms(x=r.score, mean_from=r.step_pool, std_from=r.step_pool)


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------


def _check_inputs(scores: Tensor, uid: Tensor, traj: Tensor, agent: Tensor) -> None:
    for name, t in (("scores", scores), ("uid", uid), ("traj", traj), ("agent", agent)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D (one entry per row), got shape {tuple(t.shape)}")
        if t.numel() != scores.numel():
            raise ValueError(f"{name} has {t.numel()} rows but scores has {scores.numel()}")
        if name != "scores" and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
            raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating tensor, got {scores.dtype}")


def compute_advantages(
    scores: Tensor,
    uid: Tensor,
    traj: Tensor,
    agent: Tensor,
    estimator: str = "drmas",
    norm_by_std: bool = True,
    eps: float = 1e-6,
    single_row: SingleRow = "reference",
    std_floor: float = 0.0,
) -> Tensor:
    """One advantage per row: ``A_i = (x_i - mean_P) / (max(std_P', std_floor) + eps)``.

    Args:
        scores: [N] float row scores (trajectory reward minus format penalty; see :func:`row_scores`).
        uid: [N] integer prompt-group id (the n rollouts of one question share it).
        traj: [N] integer trajectory id, unique across the whole batch (not only within a uid).
        agent: [N] integer logical agent id.
        estimator: which populations give the numerator, mean and std (see the module table):
            ``"drmas"`` (= ``"agent_agent"``), agent-wise, the Dr. MAS default;
            ``"grpo"``, trajectory values normalised over the uid (reference master);
            ``"grpo_first_row"``, older reference variant (first-row statistics, row numerator);
            ``"drmas_mean_only"`` (= ``"agent_traj"``), agent mean, trajectory std;
            ``"drmas_std_only"`` (= ``"traj_agent"``), trajectory mean, agent std;
            ``"traj_traj"``, trajectory mean and std, row numerator;
            ``"global_step"``, every row of the uid pooled (action-weighted).
        norm_by_std: True divides by ``std + eps``; False returns the mean-centred score only.
        eps: added to the std in the denominator (reference: 1e-6).
        single_row: rule for a statistic computed over a single value.
            ``"reference"``: that statistic is replaced by mean 0 / std 1 (A is about the raw score);
            ``"zero"``: the row's advantage is 0 (with ``norm_by_std=False`` only the mean counts).
        std_floor: lower bound applied to the std before ``eps`` is added (0 = off, the reference).

    Rows may come in any order; only ``grpo_first_row`` depends on it (its "first row" is the lowest
    row index of the trajectory). Statistics use exactly the rows given: call before padding.

    Returns:
        [N] float32 advantages on the device of ``scores``. Deterministic.

    Raises:
        ValueError: unknown estimator (the message lists the known names), bad ``single_row``,
            negative ``eps``/``std_floor``, mismatched shapes, non-finite scores, or a
            trajectory id that appears under two uids (for estimators that use trajectories).
        TypeError: a non-tensor, non-floating ``scores`` or non-integer ids.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: {', '.join(estimator_names())}")
    if single_row not in ("reference", "zero"):
        raise ValueError(f"single_row must be 'reference' or 'zero', got {single_row!r}")
    if eps < 0 or std_floor < 0:
        raise ValueError(f"eps and std_floor must be >= 0, got eps={eps}, std_floor={std_floor}")
    _check_inputs(scores, uid, traj, agent)
    device = scores.device
    if scores.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=device)
    x = scores.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError("scores contain NaN or inf")
    rows = Rows(x, *(t.detach().to("cpu", torch.int64) for t in (uid, traj, agent)))

    terms = ESTIMATORS[estimator](rows)
    m, s = terms.mean_from, terms.std_from
    lone_mean = m.n == 1
    lone_std = s.n == 1
    if single_row == "reference":
        mean = torch.where(lone_mean, 0.0, m.mean)
        std = torch.where(lone_std, 1.0, s.std)
    else:
        mean, std = m.mean, s.std

    if norm_by_std:
        adv = (terms.x - mean) / (std.clamp(min=std_floor) + eps)
        lone = lone_mean | lone_std
    else:
        adv = terms.x - mean
        lone = lone_mean
    if single_row == "zero":
        adv = torch.where(lone, 0.0, adv)
    return adv.to(device=device, dtype=torch.float32)


def row_scores(
    reward: Tensor | Mapping[int, float],
    valid: Tensor,
    c_inv: float = 0.1,
    traj: Tensor | None = None,
) -> Tensor:
    """Row score = trajectory reward R minus ``c_inv * (1 - valid)``.

    Args:
        reward: either an [N] tensor holding each row's trajectory reward, or a mapping
            ``{trajectory id: R}`` (then ``traj`` is required).
        valid: [N] bool/0-1 tensor, the row's format check passed.
        c_inv: penalty for an invalid row (reference: 0.1 math, 0.01 search).
        traj: [N] trajectory id per row; only with a mapping ``reward``.

    Returns:
        [N] float32 scores on the device of ``valid``.
    """
    if isinstance(reward, Mapping):
        if traj is None:
            raise ValueError("row_scores: a per-trajectory reward mapping needs `traj`")
        ids = traj.detach().cpu().tolist()
        missing = [t for t in set(ids) if t not in reward]
        if missing:
            raise ValueError(f"row_scores: no reward for trajectories {sorted(missing)[:5]}")
        r = torch.tensor([float(reward[t]) for t in ids], dtype=torch.float64)
    else:
        if traj is not None:
            raise ValueError("row_scores: pass `traj` only with a {trajectory id: R} mapping")
        r = reward.detach().to("cpu", torch.float64)
    v = valid.detach().to("cpu", torch.float64)
    if r.shape != v.shape:
        raise ValueError(f"row_scores: reward has shape {tuple(r.shape)}, valid {tuple(v.shape)}")
    return (r - c_inv * (1.0 - v)).to(device=valid.device, dtype=torch.float32)


def advantage_stats(adv: Tensor, agent: Tensor) -> dict[int, dict[str, float]]:
    """Per-agent summary of advantages for logging.

    Args:
        adv: [N] advantages (one per row).
        agent: [N] integer agent id per row.

    Returns:
        ``{agent id: {"mean", "std" (unbiased, 0 for a single row), "abs_max", "count"}}``.
    """
    if adv.numel() == 0:
        return {}
    a, n_ag = _dense_ids(agent.detach().cpu().to(torch.int64))
    x = adv.detach().to("cpu", torch.float64)
    mean, std, count = _segment_moments(x, a, n_ag)
    absmax = torch.zeros(n_ag, dtype=torch.float64).scatter_reduce_(0, a, x.abs(), reduce="amax")
    ids = torch.unique(agent.detach().cpu()).tolist()
    return {
        int(k): {"mean": float(mean[j]), "std": float(std[j]), "abs_max": float(absmax[j]), "count": int(count[j])}
        for j, k in enumerate(ids)
    }
