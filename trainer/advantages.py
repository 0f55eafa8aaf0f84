"""Agent-wise advantage estimators (Dr. MAS), their GRPO baselines and the reference's ablations, vectorised.

One *row* is one agent action (one LLM call). Every row carries a score ``x_i`` (the trajectory
reward minus a format penalty, see :func:`drmas_trainer.rewards.row_scores`), a prompt group
``u(i)``, a trajectory ``t(i)`` and a logical agent ``k(i)``. Every estimator has the same shape::

    A_i = (num_i - mean_P) / (max(std_P', std_floor) + eps)      (norm_by_std=True)
    A_i =  num_i - mean_P                                        (norm_by_std=False)

and differs only in the numerator ``num_i`` and the pools ``P`` (for the mean) and ``P'`` (for the
std). A pool belongs to a *group index* g (the uid, or the (uid, agent) pair) and is one of

* the **row pool** of g: every row score of g (action-weighted: an agent that acted three times in
  a trajectory contributes three values);
* the **cell pool** of g: one *cell average* per trajectory in which g has rows, a cell being the
  rows of g in one trajectory (with g = uid a cell is the whole trajectory, its average ``v_t``);
* the **first-row pool** of g: the score of each cell's first row (lowest row index).

The project's names fix their group index:

==================  ====================  ======================  ======================
estimator           numerator             mean over               std over
==================  ====================  ======================  ======================
``drmas``           row score x_i         rows of (u, k)          rows of (u, k)
``grpo``            trajectory value v_t  cells of u (v_t)        cells of u (v_t)
``grpo_first_row``  row score x_i         first rows of u         first rows of u
``global_step``     row score x_i         rows of u (all agents)  rows of u (all agents)
``drmas_mean_only`` row score x_i         rows of (u, k)          cells of u (v_t)
``drmas_std_only``  row score x_i         cells of u (v_t)        rows of (u, k)
``grpo_row_score``  row score x_i         cells of u (v_t)        cells of u (v_t)
==================  ====================  ======================  ======================

The reference's names (its ``adv_estimator`` values and versions) take the group index from
``group_by_agent`` (the reference's ``group_by_agent_id``): g = (uid, agent) when True, uid when
False. "agent" there means the row pool of g, "traj" the cell pool of g and the cell average c_i
as numerator:

=======================  ====================  ======================  ======================
estimator                numerator             mean over               std over
=======================  ====================  ======================  ======================
``agent_agent``          row score x_i         rows of g               rows of g
``traj_traj``            cell average c_i      cells of g              cells of g
``agent_traj``           row score x_i         rows of g               cells of g
``traj_agent``           cell average c_i      cells of g              rows of g
``auto``/``master``      ``agent_agent`` if group_by_agent else ``traj_traj``
``reference_2025_10``    ``drmas`` if group_by_agent else ``grpo_first_row`` (the 2025-10 version,
                         commit 3b556f2; ``3b556f2`` is its alias, the reference vectors' name)
=======================  ====================  ======================  ======================

So with group_by_agent True ``agent_agent`` = ``master`` = ``drmas``; with False ``agent_agent`` =
``global_step`` and ``traj_traj`` = ``master`` = ``grpo``. Earlier versions of this module registered
``agent_traj``, ``traj_agent`` and ``traj_traj`` with other meanings (now ``drmas_mean_only``,
``drmas_std_only``, ``grpo_row_score``): a reference name without ``group_by_agent`` is an error,
never a silent change of meaning.

Rules shared by all estimators:

* std is unbiased (divides by N-1).
* A statistic computed over a single value (a pool of size 1) follows ``single_row``:
  ``"reference"`` uses mean 0 / std 1 for that statistic (so A is about the raw score, as in the
  reference; its std 1 is a float32 constant, so the divisor is float32(1 + eps) = 1.00000095367),
  ``"zero"`` gives the row advantage 0.
* A group whose values are all equal gets std exactly 0 and, when the numerator belongs to that
  pool, numerator exactly 0, hence A = 0. (Means are computed shifted by a group member, so
  "all equal" is exact, not 1e-17-ish.)
* ``std_floor`` clamps the std from below before ``eps`` is added; it guards estimators whose
  numerator is not in the std pool (``grpo_first_row``, the mixed ones) from advantages of size
  penalty / eps.
* Statistics see exactly the rows passed in: call this *before* padding a batch to a divisor (the
  reference pads first, so its duplicated rows enter the statistics; we deliberately do not).

Implementation: group ids come from a counting pass (compact ids) or
``torch.unique(return_inverse=True)`` (spread-out ids), sums from ``index_add_``, variance in two
passes, all in float64 on the CPU (deterministic across runs and thread counts, exact to ~1e-15);
the result is float32 on the input's device. No Python loop runs over rows or groups. A new
estimator is one function decorated with :func:`register_estimator`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from drmas_bench.registry import Registry
from drmas_trainer.advantage_rows import Grouping, Moments, Rows, Terms
from drmas_trainer.segments import dense_ids as _dense_ids
from drmas_trainer.segments import segment_moments as _segment_moments

__all__ = [
    "ESTIMATORS",
    "GROUP_INDEXED",
    "Grouping",
    "Moments",
    "RENAMED",
    "Rows",
    "Terms",
    "advantage_stats",
    "advantages64",
    "check_group_index",
    "compute_advantages",
    "estimator_names",
    "needs_group_index",
    "register_estimator",
]

SingleRow = Literal["reference", "zero"]

# ----------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------

Estimator = Callable[[Rows], Terms]
ESTIMATORS: Registry[Estimator] = Registry("advantage estimator", error=ValueError)
#: names whose meaning depends on ``group_by_agent`` (the reference's names); the rest fix their index
GROUP_INDEXED: set[str] = set()
#: names that meant something else before they took the reference's meaning -> the old estimator's name
RENAMED: dict[str, str] = {"agent_traj": "drmas_mean_only", "traj_agent": "drmas_std_only",
                           "traj_traj": "grpo_row_score", "agent_agent": "drmas"}


def register_estimator(name: str, *aliases: str, group_indexed: bool = False) -> Callable[[Estimator], Estimator]:
    """Register ``fn(rows: Rows) -> Terms`` under ``name`` and any ``aliases``.

    ``group_indexed``: the estimator reads ``rows.group``, so callers must pass ``group_by_agent``
    (and may not pass it to the others).

    Example (a new estimator is just this)::

        @register_estimator("my_est")
        def my_est(r: Rows) -> Terms:
            return Terms(x=r.score, mean_from=r.by_uid.row_pool, std_from=r.by_uid_agent.row_pool)
    """

    def deco(fn: Estimator) -> Estimator:
        ESTIMATORS.register(name, fn, aliases=aliases)
        if group_indexed:
            GROUP_INDEXED.update((name, *aliases))
        return fn

    return deco


def estimator_names() -> list[str]:
    """All registered estimator names and aliases, sorted."""
    return sorted(ESTIMATORS)


def needs_group_index(name: str) -> bool:
    """Whether estimator ``name`` takes its group index from ``group_by_agent``."""
    return name in GROUP_INDEXED


# --- the project's names: fixed group index --------------------------------------------------


@register_estimator("drmas")
def drmas(r: Rows) -> Terms:
    """Dr. MAS agent-wise: A_i = (x_i - mean_{u,k}) / (std_{u,k} + eps), over every row of agent k in u."""
    g = r.by_uid_agent
    return Terms(x=r.score, mean_from=g.row_pool, std_from=g.row_pool)


@register_estimator("grpo")
def grpo(r: Rows) -> Terms:
    """Multi-agent GRPO (reference master, uid index): A_i = (v_t - mean_u(v)) / (std_u(v) + eps).

    v_t is the mean score of trajectory t's rows; the statistics run over the trajectories of the
    uid; every row of trajectory t gets the same advantage.
    """
    g = r.by_uid
    return Terms(x=g.cell_value, mean_from=g.cell_pool, std_from=g.cell_pool)


@register_estimator("grpo_first_row")
def grpo_first_row(r: Rows) -> Terms:
    """Older reference variant: A_i = (x_i - mean_u(x_first)) / (std_u(x_first) + eps).

    Statistics over each trajectory's first row (lowest row index); numerator the row's own score.
    Known pathology: equal first rows and a penalised later row give A of about -penalty/eps.
    """
    g = r.by_uid
    return Terms(x=r.score, mean_from=g.first_row_pool, std_from=g.first_row_pool)


@register_estimator("global_step")
def global_step(r: Rows) -> Terms:
    """Global step-level: A_i = (x_i - mean_u) / (std_u + eps), over every row of u (all agents)."""
    g = r.by_uid
    return Terms(x=r.score, mean_from=g.row_pool, std_from=g.row_pool)


@register_estimator("drmas_mean_only")
def drmas_mean_only(r: Rows) -> Terms:
    """Agent-wise mean, trajectory std: A_i = (x_i - mean_{u,k}) / (std_u(v) + eps).

    (This module's ``agent_traj`` until that name took the reference's meaning.)
    """
    return Terms(x=r.score, mean_from=r.by_uid_agent.row_pool, std_from=r.by_uid.cell_pool)


@register_estimator("drmas_std_only")
def drmas_std_only(r: Rows) -> Terms:
    """Trajectory mean, agent-wise std: A_i = (x_i - mean_u(v)) / (std_{u,k} + eps).

    (This module's ``traj_agent`` until that name took the reference's meaning.)
    """
    return Terms(x=r.score, mean_from=r.by_uid.cell_pool, std_from=r.by_uid_agent.row_pool)


@register_estimator("grpo_row_score")
def grpo_row_score(r: Rows) -> Terms:
    """GRPO statistics, each row's own score: A_i = (x_i - mean_u(v)) / (std_u(v) + eps).

    (This module's ``traj_traj`` until that name took the reference's meaning.)
    """
    g = r.by_uid
    return Terms(x=r.score, mean_from=g.cell_pool, std_from=g.cell_pool)


# --- the reference's names: group index from group_by_agent ----------------------------------


@register_estimator("agent_agent", group_indexed=True)
def agent_agent(r: Rows) -> Terms:
    """Reference ``agent_agent``: row score over the row pool of g (``drmas`` / ``global_step``)."""
    g = r.group
    return Terms(x=r.score, mean_from=g.row_pool, std_from=g.row_pool)


@register_estimator("traj_traj", group_indexed=True)
def traj_traj(r: Rows) -> Terms:
    """Reference ``traj_traj``: cell average over the cell pool of g (uid index: ``grpo``)."""
    g = r.group
    return Terms(x=g.cell_value, mean_from=g.cell_pool, std_from=g.cell_pool)


@register_estimator("agent_traj", group_indexed=True)
def agent_traj(r: Rows) -> Terms:
    """Reference ``agent_traj`` (the ablation branch's default): row score, row-pool mean, cell-pool std of g."""
    g = r.group
    return Terms(x=r.score, mean_from=g.row_pool, std_from=g.cell_pool)


@register_estimator("traj_agent", group_indexed=True)
def traj_agent(r: Rows) -> Terms:
    """Reference ``traj_agent``: cell average, cell-pool mean, row-pool std of g."""
    g = r.group
    return Terms(x=g.cell_value, mean_from=g.cell_pool, std_from=g.row_pool)


@register_estimator("auto", "master", group_indexed=True)
def auto(r: Rows) -> Terms:
    """Reference ``auto`` (= master's estimator): ``agent_agent`` if group_by_agent, else ``traj_traj``."""
    return agent_agent(r) if r.group_by_agent else traj_traj(r)


@register_estimator("reference_2025_10", "3b556f2", group_indexed=True)
def reference_2025_10(r: Rows) -> Terms:
    """The reference's 2025-10 estimator (its master at commit 3b556f2, the name the reference
    vectors give it, kept as an alias): ``drmas`` if group_by_agent, else ``grpo_first_row``
    (statistics over the first row of each (uid, traj) in batch order)."""
    r.group  # noqa: B018  (refuses to run without group_by_agent)
    return drmas(r) if r.group_by_agent else grpo_first_row(r)


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------


def check_group_index(estimator: str, group_by_agent: bool | None) -> None:
    """``group_by_agent`` is given exactly for the estimators that read it; else a one-line ValueError.

    A reference name without it is refused rather than defaulted: some of those names meant a
    different estimator in this project before (see :data:`RENAMED`), and the reference itself
    always runs them under an explicit ``group_by_agent_id``.
    """
    ESTIMATORS.get(estimator)  # an unknown name: one ValueError listing the known ones
    if needs_group_index(estimator) and group_by_agent is None:
        was = f"; what this project called {estimator!r} before is {RENAMED[estimator]!r}" if estimator in RENAMED else ""
        raise ValueError(f"estimator {estimator!r} is the reference's and needs group_by_agent "
                         f"(true: pools per (uid, agent), false: per uid){was}")
    if not needs_group_index(estimator) and group_by_agent is not None:
        raise ValueError(f"group_by_agent applies only to the reference's estimator names "
                         f"({', '.join(sorted(GROUP_INDEXED))}); {estimator!r} fixes its own group index")


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
    group_by_agent: bool | None = None,
) -> Tensor:
    """One advantage per row: ``A_i = (num_i - mean_P) / (max(std_P', std_floor) + eps)``.

    Args:
        scores: [N] float row scores (trajectory reward minus format penalty; see ``drmas_trainer.rewards.row_scores``).
        uid: [N] integer prompt-group id (the n rollouts of one question share it).
        traj: [N] integer trajectory id, unique across the whole batch (not only within a uid).
        agent: [N] integer logical agent id.
        estimator: which numerator and pools (see the module tables). The project's names fix
            their group index: ``"drmas"`` (agent-wise, the Dr. MAS default), ``"grpo"``
            (trajectory values over the uid, reference master's baseline), ``"grpo_first_row"``,
            ``"global_step"``, ``"drmas_mean_only"``, ``"drmas_std_only"``, ``"grpo_row_score"``.
            The reference's names (``"agent_agent"``, ``"traj_traj"``, ``"agent_traj"``,
            ``"traj_agent"``, ``"auto"`` = ``"master"``, ``"reference_2025_10"`` = ``"3b556f2"``) need ``group_by_agent``.
        norm_by_std: True divides by ``std + eps``; False returns the mean-centred score only.
        eps: added to the std in the denominator (reference: 1e-6).
        single_row: rule for a statistic computed over a single value.
            ``"reference"``: that statistic is replaced by mean 0 / std 1 (A is about the raw score);
            ``"zero"``: the row's advantage is 0 (with ``norm_by_std=False`` only the mean counts).
        std_floor: lower bound applied to the std before ``eps`` is added (0 = off, the reference).
        group_by_agent: the reference's ``group_by_agent_id``, for the reference's names only:
            True indexes the pools by (uid, agent), False by uid. Required by those names and
            refused by the others (whose name already fixes the index), so that a name never
            runs under an index its caller did not choose.

    Rows may come in any order; only ``grpo_first_row`` (and ``reference_2025_10`` by uid) depends on it:
    its "first row" is the lowest row index of the trajectory. Statistics use exactly the rows given: call before padding.

    Returns:
        [N] float32 advantages on the device of ``scores``. Deterministic.

    Raises:
        ValueError: unknown estimator (the message lists the known names), bad ``single_row``,
            negative ``eps``/``std_floor``, ``group_by_agent`` missing for a reference name or given
            for another, mismatched shapes, non-finite scores, or a trajectory id that appears
            under two uids (for estimators that use trajectories).
        TypeError: a non-tensor, non-floating ``scores`` or non-integer ids.
    """
    device = scores.device
    adv = advantages64(scores, uid, traj, agent, estimator, norm_by_std, eps, single_row, std_floor, group_by_agent)
    return adv.to(device=device, dtype=torch.float32)


