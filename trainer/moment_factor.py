"""The per-agent second-moment factor of Lemma 4.2 (REFERENCE section 1), measured from a step's rollouts.

With global statistics (one mean ``mu`` and std ``sigma`` per prompt group, every agent's rows
pooled, action-weighted) the advantage ``(x - mu) / sigma`` of agent k's rows has the second moment

    F_k = (sigma_k^2 + (mu_k - mu)^2) / sigma^2

where ``mu_k``, ``sigma_k`` are the moments of agent k's rows in the group. Agent-wise statistics
(Dr. MAS) make it exactly 1, so ``F_k`` is the factor by which global normalisation scales agent k's
gradient second moment (plus a covariance term) relative to Dr. MAS: ``F_k > 1`` predicts larger
(spikier) gradients for that agent, ``F_k < 1`` smaller ones.

Definitions (the choices, stated once):

- the row values are the row scores ``x = R - c_inv * (1 - valid)`` the estimators see;
- moments are population moments (divide by the count), so that ``sum_k w_k F_k = 1`` exactly in
  every group, with ``w_k`` agent k's share of the group's rows;
- a group contributes to agent k when agent k has a row in it and ``sigma > 0`` (an all-equal group
  gives every estimator zero advantages: no gradient to scale);
- the step's value is the mean of the per-group factors over the contributing groups (NaN when
  none contributes), with the number of contributing groups alongside.

This is a property of the rollouts, not of the estimator: it is logged for every run, so a study
can put grad-norm spikes of a GRPO run next to the factor its own rollouts predicted.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _group_moments(x: Tensor, seg: Tensor, n_seg: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-segment (count, mean, population variance) of float64 ``x`` with segment ids ``seg``."""
    count = torch.zeros(n_seg, dtype=torch.float64).index_add_(0, seg, torch.ones_like(x))
    mean = torch.zeros(n_seg, dtype=torch.float64).index_add_(0, seg, x) / count.clamp(min=1.0)
    dev = x - mean[seg]
    var = torch.zeros(n_seg, dtype=torch.float64).index_add_(0, seg, dev * dev) / count.clamp(min=1.0)
    return count, mean, var


def second_moment_factors(scores: Tensor, uid: Tensor, agent: Tensor, n_agents: int,
                          tol: float = 1e-12) -> dict[int, tuple[float, int]]:
    """Per agent index k in ``0..n_agents-1``: (mean over groups of F_k, number of groups used).

    Args:
        scores: [N] row scores.
        uid: [N] prompt-group id per row (any integers).
        agent: [N] agent index per row, in ``0..n_agents-1``.
        n_agents: the number of agents (an agent without rows gets ``(nan, 0)``).
        tol: a group whose pooled variance is at most ``tol`` is left out (all-equal scores).
    """
    x = scores.detach().to(torch.float64).reshape(-1)
    _, u = torch.unique(uid.reshape(-1), return_inverse=True)
    a = agent.reshape(-1).to(torch.int64)
    n_u = int(u.max()) + 1 if u.numel() else 0
    _, mu, var = _group_moments(x, u, n_u)
    cell = u * n_agents + a  # (group, agent)
    c_k, mu_k, var_k = _group_moments(x, cell, n_u * n_agents)
    c_k, mu_k, var_k = (t.view(n_u, n_agents) for t in (c_k, mu_k, var_k))
    factor = (var_k + (mu_k - mu[:, None]) ** 2) / var.clamp(min=tol)[:, None]
    use = (c_k > 0) & (var > tol)[:, None]
    out: dict[int, tuple[float, int]] = {}
    for k in range(n_agents):
        m = use[:, k]
        n = int(m.sum())
        out[k] = (float(factor[m, k].mean()) if n else float("nan"), n)
    return out
