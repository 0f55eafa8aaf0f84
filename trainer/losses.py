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
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from drmas_bench.registry import Registry

__all__ = ["AGG_MODES", "KL_PENALTIES", "POLICY_LOSSES", "TokenLoss", "agg_loss", "kl_kind", "kl_penalty", "loss_mode",
           "masked_mean", "policy_loss"]

Mode = Literal["ppo", "gspo"]
Agg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")

#: defaults that depend on the mode: (clip_low, clip_high, agg), filled in by :func:`loss_mode`
_MODE_DEFAULTS: dict[str, tuple[float, float, Agg]] = {}


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
KL_PENALTIES: Registry[Callable[[Tensor, Tensor], Tensor]] = Registry("kl_type", error=ValueError)


def kl_kind(name: str, *aliases: str) -> Callable:
    """Register a per-token KL estimator under ``name`` and ``aliases`` (a new kind is one decorated function)."""
    return KL_PENALTIES.register(name, aliases=aliases)


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
    return KL_PENALTIES.get(kl_type)(logp, ref_logp)  # an unknown name: one ValueError listing the known ones


@dataclass
class TokenLoss:
    """What a policy-loss mode computes on a micro-batch (B rows, T positions).

    Attributes:
        pg: [B, T] per-token policy-gradient loss (0 on masked-out positions).
        clip_active: [B, T] bool, the ratio clip is active (``pg_clipfrac``).
        dual_active: [B, T] bool, the dual clip is active (``pg_clipfrac_lower``).
        ratio: the ratios shown in the metrics ([B, T] per token, or [B] per sequence).
        ratio_sel: bool mask of ``ratio``'s entries that count.
    """

    pg: Tensor
    clip_active: Tensor
    dual_active: Tensor
    ratio: Tensor
    ratio_sel: Tensor


#: policy-loss modes: ``fn(logp, log_ratio, adv, mask, clip_low, clip_high, dual_clip) -> TokenLoss``
POLICY_LOSSES: Registry[Callable[..., TokenLoss]] = Registry("policy loss mode", error=ValueError)


def loss_mode(name: str, clip_low: float, clip_high: float, agg: Agg) -> Callable:
    """Register a policy-loss mode (``algo.loss``) under ``name`` with its default clip and aggregation."""
    def deco(fn: Callable[..., TokenLoss]) -> Callable[..., TokenLoss]:
        POLICY_LOSSES.register(name, fn)
        _MODE_DEFAULTS[name] = (clip_low, clip_high, agg)
        return fn
    return deco


@loss_mode("ppo", 0.2, 0.2, "token-mean")
def _ppo(logp: Tensor, log_ratio: Tensor, adv: Tensor, m: Tensor, clip_low: float, clip_high: float,
         dual_clip: float | None) -> TokenLoss:
    """Token-level PPO-clip with the dual clip (module docstring); all tensors [B, T]."""
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(l1, l2)
    if dual_clip is None:
        return TokenLoss(clipped, l2 > l1, torch.zeros_like(m), ratio.detach(), m)
    l3 = -adv * dual_clip
    neg = adv < 0
    pg = torch.where(neg, torch.minimum(clipped, l3), clipped)
    return TokenLoss(pg, l2 > l1, neg & (clipped > l3), ratio.detach(), m)


@loss_mode("gspo", 3e-4, 4e-4, "seq-mean-token-mean")
def _gspo(logp: Tensor, log_ratio: Tensor, adv: Tensor, m: Tensor, clip_low: float, clip_high: float,
          dual_clip: float | None) -> TokenLoss:
    """GSPO's sequence-level ratio in token form (module docstring); [B, T] in, ratios per row [B]."""
    n_tok = m.sum(dim=-1, keepdim=True).clamp(min=1).to(logp.dtype)
    seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True) / n_tok  # mean over valid tokens
    logp_valid = _zero_out(logp, m)
    # value: seq_log_ratio at every token; gradient: d logp_t (sequence-level after aggregation)
    tok_log_ratio = logp_valid - logp_valid.detach() + seq_log_ratio.detach()
    ratio = torch.exp(tok_log_ratio.clamp(max=10.0))
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    shown = torch.exp(seq_log_ratio.detach().clamp(max=10.0)).squeeze(-1)  # [B]
    return TokenLoss(torch.maximum(l1, l2), l2 > l1, torch.zeros_like(m), shown, m.any(dim=-1))


def _settings(mode: str, clip_low: float | None, clip_high: float | None, agg: str | None,
              dual_clip: float | None) -> tuple[float, float, str]:
    """The mode's defaults filled in and checked: (clip_low, clip_high, agg)."""
    POLICY_LOSSES.get(mode)  # an unknown name: one ValueError listing the known ones
    d_low, d_high, d_agg = _MODE_DEFAULTS[mode]
    agg = d_agg if agg is None else agg
    if agg not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {agg!r}; known: {', '.join(AGG_MODES)}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    return (d_low if clip_low is None else clip_low), (d_high if clip_high is None else clip_high), agg


def _check_shapes(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """[B, T] inputs of one shape; the advantages broadcast to [B, T]."""
    if logp.dim() != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp, old_logp and mask must share one [B, T] shape; got {tuple(logp.shape)}, "
            f"{tuple(old_logp.shape)}, {tuple(mask.shape)}"
        )
    if advantages.dim() == 1:
        if advantages.shape[0] != logp.shape[0]:
            raise ValueError(f"advantages has {advantages.shape[0]} rows, logp {logp.shape[0]}")
        return advantages[:, None].expand_as(logp)
    if advantages.shape != logp.shape:
        raise ValueError(f"advantages must be [B] or [B, T], got {tuple(advantages.shape)}")
    return advantages


