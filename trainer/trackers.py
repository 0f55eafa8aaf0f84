"""Where a run's step metrics go besides ``RUN/metrics.jsonl`` (which is always written).

Config ``tracker`` (one of :data:`TRACKERS`):

    none          only metrics.jsonl (the default)
    tensorboard   TensorBoard event files in ``RUN/tb`` (extra: ``pip install drmas-bench[tensorboard]``)
    wandb         a Weights & Biases run named after the run directory; its id is derived from the
                  directory, so ``--resume`` continues the same W&B run. Project from
                  ``$WANDB_PROJECT`` (default ``drmas-bench``); offline with ``WANDB_MODE=offline``
                  (extra: ``pip install drmas-bench[wandb]``)

A requested tracker whose package is missing is an error before the run starts, never a silent
no-op. Only finite numbers are sent (the keys are drmas_trainer.metric_names); ``step`` is the x axis.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas_bench.types import UserError


@dataclass(frozen=True)
class TrackerKind:
    name: str
    module: str | None  # the package that must be importable
    extra: str | None  # the drmas-bench extra that installs it


TRACKERS: dict[str, TrackerKind] = {
    "none": TrackerKind("none", None, None),
    "tensorboard": TrackerKind("tensorboard", "tensorboard", "tensorboard"),
    "wandb": TrackerKind("wandb", "wandb", "wandb"),
}


def check_tracker(name: str) -> TrackerKind:
    """The tracker ``name``; UserError (one line) when unknown or when its package is not installed."""
    kind = TRACKERS.get(name)
    if kind is None:
        raise UserError(f"unknown tracker {name!r}; use one of: {', '.join(TRACKERS)}")
    if kind.module and importlib.util.find_spec(kind.module) is None:
        raise UserError(f"tracker {name} needs the {kind.module} package, which is not installed: "
                        f"pip install 'drmas-bench[{kind.extra}]' (or set tracker: none)")
    return kind


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers, ``step`` and booleans left out."""
    return {k: float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step" and math.isfinite(v)}


class Tracker:
    """The ``none`` tracker; the others override :meth:`log` and :meth:`close`."""

    def log(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker(Tracker):
    def __init__(self, run: Path, keep_until: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # events of steps after the checkpoint being resumed are purged, like metrics.jsonl's lines
        self.writer = SummaryWriter(str(run / "tb"), purge_step=keep_until + 1)

    def log(self, record: dict[str, Any]) -> None:
        for k, v in scalars(record).items():
            self.writer.add_scalar(k, v, record["step"])

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    def __init__(self, run: Path, config: dict[str, Any]) -> None:
        import wandb

        run_id = hashlib.sha256(str(run.resolve()).encode()).hexdigest()[:16]
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "drmas-bench"), name=run.name, id=run_id,
                              resume="allow", dir=str(run), config=config)

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()


def make_tracker(name: str, run: Path, keep_until: int = 0, config: dict[str, Any] | None = None) -> Tracker:
    """Open tracker ``name`` for run directory ``run`` (checked with :func:`check_tracker` first)."""
    kind = check_tracker(name)
    if kind.name == "tensorboard":
        return TensorBoardTracker(run, keep_until)
    if kind.name == "wandb":
        return WandbTracker(run, config or {})
    return Tracker()


__all__ = ["TRACKERS", "Tracker", "TrackerKind", "check_tracker", "make_tracker", "scalars"]
