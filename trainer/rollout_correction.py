"""Rollout correction: importance weights for the gap between the rollout engine's log-probs and the
trainer's own (old) log-probs of the same tokens, and the metrics that measure that gap. Pure
tensor functions, no state.

    w = correction_weights("tis_token", old, engine, mask, threshold=2.0)   # [B, T], detached
    m = mismatch_metrics(old, engine, mask, "tis_token", 2.0)               # {"kl": ..., ...}

Why: the engine (SGLang in bf16 with its own kernels, or any engine in another dtype) and the
trainer assign different probabilities to the same sampled tokens, so even after the trainer
recomputes the old log-probs (``rollout.old_logprobs: recompute``) the samples come from the
engine's distribution, not the trainer's. The policy-gradient term of each token is multiplied by
a detached weight built from ``ratio = exp(old_trainer - engine)`` (log space, clamped to
+-``SAFETY_BOUND`` before ``exp``):

    none        1
    tis_token   min(ratio_t, C)                       truncated importance sampling, per token
    tis_seq     min(prod_t ratio_t, C)                the same with the sequence's ratio
    mis_token   ratio_t if ratio_t <= C else 0        masked importance sampling: the token is dropped
    mis_seq     prod_t ratio_t if <= C else 0         the whole sequence is dropped

``prod_t`` runs over the row's real response tokens only (a sum of log ratios). C is
``rollout.correction_threshold`` (2.0, verl's default). The dropped tokens of the ``mis`` modes
keep their place in the loss's normaliser (their weight is 0), so micro-batch accumulation stays
exact. Shapes: B rows, T the longest response; ``mask`` [B, T] true on real response tokens;
padding never enters a weight or a metric.

New options register with ``@correction("name")`` (the way estimators and losses do), and become a
valid ``rollout.correction``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from drmas_bench.registry import Registry

__all__ = ["CORRECTIONS", "SAFETY_BOUND", "correction", "correction_weights", "log_ratio", "mismatch_metrics", "pad_lists",
           "seq_level"]

#: log ratios are clamped to +-20 before exp (verl's bound): a ratio of e^20 is already meaningless
SAFETY_BOUND = 20.0

#: name -> fn(log_ratio [B, T], mask [B, T] bool, log_c float) -> weights [B, T] (0 on padding)
CORRECTIONS: Registry[Callable[[Tensor, Tensor, float], Tensor]] = Registry("rollout correction", error=ValueError)
#: names whose weight is one number per sequence (their ratio metrics are per sequence too)
_SEQ_LEVEL: set[str] = set()
#: names that drop (weight 0) rather than truncate
_MASKING: set[str] = set()


def correction(name: str, *, seq: bool = False, masks: bool = False) -> Callable:
    """Register a correction ``fn(log_ratio, mask, log_c) -> weights`` under ``name``.
    ``seq``: its weight is per sequence; ``masks``: it drops tokens (weight 0) above the threshold."""

    def deco(fn: Callable[[Tensor, Tensor, float], Tensor]) -> Callable[[Tensor, Tensor, float], Tensor]:
        CORRECTIONS.register(name, fn)
        if seq:
            _SEQ_LEVEL.add(name)
        if masks:
            _MASKING.add(name)
        return fn

    return deco


def seq_level(name: str) -> bool:
    """Whether correction ``name`` weighs whole sequences."""
    return name in _SEQ_LEVEL


def _zero(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def log_ratio(old_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> Tensor:
    """``old_trainer - engine`` per token [B, T] float64, exactly 0 on padding (whatever it holds)."""
    m = mask.bool()
    return _zero(old_logp.detach().double() - engine_logp.detach().double(), m)


def _seq_log_ratio(lr: Tensor, mask: Tensor) -> Tensor:
    """Sum of the log ratios over each row's real tokens: [B] (the log of the product of ratios)."""
    return _zero(lr, mask).sum(dim=-1)


@correction("none")
def _none(lr: Tensor, mask: Tensor, log_c: float) -> Tensor:
    return mask.to(lr.dtype)


@correction("tis_token")
def _tis_token(lr: Tensor, mask: Tensor, log_c: float) -> Tensor:
    return _zero(torch.exp(lr.clamp(-SAFETY_BOUND, min(SAFETY_BOUND, log_c))), mask)


@correction("tis_seq", seq=True)
def _tis_seq(lr: Tensor, mask: Tensor, log_c: float) -> Tensor:
    s = _seq_log_ratio(lr, mask).clamp(-SAFETY_BOUND, min(SAFETY_BOUND, log_c))
    return _zero(torch.exp(s)[:, None].expand_as(lr), mask)


@correction("mis_token", masks=True)
def _mis_token(lr: Tensor, mask: Tensor, log_c: float) -> Tensor:
    keep = mask & (lr <= log_c)
    return _zero(torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)), keep)


@correction("mis_seq", seq=True, masks=True)
def _mis_seq(lr: Tensor, mask: Tensor, log_c: float) -> Tensor:
    s = _seq_log_ratio(lr, mask)
    keep = mask & (s <= log_c)[:, None]
    return _zero(torch.exp(s.clamp(-SAFETY_BOUND, SAFETY_BOUND))[:, None].expand_as(lr), keep)


