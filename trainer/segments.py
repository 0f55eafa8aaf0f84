"""Segment statistics on flat tensors: dense ids, per-segment moments, gathers. Shared by the
advantage estimators (advantages.py) and the per-step advantage metrics (adv_metrics.py).

Everything here runs on the CPU in float64 without a Python loop over rows or segments.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["dense_ids", "segment_moments", "take"]


def take(values: Tensor, index: Tensor) -> Tensor:
    """``values[index]`` for 1-D tensors (``index_select``: several times faster than advanced indexing)."""
    return values.index_select(0, index)


def dense_ids(ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer ids to 0..G-1 in sorted order; returns (index per row [N], G).

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
        return take(rank, offset), int(rank[-1]) + 1
    uniq, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    return inverse, int(uniq.numel())


def segment_moments(x: Tensor, seg: Tensor, n_seg: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-segment (mean [S], unbiased std [S], count [S]) of float64 values ``x`` [N] with segment ids ``seg`` [N].

    Two passes. The first pass sums ``x - shift`` where ``shift`` is the segment's maximum (a
    member of the segment), so a segment of equal values has mean exactly equal to them and std
    exactly 0. Segments of size 1 get std 0 (a placeholder: the single-value rule replaces it).
    Every segment id in ``0..n_seg-1`` must occur (as produced by :func:`dense_ids`).
    """
    count = torch.zeros(n_seg, dtype=torch.int64).index_add_(0, seg, torch.ones_like(seg))
    n = count.to(torch.float64)
    shift = torch.full((n_seg,), -torch.inf, dtype=torch.float64)
    shift.scatter_reduce_(0, seg, x, reduce="amax", include_self=True)
    s1 = torch.zeros(n_seg, dtype=torch.float64).index_add_(0, seg, x - take(shift, seg))
    mean = shift + s1 / n
    dev = x - take(mean, seg)
    ss = torch.zeros(n_seg, dtype=torch.float64).index_add_(0, seg, dev * dev)
    std = torch.sqrt(ss / (n - 1.0).clamp(min=1.0))
    return mean, std, count
