"""Policy losses: token-level PPO-clip with dual clip (the reference), GSPO, entropy bonus, KL.

All inputs are ``[B, T]`` (rows x response positions); ``mask`` marks the response tokens that
count. A masked-out position never influences the loss, the gradients or the metrics, whatever
its values (even NaN or inf): every per-token quantity is passed through ``torch.where(mask, ., 0)``
*before* any nonlinearity, so neither values nor gradients can leak out of it. Rows without a
single valid token contribute nothing and never produce NaN.

Loss = pg_loss - entropy_coef * agg(entropy) + kl_coef * agg(kl(logp, ref_logp)).

``pg_weights`` [B, T] (detached; the rollout correction's importance weights,
``drmas_trainer.rollout_correction``) multiply each token's policy-gradient loss before it is
aggregated; the entropy and KL terms are not weighted (as in verl).

PPO (``mode="ppo"``), per token with ``r = exp(logp - old_logp)`` and advantage ``A``::

    l1 = -A * r
    l2 = -A * clip(r, 1 - clip_low, 1 + clip_high)
    l  = max(l1, l2)                       if A >= 0
    l  = min(max(l1, l2), -A * dual_clip)  if A <  0   (dual clip; dual_clip=None turns it off)

GSPO (``mode="gspo"``): the ratio is sequence-level, ``s = exp(mean_t(logp - old_logp))`` over the
row's valid tokens, clipped with its own tiny range (default 3e-4 / 4e-4), aggregated
``seq-mean-token-mean`` by default. It is written in the token-level form
``s_t = sg(s) * exp(logp_t - sg(logp_t))``: the value of every ``s_t`` equals ``s``, and with
``seq-mean-token-mean`` the gradient equals that of the sequence-level objective. As in the
published form, GSPO has no dual clip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

__all__ = ["AGG_MODES", "KL_PENALTIES", "agg_loss", "kl_kind", "kl_penalty", "masked_mean", "policy_loss"]

Mode = Literal["ppo", "gspo"]
Agg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")

#: defaults that depend on the mode: (clip_low, clip_high, agg)
_MODE_DEFAULTS: dict[str, tuple[float, float, Agg]] = {
    "ppo": (0.2, 0.2, "token-mean"),
    "gspo": (3e-4, 4e-4, "seq-mean-token-mean"),
}


def _zero_out(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` where ``mask`` holds, exactly 0 (value and gradient) elsewhere."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_mean(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is true (nonzero).

    Args:
        x: values, any shape broadcastable with ``mask``.
        mask: bool or 0/1 tensor; nonzero = counts. Masked-out values may be NaN/inf.
        dim: dimension(s) to reduce; None reduces everything.

    Returns:
        The masked mean; 0 where nothing is selected (never NaN).
    """
    m = mask.bool()
    total = _zero_out(x, m).sum() if dim is None else _zero_out(x, m).sum(dim=dim)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return total / count.clamp(min=1).to(total.dtype)


def agg_loss(loss_mat: Tensor, mask: Tensor, agg: str) -> Tensor:
    """Aggregate a [B, T] per-token loss into a scalar.

    Args:
        loss_mat: [B, T] per-token loss.
        mask: [B, T] response mask (nonzero = counts).
        agg: ``"token-mean"``: mean over all valid tokens of the batch (the reference);
            ``"seq-mean-token-sum"``: per row sum over its tokens, then mean over rows;
            ``"seq-mean-token-mean"``: per row mean over its tokens, then mean over rows (GSPO).
            The "seq-mean" modes average over rows that have at least one valid token.

    Returns:
        0-d tensor (0 when no token is valid).
    """
    m = mask.bool()
    if agg == "token-mean":
        return masked_mean(loss_mat, m)
    row_has = m.any(dim=-1)
    if agg == "seq-mean-token-sum":
        per_row = _zero_out(loss_mat, m).sum(dim=-1)
    elif agg == "seq-mean-token-mean":
        per_row = masked_mean(loss_mat, m, dim=-1)
    else:
        raise ValueError(f"unknown loss aggregation {agg!r}; known: {', '.join(AGG_MODES)}")
    return masked_mean(per_row, row_has)


#: per-token KL estimators by name (verl's ``kl_penalty`` kinds): ``fn(logp, ref_logp) -> [B, T]``
KL_PENALTIES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {}