def _check(name: str, threshold: float, *shapes: Tensor) -> None:
    CORRECTIONS.get(name)  # an unknown name: one ValueError listing the known ones
    if not (math.isfinite(threshold) and threshold > 1.0):
        raise ValueError(f"the correction threshold must be a finite number > 1, got {threshold}")
    if any(t.shape != shapes[0].shape or t.dim() != 2 for t in shapes):
        raise ValueError(f"old, engine log-probs and mask must share one [B, T] shape; got "
                         f"{', '.join(str(tuple(t.shape)) for t in shapes)}")


def correction_weights(name: str, old_logp: Tensor, engine_logp: Tensor, mask: Tensor,
                       threshold: float = 2.0) -> Tensor:
    """The detached float32 weights [B, T] correction ``name`` puts on each token's policy-gradient
    loss, from the trainer's old log-probs ``old_logp`` [B, T] and the engine's ``engine_logp`` [B, T]
    (0 on padding; 1 on real tokens for ``none``). ``threshold`` is C (> 1)."""
    _check(name, threshold, old_logp, engine_logp, mask)
    m = mask.bool()
    w = CORRECTIONS.get(name)(log_ratio(old_logp, engine_logp, m), m, math.log(threshold))
    return w.float().detach()


def mismatch_metrics(old_logp: Tensor, engine_logp: Tensor, mask: Tensor, name: str = "none",
                     threshold: float = 2.0) -> dict[str, float]:
    """How far the engine's log-probs are from the trainer's, over real response tokens only
    (verl's ``rollout_corr/`` names, without the prefix). Empty when no token is real.

    - ``kl``: mean of ``engine - old`` (the k1 estimate of KL(engine || trainer) on the engine's samples)
    - ``k3_kl``: mean of ``r - log r - 1`` with ``r = exp(old - engine)`` (>= 0, low variance)
    - ``log_ppl_diff``: mean over rows of (mean engine log-prob - mean trainer log-prob), i.e.
      log(trainer perplexity / engine perplexity); ``log_ppl_abs_diff`` its absolute value's mean
    - ``rollout_is_mean``, ``rollout_is_max``: the ratio before truncation (per token, or per
      sequence for the ``*_seq`` corrections)
    - ``rollout_is_ratio_fraction_high`` / ``_low``: share of those ratios above C / below 1/C
      (for ``tis_*`` the share truncated, for ``mis_*`` the share dropped)
    - ``rollout_rs_masked_fraction``: share of real tokens whose weight is 0 (``mis_*`` only, else 0)
    - ``tokens``, ``seqs``: how many real tokens / non-empty rows the numbers are over
    """
    _check(name, threshold, old_logp, engine_logp, mask)
    m = mask.bool()
    n_tok = int(m.sum())
    rows = m.any(dim=-1)
    n_seq = int(rows.sum())
    if n_tok == 0:
        return {}
    lr = log_ratio(old_logp, engine_logp, m)
    tok = lambda x: float(_zero(x, m).sum()) / n_tok  # noqa: E731 - mean over real tokens
    per_row = m.sum(dim=-1).clamp(min=1).double()
    row_diff = (-_zero(lr, m).sum(dim=-1) / per_row)[rows]  # mean engine - mean trainer, per non-empty row
    r_tok = torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    log_c = math.log(threshold)
    if seq_level(name):
        s = _seq_log_ratio(lr, m)[rows]
        ratio, share = torch.exp(s.clamp(-SAFETY_BOUND, SAFETY_BOUND)), lambda x: float(x.double().mean())
        high, low = s > log_c, s < -log_c
        ratio_max = float(ratio.max())
        ratio_mean = float(ratio.mean())
    else:
        share = lambda x: tok(x.double())  # noqa: E731
        high, low = lr > log_c, lr < -log_c
        ratio_mean = tok(r_tok)
        ratio_max = float(r_tok.masked_fill(~m, -math.inf).max())
    w = CORRECTIONS.get(name)(lr, m, log_c)
    return {
        "kl": tok(-lr),
        "k3_kl": tok(r_tok - lr - 1.0),
        "log_ppl_diff": float(row_diff.mean()),
        "log_ppl_abs_diff": float(row_diff.abs().mean()),
        "rollout_is_mean": ratio_mean,
        "rollout_is_max": ratio_max,
        "rollout_is_ratio_fraction_high": share(high),
        "rollout_is_ratio_fraction_low": share(low),
        "rollout_rs_masked_fraction": tok((w == 0).double()) if name in _MASKING else 0.0,
        "tokens": float(n_tok),
        "seqs": float(n_seq),
    }


def pad_lists(values: list[list[float]], device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Per-row lists of per-token numbers -> a right-padded float64 tensor [B, T] and its mask [B, T]
    (T = the longest list, at least 1); what the functions above take."""
    T = max([1] + [len(v) for v in values])
    x = torch.zeros((len(values), T), dtype=torch.float64)
    mask = torch.zeros((len(values), T), dtype=torch.bool)
    for b, v in enumerate(values):
        if v:
            x[b, : len(v)] = torch.tensor(v, dtype=torch.float64)
            mask[b, : len(v)] = True
    return x.to(device), mask.to(device)
