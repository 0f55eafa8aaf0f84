"""Sharded worker groups as Ray actors: N rank actors per group in a placement group, driven from
the controller as one group with the async API of :class:`~drmas_trainer.worker.WorkerGroup`.

    handles = spawn_sharded(cfg, plan, paths, kwargs)        # {group: ShardedRayHandle}
    await asyncio.gather(*(h.ready(timeout_s) for h in handles.values()))
    await handles["solver"].update(rows, ...)                # every rank gets the rows, rank 0's metrics back

**Placement** (``fsdp.layout``). ``colocated`` (the reference's): one placement group of ``ranks``
bundles of one GPU; rank i of every group sits in bundle i and reserves ``1 / groups`` of its GPU,
so each GPU holds a shard of every group and one engine per group. Colocated groups take turns in
their updates, old-log-prob passes and warm starts (one lock for all of them: the plan's "update"
phase is one group's). ``separate``: a placement group of ``ranks`` one-GPU bundles per group,
groups on disjoint GPUs, updating at the same time. On a CPU machine the GPUs are Ray's logical
ones (``ray.num_gpus``), the ranks compute on CPU and talk over gloo.

**Calls.** Collective methods (``update``, ``score_rows``, ``sft``, ``sync_weights``, ``save``,
``load_optimizer``, ``start_engine``) go to every rank at once with the same arguments; the ranks'
results agree and rank 0's is returned. ``generate`` is not collective: every rank has its own
rollout engine (a full copy of the weights, refreshed bucket by bucket after each update), and a
call's requests are spread over the ranks' engines.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from drmas_bench.pool.ray_pool import check_demand
from drmas_bench.types import UserError
from drmas_trainer.ray_workers import RayWorkerHandle, WorkerCalls, require_ray
from drmas_trainer.rows import split

__all__ = ["ShardedRayHandle", "sharded_demand", "spawn_sharded"]


def sharded_demand(n_groups: int, ranks: int, layout: str) -> dict[str, float]:
    """GPUs the sharded groups reserve together."""
    return {"GPU": float(ranks if layout == "colocated" else ranks * n_groups)}


class ShardedRayHandle(WorkerCalls):
    """Controller-side handle of one sharded worker group (module docstring)."""

    def __init__(self, name: str, ranks: list[RayWorkerHandle], turn: asyncio.Lock | None,
                 setups: list[Any]) -> None:
        self.name = name
        self._setups = setups  # each rank's (args, kwargs) for its WorkerActor.setup
        self.ranks = ranks
        self._turn = turn  # colocated groups share one
        self._rr = itertools.count()

    async def ready(self, timeout_s: float | None = 60.0) -> None:
        """Wait for every rank to be placed, then build the group in all of them (rank 0 names the
        rendezvous address)."""
        await asyncio.gather(*(r.ready(timeout_s) for r in self.ranks))  # placed, setup deferred
        address = await self.ranks[0]._remote(self.ranks[0].actor.rendezvous)
        await asyncio.gather(*(r._remote(r.actor.setup, *args, **{**kwargs, "init_method": address})
                               for r, (args, kwargs) in zip(self.ranks, self._setups)))

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` on every rank at once, rank 0's result back (colocated groups take turns in the
        collective passes)."""
        async def go() -> Any:
            got = await asyncio.gather(*(r._call(method, *args, **kwargs) for r in self.ranks))
            return got[0]

        if self._turn is not None and method in ("update", "score_rows", "sft"):
            async with self._turn:
                return await go()
        return await go()

    async def generate(self, requests: list) -> list:
        n = len(self.ranks)
        if len(requests) < n:  # a small call: the next engine in turn
            return await self.ranks[next(self._rr) % n]._call("generate", requests)
        parts = split(list(requests), n)
        got = await asyncio.gather(*(r._call("generate", p) for r, p in zip(self.ranks, parts)))
        return [c for part in got for c in part]

    async def info(self) -> dict[str, Any]:
        infos = await asyncio.gather(*(r.info() for r in self.ranks))
        return {**infos[0], "ranks": infos}

    async def close(self) -> None:
        await asyncio.gather(*(r.close() for r in self.ranks), return_exceptions=True)


def spawn_sharded(cfg: Any, plan: dict[str, Any], paths: dict[str, str], kwargs: dict[str, dict[str, Any]]
                  ) -> dict[str, ShardedRayHandle]:
    """One :class:`ShardedRayHandle` per group of ``plan`` (``fsdp.ranks`` rank actors each, placed
    per ``fsdp.layout``); ``paths``/``kwargs``: each group's model path and WorkerGroup options.
    The cluster's GPUs are checked first (one line when too few)."""
    ray = require_ray()
    ranks, layout = cfg.fsdp.ranks, cfg.fsdp.layout
    check_demand(sharded_demand(len(plan), ranks, layout), "this training run",
                 f"{len(plan)} worker group(s) ({', '.join(plan)}) x fsdp.ranks={ranks}, layout {layout}; to fit: "
                 f"fewer fsdp.ranks, fsdp.layout=colocated, or ray.num_gpus=N logical GPUs on a CPU machine")
    bundles = [{"GPU": 1.0} for _ in range(ranks)]
    shared_pg = ray.util.placement_group(bundles, strategy="PACK") if layout == "colocated" else None
    turn = asyncio.Lock() if layout == "colocated" and len(plan) > 1 else None
    out: dict[str, ShardedRayHandle] = {}
    for name, g in plan.items():
        pg = shared_pg or ray.util.placement_group(bundles, strategy="PACK")
        gpus = 1.0 / len(plan) if layout == "colocated" else 1.0
        extra = dict(kwargs[name], world=ranks, backend=cfg.fsdp.backend,
                     reshard_after_forward=cfg.fsdp.reshard_after_forward)
        handles = []
        setups = []
        for r in range(ranks):
            h = RayWorkerHandle.spawn(name, g.agents, g.settings, paths[name], gpus=gpus, bundle=(pg, r),
                                      **extra, rank=r)
            setups.append(h._setup)
            h._setup = None  # built by ShardedRayHandle.ready, once rank 0's address is known
            handles.append(h)
        out[name] = ShardedRayHandle(name, handles, turn, setups)
    return out


def check_sharded(cfg: Any, use_ray: bool) -> None:
    """Sharded groups run as Ray actors: a one-line error otherwise."""
    if cfg.fsdp.ranks > 1 and not use_ray:
        raise UserError(f"fsdp.ranks {cfg.fsdp.ranks}: sharded worker groups run their ranks as Ray actors; "
                        f"train with --ray (on a CPU machine with --set ray.num_gpus={cfg.fsdp.ranks})")
