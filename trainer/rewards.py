"""What the advantages are computed from: each row's score, and the KL penalty a reference (frozen)
policy puts into it (``algo.use_kl_in_reward``, as verl's ``apply_kl_penalty``). Pure functions and
two small controllers; the trainer calls them once per step.

Row score (every run)::

    x_i = R_t(i) - c_inv * (1 - valid_i)

KL in the reward (``use_kl_in_reward: true``). Each row's response tokens get a per-token penalty
from the trainer's old log-probs and the reference policy's (``kl_penalty`` kind, see
``drmas_trainer.losses.KL_PENALTIES``)::

    kld[b, t]     = kl(old_logp[b, t], ref_logp[b, t]) * mask[b, t]
    rewards[b, t] = scores[b, t] - beta * kld[b, t]          (scores: the row score at its last token)
    current_kl    = mean_b ( sum_t kld[b, t] / n_b )         (logged as actor/reward_kl_penalty)

so the row's score for the advantages becomes ``x_i - beta * sum_t kld[i, t]``. ``beta`` is the
controller's value before its update (logged as ``actor/reward_kl_penalty_coeff``); then the
controller updates once with ``n_steps`` = the batch's rows:

    fixed      beta stays kl_coef
    adaptive   beta *= 1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * n_steps / horizon

(Ziegler et al. 2019's proportional controller, as the reference runs it). A new controller kind
registers with ``@kl_controller("name")``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from drmas_bench.registry import Registry
from drmas_trainer.losses import kl_penalty

__all__ = ["KL_CONTROLLERS", "AdaptiveKLController", "FixedKLController", "kl_controller", "kl_in_reward",
           "kl_reward_step", "make_kl_controller", "row_scores"]


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


# ---------------------------------------------------------------------------------------- controllers

KL_CONTROLLERS: Registry[Callable[..., "KLController"]] = Registry("KL controller", error=ValueError)


def kl_controller(name: str) -> Callable[[Callable[..., "KLController"]], Callable[..., "KLController"]]:
    """Register a KL-coefficient controller class under ``name`` (``algo.kl_ctrl.type``; refused twice)."""
    return KL_CONTROLLERS.register(name)


class KLController:
    """A KL coefficient: ``value`` is the beta of the next step; :meth:`update` moves it."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        raise NotImplementedError


@kl_controller("fixed")
@dataclass
class FixedKLController(KLController):
    """beta = kl_coef for ever."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        return None


@kl_controller("adaptive")
@dataclass
class AdaptiveKLController(KLController):
    """beta *= 1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon."""

    value: float
    target: float
    horizon: float

    def update(self, current_kl: float, n_steps: int) -> None:
        err = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon


def make_kl_controller(kind: str, kl_coef: float, target_kl: float = 0.1, horizon: float = 10000.0) -> KLController:
    """The controller ``kind`` (``fixed`` | ``adaptive``) starting at ``kl_coef``; one-line errors."""
    ctrl = KL_CONTROLLERS.get(kind)  # an unknown kind: one line listing the known ones
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if horizon <= 0 or target_kl <= 0:
        raise ValueError(f"the adaptive KL controller needs horizon > 0 and target_kl > 0, got {horizon}, {target_kl}")
    return ctrl(kl_coef, target_kl, horizon)


# ---------------------------------------------------------------------------------------- the step


def kl_in_reward(token_scores: Tensor, old_logp: Tensor, ref_logp: Tensor, mask: Tensor, beta: float,
                 kind: str = "kl") -> tuple[Tensor, Tensor]:
    """Token rewards with the KL penalty, and the batch's mean KL.

    Args:
        token_scores: [B, T] the row scores placed at each row's last response token (0 elsewhere).
        old_logp: [B, T] the policy's (old) log-probs of the sampled tokens.
        ref_logp: [B, T] the reference policy's log-probs of the same tokens.
        mask: [B, T] response mask (nonzero = a real token); padding's values never matter.
        beta: the KL coefficient of this step.
        kind: a ``drmas_trainer.losses.KL_PENALTIES`` name (kl, k1, abs, mse, k2, low_var_kl, k3).

    Returns:
        ``(token_rewards [B, T], current_kl 0-d)``: ``token_scores - beta * kld`` and the mean over
        rows of each row's mean kld over its tokens (a row without tokens counts as 0).
    """
    if not (token_scores.shape == old_logp.shape == ref_logp.shape == mask.shape) or mask.dim() != 2:
        raise ValueError(f"token_scores, old_logp, ref_logp and mask must share one [B, T] shape; got "
                         f"{tuple(token_scores.shape)}, {tuple(old_logp.shape)}, {tuple(ref_logp.shape)}, {tuple(mask.shape)}")
    m = mask.to(old_logp.dtype)
    zero = torch.zeros((), dtype=old_logp.dtype)
    kld = torch.where(mask.bool(), kl_penalty(old_logp, ref_logp, kind), zero) * m
    rewards = token_scores - beta * kld
    per_row = kld.sum(dim=-1) / (m.sum(dim=-1) + 1e-8)
    return rewards, per_row.mean() if per_row.numel() else zero


def kl_reward_step(ctrl: KLController, token_scores: Tensor, old_logp: Tensor, ref_logp: Tensor, mask: Tensor,
                   kind: str = "kl") -> tuple[Tensor, float, float]:
    """One step of KL in the reward: :func:`kl_in_reward` at ``beta = ctrl.value``, then the
    controller's update with ``n_steps`` = B (shapes as there).

    Returns:
        ``(token_rewards [B, T], current_kl, beta)``; ``ctrl.value`` is the next step's beta.
    """
    beta = float(ctrl.value)
    rewards, current = kl_in_reward(token_scores, old_logp, ref_logp, mask, beta, kind)
    current_kl = float(current)
    ctrl.update(current_kl, int(token_scores.shape[0]))
    return rewards, current_kl, beta
