"""What a worker group trains on: the :class:`Row` (one agent call), the policy-loss settings, and
the small pure helpers of the update (micro-batching, splitting, metric accumulation) that the
single-process group (``drmas_trainer.worker``) and the sharded one (``drmas_trainer.fsdp.worker``)
share.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["Acc", "LossSettings", "Row", "chunks", "row_weights", "split"]


@dataclass
class Row:
    """One training row (one agent call) as a worker group sees it."""

    agent: str
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]  # one per response token (rollout policy, temperature 1)
    advantage: float
    # --- rollout correction and the token check (trainer.py fills them; None = not used) ---
    engine_logprobs: list[float] | None = None  # the engine's, kept when old_logprobs were recomputed
    is_weights: list[float] | None = None  # rollout-correction weight of each response token (None: all 1)
    text: str | None = None  # the completion's text, what the workflow and grader used (token check)


@dataclass
class LossSettings:
    """The policy-loss options of ``drmas_trainer.losses.policy_loss`` (None = the mode's default)."""

    mode: str = "ppo"
    clip_low: float | None = None
    clip_high: float | None = None
    dual_clip: float | None = 3.0
    agg: str | None = None
    entropy_coef: float = 0.0

    @property
    def token_level(self) -> bool:
        agg = self.agg or ("token-mean" if self.mode == "ppo" else "seq-mean-token-mean")
        return agg == "token-mean"


def row_weights(rows: list[Row], like: Tensor) -> Tensor | None:
    """The rows' rollout-correction weights as a [B, T] tensor like ``like`` (None: no row has any)."""
    if all(r.is_weights is None for r in rows):
        return None
    w = torch.ones_like(like, dtype=torch.float32)
    T = like.shape[1]
    for b, r in enumerate(rows):
        if r.is_weights is not None:
            w[b, : len(r.is_weights[:T])] = torch.tensor(r.is_weights[:T], dtype=torch.float32)
    return w


def chunks(items: list, size: int) -> list[list]:
    return [items[i: i + size] for i in range(0, len(items), max(1, size))]


def split(items: list, parts: int) -> list[list]:
    """``items`` in ``parts`` contiguous, nearly equal, non-empty pieces."""
    parts = max(1, min(parts, len(items)))
    q, r = divmod(len(items), parts)
    out, i = [], 0
    for k in range(parts):
        n = q + (1 if k < r else 0)
        out.append(items[i: i + n])
        i += n
    return out


@dataclass
class Acc:
    """Weighted running sums of loss metrics over micro-batches."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    maxes: dict[str, float] = field(default_factory=dict)

    def add(self, metrics: dict[str, float], weight: float) -> None:
        for k, v in metrics.items():
            if k == "ratio_max":
                self.maxes[k] = max(self.maxes.get(k, -math.inf), v)
            else:
                self.sums[k] += weight * v
