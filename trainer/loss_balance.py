"""Per-row loss weights (``algo.loss_weights``; the reference's ``balance_loss_by_agent_freq``).

``agent_freq``: every (prompt group, agent) pair gets the same total weight in the policy loss,
however many rows (calls) the agent made for that prompt::

    w_i = (1 / n_{u(i), k(i)}) / mean_j (1 / n_{u(j), k(j)})          (batch mean 1)

where ``n_{u,k}`` counts the batch's rows of agent k in prompt group u. The weight multiplies each
of the row's tokens' policy-gradient loss before aggregation (``policy_loss(pg_weights=...)``); the
clip fractions, ``ppo_kl``, the entropy and the KL term stay unweighted. It isolates the
re-weighting of agents by call frequency that agent-wise statistics imply from the statistics
themselves. ``none``: no weights.

A new weighting registers with ``@loss_weighting("name")``: ``fn(uid [N], agent [N]) -> [N]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from drmas_bench.registry import Registry
from drmas_trainer.segments import dense_ids, take

__all__ = ["LOSS_WEIGHTS", "agent_freq_weights", "loss_weighting", "row_loss_weights"]

LOSS_WEIGHTS: Registry[Callable[[Tensor, Tensor], Tensor | None]] = Registry("loss weighting", error=ValueError)


def loss_weighting(name: str) -> Callable[[Callable[[Tensor, Tensor], Tensor | None]], Callable[[Tensor, Tensor], Tensor | None]]:
    """Register ``fn(uid, agent) -> weights`` as ``algo.loss_weights: name`` (refused twice)."""
    return LOSS_WEIGHTS.register(name)


@loss_weighting("none")
def no_weights(uid: Tensor, agent: Tensor) -> None:
    """``algo.loss_weights: none``: every row weighs the same (no weights)."""
    return None


@loss_weighting("agent_freq")
def agent_freq_weights(uid: Tensor, agent: Tensor) -> Tensor:
    """Loss balance by agent frequency.

    Args:
        uid: [N] integer prompt-group id per row.
        agent: [N] integer agent id per row.

    Returns:
        [N] float32 weights on the CPU, ``(1 / n of the row's (uid, agent)) / batch mean`` (mean 1;
        computed in float32 as the reference does); empty for no rows.
    """
    if uid.shape != agent.shape or uid.dim() != 1:
        raise ValueError(f"uid and agent must be 1-D of one length, got {tuple(uid.shape)} and {tuple(agent.shape)}")
    if uid.numel() == 0:
        return torch.zeros(0, dtype=torch.float32)
    u, _ = dense_ids(uid.detach().to("cpu", torch.int64))
    a, n_a = dense_ids(agent.detach().to("cpu", torch.int64))
    pair, n_pair = dense_ids(u * n_a + a)
    count = torch.zeros(n_pair, dtype=torch.int64).index_add_(0, pair, torch.ones_like(pair))
    raw = (1.0 / take(count, pair).to(torch.float64)).to(torch.float32)
    return raw / raw.mean()


def row_loss_weights(name: str, uid: Tensor, agent: Tensor) -> Tensor | None:
    """The weighting ``name`` of :data:`LOSS_WEIGHTS` on one step's rows ([N] each); None for ``none``."""
    return LOSS_WEIGHTS.get(name)(uid, agent)
