"""Optimiser state of a sharded worker group, saved per rank and loadable with any rank count.

A checkpoint's ``optim/<wg>.pt`` of a sharded group is a small record (``torch.save``, read with
``weights_only=True``)::

    {"shards": "<wg>.dcp", "ranks": N, "optimizer_steps": int, "skipped_steps": int}

and ``optim/<wg>.dcp/`` holds the AdamW state written by ``torch.distributed.checkpoint``: one
``.distcp`` file per rank with its shards, and ``.metadata``. The state is keyed by parameter name,
``{name: {"step", "exp_avg", "exp_avg_sq"}}``, so it does not depend on how the parameters were cut:
a group of M ranks (or one process, ``WorkerGroup``) reads it back through the same library, which
re-cuts every tensor for its own shards. Conversely a single-process checkpoint (``optimizer`` in
the record: torch's state dict by parameter index) loads into a sharded group: each full tensor is
cut into this rank's shard (:func:`load_plain_optimizer`). The weights are not part of this: a
checkpoint's model folder is always the consolidated HF folder, and every group loads it whole
before sharding it.
"""

from __future__ import annotations

import posixpath
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor

from drmas_bench.checkpoints.copies import node_copy
from drmas_bench.checkpoints.layout import is_url
from drmas_trainer.optim import AdapterOptimizers, CPUOffloadAdamW, local

__all__ = ["load_plain_optimizer", "load_sharded_optimizer", "save_sharded_optimizer"]

#: the per-parameter AdamW state that is saved (torch's names)
MOMENTS = ("exp_avg", "exp_avg_sq")


def _slots(opt: Any) -> list[list[tuple[Tensor, dict, Any, bool]]]:
    """Per inner optimiser, in its parameter order: (policy parameter, the state mapping, the key of
    that parameter's state in it, whether the state is a host-side local shard)."""
    if isinstance(opt, AdapterOptimizers):
        return [s for o in opt.optimizers.values() for s in _slots(o)]
    if isinstance(opt, CPUOffloadAdamW):
        return [[(p, opt.inner.state, q, True) for p, q in zip(opt.params, opt.host)]]
    return [[(p, opt.state, p, False) for g in opt.param_groups for p in g["params"]]]


def _names(wg: Any) -> dict[int, str]:
    return {id(p): n for n, p in wg.policy.named_parameters()}


def _like(p: Any, t: Tensor) -> Tensor:
    """``t`` (a local shard of ``p``'s layout) as a DTensor laid out like ``p``; ``t`` when ``p``
    is a plain tensor."""
    if not hasattr(p, "device_mesh"):
        return t
    return DTensor.from_local(t, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())


def save_sharded_optimizer(wg: Any, path: str) -> None:
    """Write ``path`` (the record) and its ``.dcp`` folder (module docstring); every rank calls it."""
    names = _names(wg)
    state: dict[str, Any] = {}
    for slots in _slots(wg.optimizer):
        for p, holder, key, _host in slots:
            st = holder.get(key)
            if not st:
                continue  # never stepped
            entry: dict[str, Any] = {"step": torch.as_tensor(st["step"], dtype=torch.float32).detach().cpu().reshape(())}
            for m in MOMENTS:
                v = st[m]
                entry[m] = v if hasattr(v, "device_mesh") else _like(p, v)
            state[names[id(p)]] = entry
    shards = Path(path).with_suffix(".dcp")
    dcp.save(state, checkpoint_id=str(shards))
    if wg.rank == 0:
        torch.save({"shards": shards.name, "ranks": wg.world, "optimizer_steps": wg.optimizer_steps,
                    "skipped_steps": wg.skipped_steps}, path)


def _install(wg: Any, state: dict[str, Any]) -> None:
    """Put ``{name: {step, exp_avg, exp_avg_sq}}`` into the group's optimiser(s); full (plain)
    tensors are cut into this rank's shard of the parameter first."""
    names = _names(wg)
    for slots in _slots(wg.optimizer):
        for p, holder, key, host in slots:
            st = state.get(names[id(p)])
            if st is None:
                continue
            new: dict[str, Tensor] = {"step": torch.as_tensor(st["step"], dtype=torch.float32).reshape(()).cpu()}
            for m in MOMENTS:
                v: Any = st[m]
                if hasattr(p, "device_mesh") and not hasattr(v, "device_mesh"):  # full -> this rank's shard
                    v = distribute_tensor(v.to(local(p).device, torch.float32), p.device_mesh, p.placements)  # type: ignore[attr-defined]
                new[m] = local(v).detach().to("cpu", torch.float32).clone() if host else (
                    v.detach().to(local(p).device, torch.float32))
            holder[key] = new


def shards_folder(wg: Any, path: str, record: dict[str, Any]) -> Path:
    """The ``.dcp`` folder that the record at ``path`` names: beside it, or, when ``path`` is a URL (a
    checkpoint root under fsspec), this process's own copy of it on this node."""
    if is_url(path):
        return node_copy(f"{posixpath.dirname(path)}/{record['shards']}", owner=getattr(wg, "_copy_owner", ""))
    return Path(path).parent / record["shards"]


def load_sharded_optimizer(wg: Any, path: str, record: dict[str, Any]) -> None:
    """Read the ``.dcp`` folder named by ``record`` (at ``path``, a local file or a URL) into ``wg``'s
    optimiser, whatever the rank count that wrote it (one process: read whole; every rank of a
    sharded group calls it)."""
    reader = dcp.FileSystemReader(str(shards_folder(wg, path, record)))
    saved = set(reader.read_metadata().state_dict_metadata)
    names = _names(wg)
    template: dict[str, Any] = {}
    for slots in _slots(wg.optimizer):
        for p, _holder, _key, _host in slots:
            n = names[id(p)]
            if f"{n}.exp_avg" in saved:
                template[n] = {"step": torch.zeros((), dtype=torch.float32),
                               **{m: torch.zeros_like(p, dtype=torch.float32) for m in MOMENTS}}
    single = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():  # one process reading shards is the intent, not a mistake to warn about
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(template, storage_reader=reader, no_dist=single)
    _install(wg, template)
    wg.optimizer_steps = int(record["optimizer_steps"])
    wg.skipped_steps = int(record["skipped_steps"])


def load_plain_optimizer(wg: Any, state: dict[str, Any]) -> None:
    """A single-process group's optimiser state dict (torch's, by parameter index; LoRA: one per
    adapter) into a sharded group: each full tensor cut into this rank's shard."""
    sds = [state[n] for n in wg.optimizer.optimizers] if isinstance(wg.optimizer, AdapterOptimizers) else [state]
    names = _names(wg)
    by_name: dict[str, dict[str, Tensor]] = {}
    for slots, sd in zip(_slots(wg.optimizer), sds):
        order = [i for g in sd["param_groups"] for i in g["params"]]
        for (p, _h, _k, _host), i in zip(slots, order):
            if i in sd["state"]:
                by_name[names[id(p)]] = sd["state"][i]
    _install(wg, by_name)