def kl_kind(*names: str) -> Callable:
    """Register a per-token KL estimator under ``names`` (a new kind is one decorated function)."""
    def deco(fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
        for n in names:
            if n in KL_PENALTIES:
                raise ValueError(f"KL kind {n!r} is already registered")
            KL_PENALTIES[n] = fn
        return fn
    return deco


@kl_kind("k1", "kl")
def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``logp - ref_logp`` (unbiased, high variance, may be negative)."""
    return logp - ref_logp


@kl_kind("abs")
def _abs(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``|logp - ref_logp|``."""
    return (logp - ref_logp).abs()


@kl_kind("k2", "mse")
def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``0.5 * (logp - ref_logp)^2``."""
    return 0.5 * (logp - ref_logp).square()


@kl_kind("k3", "low_var_kl")
def _k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``exp(d) - d - 1`` with ``d = ref_logp - logp`` (low variance, >= 0); d clamped to [-20, 20]
    before ``exp`` (the result is clamped to [-10, 10] anyway, so the clamp changes no value) and
    the result to [-10, 10]."""
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


def kl_penalty(logp: Tensor, ref_logp: Tensor, kl_type: str = "k3") -> Tensor:
    """Per-token KL estimate [B, T] of the policy against a reference policy, on sampled tokens.

    Args:
        logp: [B, T] log-probs under the current (or old) policy.
        ref_logp: [B, T] log-probs under the reference policy.
        kl_type: a name of :data:`KL_PENALTIES`: ``k1`` = ``kl``, ``abs``, ``k2`` = ``mse``,
            ``k3`` = ``low_var_kl`` (verl's names).
    """
    fn = KL_PENALTIES.get(kl_type)
    if fn is None:
        raise ValueError(f"unknown kl_type {kl_type!r}; known: {', '.join(KL_PENALTIES)}")
    return fn(logp, ref_logp)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    mode: Mode = "ppo",
    clip_low: float | None = None,
    clip_high: float | None = None,
    dual_clip: float | None = 3.0,
    agg: Agg | None = None,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_type: str = "k3",
    pg_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy-gradient loss for one micro-batch.

    Args:
        logp: [B, T] log-probs of the sampled tokens under the current policy (with grad).
        old_logp: [B, T] log-probs under the rollout policy (no grad needed).
        advantages: [B] one per row (broadcast to its tokens) or [B, T] per token.
        mask: [B, T] response mask, bool or 0/1; nonzero = the token counts.
        mode: ``"ppo"``: token-level ratio, PPO-clip + dual clip (the reference);
            ``"gspo"``: sequence-level ratio over the row's valid tokens (GSPO).
        clip_low: ratio lower clip ``1 - clip_low``; None = mode default (ppo 0.2, gspo 3e-4).
        clip_high: ratio upper clip ``1 + clip_high``; None = mode default (ppo 0.2, gspo 4e-4).
        dual_clip: PPO only: for A < 0 the token loss is capped at ``-A * dual_clip`` (must be
            > 1; the reference uses 3.0); None disables it. GSPO ignores it.
        agg: ``"token-mean"``, ``"seq-mean-token-sum"`` or ``"seq-mean-token-mean"``
            (see :func:`agg_loss`); None = mode default (ppo token-mean, gspo seq-mean-token-mean).
            The entropy and KL terms use the same aggregation.
        entropy: [B, T] per-token policy entropy (with grad), or None.
        entropy_coef: weight of the entropy bonus (subtracted from the loss); needs ``entropy``.
        ref_logp: [B, T] log-probs under a reference model, or None (the paper uses none).
        kl_coef: weight of the KL penalty (added); needs ``ref_logp``.
        kl_type: KL estimator, ``"k1"``, ``"k2"`` or ``"k3"`` (see :func:`kl_penalty`).
        pg_weights: [B, T] per-token weights of the policy-gradient term (rollout correction), or
            None (all 1). Detached; padding's values never matter. A weight of 0 drops the token
            from the policy gradient but keeps it in the aggregation's count.

    Returns:
        ``(loss, metrics)``: the 0-d loss tensor to back-propagate and a dict of floats:
        ``loss``, ``pg_loss``; ``pg_clipfrac`` (share of valid tokens where the clip is active);
        ``pg_clipfrac_lower`` (share where the dual clip is active); ``ppo_kl`` (approx KL to
        the rollout policy, masked mean of ``old_logp - logp``); ``ratio_mean``, ``ratio_max``
        (token ratios for PPO, sequence ratios over non-empty rows for GSPO; 1.0 when nothing
        is valid); ``entropy`` (masked mean, 0 without ``entropy``); ``kl`` (masked mean, 0
        without ``ref_logp``).
    """
    if mode not in _MODE_DEFAULTS:
        raise ValueError(f"unknown policy loss mode {mode!r}; known: {', '.join(_MODE_DEFAULTS)}")
    d_low, d_high, d_agg = _MODE_DEFAULTS[mode]
    clip_low = d_low if clip_low is None else clip_low
    clip_high = d_high if clip_high is None else clip_high
    agg = d_agg if agg is None else agg
    if agg not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {agg!r}; known: {', '.join(AGG_MODES)}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    if logp.dim() != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp, old_logp and mask must share one [B, T] shape; got {tuple(logp.shape)}, "
            f"{tuple(old_logp.shape)}, {tuple(mask.shape)}"
        )
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs the per-token `entropy`")
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef != 0 needs `ref_logp`")

    # compute in at least float32 (bf16 log-probs are upcast; the cast is differentiable)
    work = torch.promote_types(logp.dtype, torch.float32)
    logp = logp.to(work)
    m = mask.bool()
    if advantages.dim() == 1:
        if advantages.shape[0] != logp.shape[0]:
            raise ValueError(f"advantages has {advantages.shape[0]} rows, logp {logp.shape[0]}")
        advantages = advantages[:, None].expand_as(logp)
    elif advantages.shape != logp.shape:
        raise ValueError(f"advantages must be [B] or [B, T], got {tuple(advantages.shape)}")
    adv = _zero_out(advantages.detach().to(logp.dtype), m)
    old = old_logp.detach().to(work)
    # log ratio to the rollout policy, zero (with zero gradient) on masked-out positions
    log_ratio = _zero_out(logp - old, m)

    if mode == "ppo":
        ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
        l1 = -adv * ratio
        l2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        clipped = torch.maximum(l1, l2)
        clip_active = l2 > l1
        if dual_clip is not None:
            l3 = -adv * dual_clip
            neg = adv < 0
            dual_active = neg & (clipped > l3)
            pg_tok = torch.where(neg, torch.minimum(clipped, l3), clipped)
        else:
            dual_active = torch.zeros_like(m)
            pg_tok = clipped
        ratio_shown = ratio.detach()
        ratio_sel = m
    else:  # gspo
        n_tok = m.sum(dim=-1, keepdim=True).clamp(min=1).to(logp.dtype)
        seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True) / n_tok  # mean over valid tokens
        logp_valid = _zero_out(logp, m)
        # value: seq_log_ratio at every token; gradient: d logp_t (sequence-level after aggregation)
        tok_log_ratio = logp_valid - logp_valid.detach() + seq_log_ratio.detach()
        ratio = torch.exp(tok_log_ratio.clamp(max=10.0))
        l1 = -adv * ratio
        l2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        pg_tok = torch.maximum(l1, l2)
        clip_active = l2 > l1
        dual_active = torch.zeros_like(m)
        ratio_shown = torch.exp(seq_log_ratio.detach().clamp(max=10.0)).squeeze(-1)  # [B]
        ratio_sel = m.any(dim=-1)  # one ratio per non-empty row

    if pg_weights is not None:
        if pg_weights.shape != logp.shape:
            raise ValueError(f"pg_weights must be [B, T] like logp, got {tuple(pg_weights.shape)}")
        pg_tok = pg_tok * _zero_out(pg_weights.detach().to(device=logp.device, dtype=work), m)
    pg_loss = agg_loss(pg_tok, m, agg)
    loss = pg_loss
    ent_value = torch.zeros((), dtype=logp.dtype, device=logp.device)
    kl_value = torch.zeros((), dtype=logp.dtype, device=logp.device)
    if entropy is not None:
        ent_tok = _zero_out(entropy.to(work), m)
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * agg_loss(ent_tok, m, agg)
        ent_value = masked_mean(ent_tok.detach(), m)
    if ref_logp is not None:
        logp_valid = _zero_out(logp, m)
        ref_valid = _zero_out(ref_logp.detach().to(logp.dtype), m)
        kl_tok = _zero_out(kl_penalty(logp_valid, ref_valid, kl_type), m)
        if kl_coef != 0.0:
            loss = loss + kl_coef * agg_loss(kl_tok, m, agg)
        kl_value = masked_mean(kl_tok.detach(), m)

    with torch.no_grad():
        any_valid = ratio_sel.any()
        ratio_mean = torch.where(any_valid, masked_mean(ratio_shown, ratio_sel), 1.0)
        ratio_max = torch.where(any_valid, ratio_shown.masked_fill(~ratio_sel, -torch.inf).max(), 1.0)
        values = torch.stack(
            [
                loss.detach(),
                pg_loss.detach(),
                masked_mean(clip_active.to(logp.dtype), m),
                masked_mean(dual_active.to(logp.dtype), m),
                masked_mean(-log_ratio.detach(), m),
                ratio_mean.to(logp.dtype),
                ratio_max.to(logp.dtype),
                ent_value.to(logp.dtype),
                kl_value.to(logp.dtype),
            ]
        ).tolist()  # one device sync for all metrics
    keys = ("loss", "pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "ratio_mean", "ratio_max", "entropy", "kl")
    return loss, dict(zip(keys, values))
