"""``train --plan --gpus N``: the recipe's worker groups laid out on N GPUs, or a refusal.

The plan never lays out more GPUs than it was given. Where the recipe's layout can be re-planned on
N GPUs by changing how many ranks each group has (``fsdp.ranks``) or how many groups share a GPU
(``ray.gpus_per_worker``), the plan is made under those settings and says which ``--set`` trains
it; where it cannot (``fsdp.layout: separate`` with fewer GPUs than groups), it refuses in one line
naming the setting that would fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from drmas_bench.types import UserError

if TYPE_CHECKING:
    from drmas_trainer.config.train import TrainConfig


@dataclass
class GpuLayout:
    """The settings a plan on ``gpus`` GPUs uses, and what it tells the user about them."""

    gpus: int | None  # --gpus (None: the recipe's own layout)
    settings: dict[str, Any] = field(default_factory=dict)  # --set KEY=VALUE the plan applied
    note: str = ""  # one line: how the layout was chosen

    def apply(self, cfg: "TrainConfig") -> "TrainConfig":
        """``cfg`` with :attr:`settings` applied (a copy; ``cfg`` is left as it is)."""
        fsdp = {k.split(".", 1)[1]: v for k, v in self.settings.items() if k.startswith("fsdp.")}
        ray = {k.split(".", 1)[1]: v for k, v in self.settings.items() if k.startswith("ray.")}
        return cfg.model_copy(update={"fsdp": cfg.fsdp.model_copy(update=fsdp), "ray": cfg.ray.model_copy(update=ray)})


def _sets(settings: dict[str, Any]) -> str:
    return " ".join(f"--set {k}={v:g}" if isinstance(v, float) else f"--set {k}={v}" for k, v in settings.items())


def gpu_layout(cfg: "TrainConfig", n_groups: int, gpus: int | None, *, local: bool = False) -> GpuLayout:
    """How ``cfg``'s ``n_groups`` worker groups go on ``gpus`` GPUs (module docstring): colocated,
    every group sharded over all N (``fsdp.ranks=N``), or on one GPU unsharded, the groups sharing
    it (``ray.gpus_per_worker=1/groups``); separate, ``N // groups`` ranks each. ``local``: every
    group in this process on one GPU (``--local``)."""
    if gpus is None:
        return GpuLayout(None)
    if gpus < 1:
        raise UserError(f"--gpus must be a whole number >= 1, got {gpus}")
    ranks, layout = cfg.fsdp.ranks, cfg.fsdp.layout
    was = f"fsdp.ranks {ranks}" + (f", layout {layout}" if layout != "colocated" else "")
    settings: dict[str, Any] = {}
    if local:
        if gpus > 1:
            raise UserError(f"--gpus {gpus} with --local: --local runs every worker group in this process on one "
                            f"GPU; plan without --local (Ray actors) or with --gpus 1")
        note = "--gpus 1: --local runs every worker group in this process on one GPU"
        if ranks != 1:
            settings["fsdp.ranks"] = 1
    elif layout == "separate":
        if gpus < n_groups:
            raise UserError(f"--gpus {gpus}: fsdp.layout separate gives each of the {n_groups} worker groups GPUs of "
                            f"its own ({n_groups} at least); --set fsdp.layout=colocated fits them on {gpus}")
        per = gpus // n_groups
        if per != ranks:
            settings["fsdp.ranks"] = per
        if per == 1 and cfg.ray.gpus_per_worker != 1:  # unsharded: one Ray actor per GPU
            settings["ray.gpus_per_worker"] = 1.0
        used = per * n_groups
        note = f"--gpus {gpus}: {n_groups} groups x {per} rank(s) of their own" + \
            (f", {used} of the {gpus} GPUs (separate groups split them evenly)" if used != gpus else "")
    elif gpus >= 2:
        if gpus != ranks:
            settings["fsdp.ranks"] = gpus
        note = f"--gpus {gpus}: every group sharded over the {gpus} GPUs (fsdp.ranks {gpus}, colocated)"
    else:
        if ranks != 1:
            settings["fsdp.ranks"] = 1
        per_gpu = math.floor(1 / cfg.ray.gpus_per_worker + 1e-9) if cfg.ray.gpus_per_worker > 0 else n_groups
        if per_gpu < n_groups:  # Ray actors of gpus_per_worker each: all of them on the one GPU
            settings["ray.gpus_per_worker"] = round(1 / n_groups, 4)
        note = "--gpus 1: every group unsharded on the one GPU" + (", sharing it" if n_groups > 1 else "")
    if settings:
        note += f"; {was} re-planned: train it with {_sets(settings)}"
    return GpuLayout(gpus, settings, note)
