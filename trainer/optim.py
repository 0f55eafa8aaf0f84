"""A worker group's optimiser: AdamW in float32, its 8-bit variant, or AdamW with its state in
host memory (``optimizer`` / ``optimizer_offload`` of a worker group's settings).

GPU memory per parameter: 4 (weights) + 4 (grads) + 8 (AdamW; 2 with ``adamw_8bit``, 0 with
``optimizer_offload: cpu``) bytes, plus activations. Weights and AdamW state stay float32 even
when the group computes in bf16: an lr-1e-6 update would round away in bf16 weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from drmas_bench.types import UserError
from drmas_trainer.config.train import OFFLOADS, OPTIMIZERS

__all__ = ["AdapterOptimizers", "CPUOffloadAdamW", "local", "make_optimizer", "release_cached_memory"]


def local(t: Tensor) -> Tensor:
    """This rank's shard of ``t`` (a DTensor of a sharded group, ``drmas_trainer.fsdp.worker``), or
    ``t`` itself: AdamW, clipping and norms are elementwise or sums, so they can run on shards."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def release_cached_memory(device: torch.device | str) -> None:
    """Give the CUDA caching allocator's free blocks back (between the update and the engine's
    wake, so the engine finds the memory the update freed); a no-op on CPU."""
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()


class CPUOffloadAdamW:
    """AdamW whose state (and an fp32 master copy of the parameters) lives in host memory: ``step``
    copies the gradients to the host, steps there, and copies the new values back. The GPU then
    holds only weights and gradients (8 bytes per parameter instead of 16). Sharded parameters
    (DTensors): each rank keeps and steps its own shard only (AdamW is elementwise). Same interface as a
    ``torch.optim`` optimiser as far as the worker group uses it (``param_groups``, ``step``,
    ``zero_grad``, ``state_dict``, ``load_state_dict``)."""

    def __init__(self, params: list[Tensor], **adamw: Any) -> None:
        self.params = list(params)
        self.host = [torch.nn.Parameter(local(p).detach().to("cpu", torch.float32, copy=True)) for p in self.params]
        self.inner = torch.optim.AdamW(self.host, **adamw)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        self.inner.zero_grad(set_to_none=True)

    @torch.no_grad()
    def step(self) -> None:
        for p, q in zip(self.params, self.host):
            q.grad = None if p.grad is None else local(p.grad).detach().to("cpu", torch.float32)
        self.inner.step()
        for p, q in zip(self.params, self.host):
            if q.grad is not None:
                local(p).copy_(q, non_blocking=False)
                q.grad = None

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)
        with torch.no_grad():  # the checkpoint's weights were loaded into the policy: refresh the master copy
            for p, q in zip(self.params, self.host):
                q.copy_(local(p).detach().to("cpu", torch.float32))


def make_optimizer(params: list[Tensor], *, kind: str = "adamw", offload: str = "none", lr: float,
                   betas: tuple[float, float], weight_decay: float) -> Any:
    """A worker group's optimiser.

    Options: ``kind`` ``adamw`` (torch AdamW, fp32 states: 8 bytes per parameter) or ``adamw_8bit``
    (bitsandbytes' 8-bit AdamW, 2 bytes per parameter; CUDA only, bitsandbytes is optional and not
    a dependency); ``offload`` ``none`` or ``cpu`` (:class:`CPUOffloadAdamW`, adamw only)."""
    kw = {"lr": lr, "betas": betas, "weight_decay": weight_decay}
    if kind == "adamw_8bit":
        if offload != "none":
            raise UserError("optimizer adamw_8bit cannot be combined with optimizer_offload; pick one")
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise UserError("optimizer adamw_8bit needs the bitsandbytes package: pip install bitsandbytes") from None
        if not params or params[0].device.type != "cuda":
            raise UserError("optimizer adamw_8bit needs the policy on a CUDA device; use adamw on CPU")
        return bnb.optim.AdamW8bit(params, **kw)
    if kind not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {kind!r}; choose one of {', '.join(OPTIMIZERS)}")
    if offload not in OFFLOADS:
        raise UserError(f"unknown optimizer_offload {offload!r}; choose one of {', '.join(OFFLOADS)}")
    if offload == "cpu":
        return CPUOffloadAdamW(params, **kw)
    return torch.optim.AdamW(params, **kw)


class AdapterOptimizers:
    """One optimiser per LoRA adapter of a worker group (``shared_base``: one per agent), behind the
    interface the worker group uses for its single optimiser. Each adapter keeps its own state and
    its own lr, warm-up, betas and weight decay: every param group carries ``base_lr`` and
    ``warmup_steps`` (the warm-up in ``WorkerGroup`` reads them), so an agent's lr never leaks into
    another's. ``step`` steps every optimiser; one whose adapter got no gradient (no rows of its
    agents in the mini-batch) changes nothing, as torch's AdamW skips parameters without a gradient.
    The state dict is ``{adapter: that optimiser's state dict}``."""

    def __init__(self, optimizers: dict[str, Any], settings: dict[str, Any]) -> None:
        self.optimizers = dict(optimizers)
        for name, opt in self.optimizers.items():
            for g in opt.param_groups:
                g["adapter"] = name
                g["base_lr"] = float(settings[name].lr)
                g["warmup_steps"] = int(settings[name].lr_warmup_steps)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = sorted(set(self.optimizers) - set(state))
        if missing:
            raise UserError(f"the checkpoint's optimiser state has no adapter(s) {', '.join(missing)}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])
            for g in opt.param_groups:  # torch restores the saved groups' keys; keep today's settings
                g["adapter"] = name


def make_adapter_optimizers(params: dict[str, list[Tensor]], settings: dict[str, Any], *, kind: str = "adamw",
                            offload: str = "none") -> AdapterOptimizers:
    """:class:`AdapterOptimizers` for adapter name -> its parameters, each optimiser made by
    :func:`make_optimizer` from that adapter's settings (lr, betas, weight decay)."""
    return AdapterOptimizers({name: make_optimizer(ps, kind=kind, offload=offload, lr=settings[name].lr,
                                                   betas=tuple(settings[name].betas),
                                                   weight_decay=settings[name].weight_decay)
                              for name, ps in params.items()}, settings)