def advantages64(scores: Tensor, uid: Tensor, traj: Tensor, agent: Tensor, estimator: str = "drmas",
                 norm_by_std: bool = True, eps: float = 1e-6, single_row: SingleRow = "reference",
                 std_floor: float = 0.0, group_by_agent: bool | None = None) -> Tensor:
    """:func:`compute_advantages` before its float32 cast: [N] float64 on the CPU (the per-step
    advantage metrics read these, as the reference's float64 dumps do). Same arguments and errors."""
    if single_row not in ("reference", "zero"):
        raise ValueError(f"single_row must be 'reference' or 'zero', got {single_row!r}")
    if eps < 0 or std_floor < 0:
        raise ValueError(f"eps and std_floor must be >= 0, got eps={eps}, std_floor={std_floor}")
    check_group_index(estimator, group_by_agent)
    _check_inputs(scores, uid, traj, agent)
    if scores.numel() == 0:
        return torch.zeros(0, dtype=torch.float64)
    x = scores.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError("scores contain NaN or inf")
    rows = Rows(x, *(t.detach().to("cpu", torch.int64) for t in (uid, traj, agent)), group_by_agent=group_by_agent)
    return _normalise(ESTIMATORS.get(estimator)(rows), norm_by_std, eps, single_row, std_floor)


def _normalise(terms: Terms, norm_by_std: bool, eps: float, single_row: SingleRow, std_floor: float) -> Tensor:
    """``(x - mean) / (max(std, std_floor) + eps)`` (or ``x - mean``) under the single-value rule, [N] float64."""
    m, s = terms.mean_from, terms.std_from
    lone_mean = m.n == 1
    lone_std = s.n == 1
    if single_row == "reference":
        mean = torch.where(lone_mean, 0.0, m.mean)
        std = torch.where(lone_std, 1.0, s.std)
    else:
        mean, std = m.mean, s.std

    if norm_by_std:
        denom = std.clamp(min=std_floor) + eps
        if single_row == "reference":
            # the reference's std of a one-value pool is a float32 constant 1, and so is its sum with eps
            lone_denom = float(torch.tensor(max(1.0, std_floor), dtype=torch.float32) + eps)
            denom = torch.where(lone_std, lone_denom, denom)
        adv = (terms.x - mean) / denom
        lone = lone_mean | lone_std
    else:
        adv = terms.x - mean
        lone = lone_mean
    if single_row == "zero":
        adv = torch.where(lone, 0.0, adv)
    return adv


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
