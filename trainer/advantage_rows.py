"""What an advantage estimator reads and returns (``drmas_trainer.advantages``): a batch's rows with
their ids (:class:`Rows`), the pools they can be compared against (:class:`Grouping`: by prompt, by
prompt and agent, by trajectory cell), a pool's statistics broadcast to rows (:class:`Moments`), and
an estimator's answer (:class:`Terms`). Pure tensor code; ``advantages`` re-exports the four."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from drmas_trainer.segments import dense_ids as _dense_ids
from drmas_trainer.segments import segment_moments as _segment_moments
from drmas_trainer.segments import take as _take


@dataclass(frozen=True)
class Moments:
    """One pool's statistics, broadcast to rows.

    Attributes:
        mean: [N] float64, the mean of the pool the row is compared against.
        std: [N] float64, its unbiased std (0 where ``n == 1``).
        n: [N] int64, the pool size (the single-value rule applies where ``n == 1``).
    """

    mean: Tensor
    std: Tensor
    n: Tensor


@dataclass(frozen=True)
class Terms:
    """What an estimator returns: ``A = (x - mean_from.mean) / (std_from.std + eps)``.

    Attributes:
        x: [N] float64 numerator per row.
        mean_from: pool whose mean is subtracted.
        std_from: pool whose std divides (ignored when ``norm_by_std=False``).
    """

    x: Tensor
    mean_from: Moments
    std_from: Moments


class Grouping:
    """The pools of one group index (uid, or (uid, agent)), each computed at most once.

    Attributes:
        idx: [N] dense group index per row.
        n_groups: the number of groups.
    """

    def __init__(self, rows: "Rows", idx: Tensor, n_groups: int, cells_are_trajectories: bool = False) -> None:
        self._rows = rows
        self.idx = idx
        self.n_groups = n_groups
        self._cells_are_trajectories = cells_are_trajectories  # the uid index: skip a densifying pass

    def _broadcast(self, values: Tensor, seg: Tensor) -> Moments:
        """Moments of ``values`` (one per segment member) pooled per group, broadcast to rows."""
        mean, std, n = _segment_moments(values, seg, self.n_groups)
        return Moments(_take(mean, self.idx), _take(std, self.idx), _take(n, self.idx))

    @cached_property
    def row_pool(self) -> Moments:
        """Moments of every row score of the row's group (action-weighted)."""
        return self._broadcast(self._rows.score, self.idx)

    @cached_property
    def cells(self) -> tuple[Tensor, int, Tensor]:
        """(cell index per row [N], number of cells C, group of each cell [C]).

        A cell is the rows of one group in one trajectory. Trajectory ids must be unique across
        the batch (checked here), so a cell of the uid index is exactly one trajectory.
        """
        traj_uid = self._rows.traj_uid
        t, n_traj = self._rows.traj_idx
        if self._cells_are_trajectories:
            return t, n_traj, traj_uid
        cell, n_cell = _dense_ids(self.idx * n_traj + t)
        group = torch.zeros(n_cell, dtype=torch.int64).index_copy_(0, cell, self.idx)
        return cell, n_cell, group

    @cached_property
    def cell_mean(self) -> Tensor:
        """[C] the cell averages (mean score of the group's rows in that trajectory)."""
        cell, n_cell, _ = self.cells
        mean, _, _ = _segment_moments(self._rows.score, cell, n_cell)
        return mean

    @cached_property
    def cell_value(self) -> Tensor:
        """[N] the row's cell average c_i (the "traj" numerator)."""
        return _take(self.cell_mean, self.cells[0])

    @cached_property
    def cell_pool(self) -> Moments:
        """Moments of the cell averages of the row's group, one value per cell."""
        return self._broadcast(self.cell_mean, self.cells[2])

    @cached_property
    def first_row_pool(self) -> Moments:
        """Moments of each cell's first-row score (lowest row index in the batch) over the row's group."""
        cell, n_cell, group = self.cells
        n = self._rows.n_rows
        first = torch.full((n_cell,), n, dtype=torch.int64)
        first.scatter_reduce_(0, cell, torch.arange(n), reduce="amin", include_self=True)
        return self._broadcast(_take(self._rows.score, first), group)


class Rows:
    """A batch of rows with lazily computed groupings and pools (all on CPU, float64).

    Each grouping and pool is computed at most once per call, and only if an estimator asks.

    Attributes:
        score: [N] float64 row scores ``x_i``.
        uid, traj, agent: [N] int64 raw ids.
        group_by_agent: the reference's group index switch (None: not given; the estimators that
            read :attr:`group` then refuse to run).
    """

    def __init__(self, score: Tensor, uid: Tensor, traj: Tensor, agent: Tensor,
                 group_by_agent: bool | None = None) -> None:
        self.score = score
        self.uid = uid
        self.traj = traj
        self.agent = agent
        self.group_by_agent = group_by_agent
        self.n_rows = int(score.numel())

    @cached_property
    def traj_idx(self) -> tuple[Tensor, int]:
        """Dense trajectory index per row and the number of trajectories."""
        return _dense_ids(self.traj)

    @cached_property
    def by_uid(self) -> Grouping:
        """Group index = the prompt group (all agents together)."""
        return Grouping(self, *_dense_ids(self.uid), cells_are_trajectories=True)

    @cached_property
    def by_uid_agent(self) -> Grouping:
        """Group index = the (prompt group, agent) pair."""
        u = self.by_uid.idx
        a, n_agents = _dense_ids(self.agent)
        return Grouping(self, *_dense_ids(u * n_agents + a))

    @property
    def group(self) -> Grouping:
        """The reference's group index: ``uid_agent`` if group_by_agent, else ``uid``."""
        if self.group_by_agent is None:
            raise ValueError("this estimator takes its group index from group_by_agent (the reference's "
                             "group_by_agent_id): pass True (uid and agent) or False (uid)")
        return self.by_uid_agent if self.group_by_agent else self.by_uid

    @cached_property
    def traj_uid(self) -> Tensor:
        """[n_traj] dense uid index of each trajectory; a trajectory spanning two uids is an error
        (trajectory ids must be globally unique)."""
        t, n_traj = self.traj_idx
        u = self.by_uid.idx
        lo = torch.full((n_traj,), torch.iinfo(torch.int64).max, dtype=torch.int64)
        hi = torch.full((n_traj,), -1, dtype=torch.int64)
        lo.scatter_reduce_(0, t, u, reduce="amin", include_self=True)
        hi.scatter_reduce_(0, t, u, reduce="amax", include_self=True)
        if not torch.equal(lo, hi):
            bad = int(torch.unique(self.traj)[(lo != hi).nonzero()[0, 0]])
            raise ValueError(f"trajectory id {bad} appears under more than one uid; trajectory ids must be globally unique")
        return lo