def _side_terms(logp: Tensor, m: Tensor, agg: str, entropy: Tensor | None, entropy_coef: float,
                ref_logp: Tensor | None, kl_coef: float, kl_type: str) -> tuple[Tensor, Tensor, Tensor]:
    """(the entropy and KL terms to add to the loss, masked-mean entropy, masked-mean KL); unweighted."""
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    extra, ent_value, kl_value = zero, zero, zero
    if entropy is not None:
        ent_tok = _zero_out(entropy.to(logp.dtype), m)
        if entropy_coef != 0.0:
            extra = extra - entropy_coef * agg_loss(ent_tok, m, agg)
        ent_value = masked_mean(ent_tok.detach(), m)
    if ref_logp is not None:
        ref_valid = _zero_out(ref_logp.detach().to(logp.dtype), m)
        kl_tok = _zero_out(kl_penalty(_zero_out(logp, m), ref_valid, kl_type), m)
        if kl_coef != 0.0:
            extra = extra + kl_coef * agg_loss(kl_tok, m, agg)
        kl_value = masked_mean(kl_tok.detach(), m)
    return extra, ent_value, kl_value


def _metrics(loss: Tensor, pg_loss: Tensor, t: TokenLoss, log_ratio: Tensor, m: Tensor, ent: Tensor,
             kl: Tensor) -> dict[str, float]:
    """The micro-batch's metrics, with one device sync (see :func:`policy_loss`)."""
    dt = loss.dtype
    with torch.no_grad():
        any_valid = t.ratio_sel.any()
        ratio_mean = torch.where(any_valid, masked_mean(t.ratio, t.ratio_sel), 1.0)
        ratio_max = torch.where(any_valid, t.ratio.masked_fill(~t.ratio_sel, -torch.inf).max(), 1.0)
        values = torch.stack([loss.detach(), pg_loss.detach(), masked_mean(t.clip_active.to(dt), m),
                              masked_mean(t.dual_active.to(dt), m), masked_mean(-log_ratio.detach(), m),
                              ratio_mean.to(dt), ratio_max.to(dt), ent.to(dt), kl.to(dt)]).tolist()
    keys = ("loss", "pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "ratio_mean", "ratio_max", "entropy", "kl")
    return dict(zip(keys, values))


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, mode: Mode = "ppo",
                clip_low: float | None = None, clip_high: float | None = None, dual_clip: float | None = 3.0,
                agg: Agg | None = None, entropy: Tensor | None = None, entropy_coef: float = 0.0,
                ref_logp: Tensor | None = None, kl_coef: float = 0.0, kl_type: str = "k3",
                pg_weights: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy-gradient loss for one micro-batch (the module docstring has the formulas).

    Args:
        logp: [B, T] log-probs of the sampled tokens under the current policy (with grad).
        old_logp: [B, T] under the rollout policy. advantages: [B] (one per row) or [B, T].
        mask: [B, T] response mask, bool or 0/1. mode: a :data:`POLICY_LOSSES` name (ppo | gspo).
        clip_low, clip_high: the ratio clip ``[1 - low, 1 + high]``; None = the mode's default
            (ppo 0.2 / 0.2, gspo 3e-4 / 4e-4). dual_clip: PPO's cap ``-A * dual_clip`` for A < 0
            (> 1; None: off; GSPO has none). agg: token-mean | seq-mean-token-sum |
            seq-mean-token-mean (:func:`agg_loss`); None = the mode's (ppo token-mean, gspo
            seq-mean-token-mean); the entropy and KL terms use it too.
        entropy, entropy_coef: [B, T] per-token entropy (with grad) and its bonus weight.
        ref_logp, kl_coef, kl_type: a reference policy's [B, T] log-probs, the KL loss weight and
            the :data:`KL_PENALTIES` kind.
        pg_weights: [B, T] detached weights multiplied into each token's policy-gradient loss
            before aggregation (rollout correction, loss balance); a 0 keeps the token in the count.

    Returns:
        ``(loss, metrics)``: the 0-d loss and floats ``loss``, ``pg_loss``, ``pg_clipfrac``,
        ``pg_clipfrac_lower``, ``ppo_kl`` (masked mean of old - new), ``ratio_mean``, ``ratio_max``
        (per token for PPO, per non-empty row for GSPO; 1.0 when nothing is valid), ``entropy``,
        ``kl``. The clip fractions, ``ppo_kl``, entropy and KL are unweighted.
    """
    clip_low, clip_high, how = _settings(mode, clip_low, clip_high, agg, dual_clip)
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs the per-token `entropy`")
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef != 0 needs `ref_logp`")
    work = torch.promote_types(logp.dtype, torch.float32)  # bf16 log-probs are upcast (differentiably)
    logp = logp.to(work)
    m = mask.bool()
    adv = _zero_out(_check_shapes(logp, old_logp, advantages, mask).detach().to(work), m)
    log_ratio = _zero_out(logp - old_logp.detach().to(work), m)  # 0 (and no gradient) off the mask
    t = POLICY_LOSSES.get(mode)(logp, log_ratio, adv, m, clip_low, clip_high, dual_clip)
    pg_tok = t.pg
    if pg_weights is not None:
        if pg_weights.shape != logp.shape:
            raise ValueError(f"pg_weights must be [B, T] like logp, got {tuple(pg_weights.shape)}")
        pg_tok = pg_tok * _zero_out(pg_weights.detach().to(device=logp.device, dtype=work), m)
    pg_loss = agg_loss(pg_tok, m, how)
    extra, ent_value, kl_value = _side_terms(logp, m, how, entropy, entropy_coef, ref_logp, kl_coef, kl_type)
    loss = pg_loss + extra
    return loss, _metrics(loss, pg_loss, t, log_ratio, m, ent_value, kl_value)
