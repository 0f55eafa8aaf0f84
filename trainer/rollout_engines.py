"""The worker groups' rollout engines during training: all awake, or pooled under a memory budget.

    engines = await RolloutEngines.start(cfg, workers, infos, use_ray)
    runtime = TeamRuntime(team, engines.views(), sampling)        # what the workflows call
    await engines.before_rollout(); ...rollouts...; await engines.after_rollout()
    ...old log-probs, update...
    await engines.after_update()                                   # awake: sync now; pooled: at the next wake

**awake** (``rollout.engines: awake``): every worker group's engine stays awake through the rollouts
and gets the new weights right after its update (``sleep_engine`` may still release it during the
update). Engines on one GPU must fit it together.

**pooled**: per GPU, a ``LocalPool`` adopts the groups' engines (``drmas_bench.pool.Adopted``: the
engine stays in its worker group, in this process or its Ray actor, so weights never travel between
actors) and keeps awake what the budget allows: when a group's requests come and its engine does
not fit, the least recently used idle engine goes to sleep (weights and KV cache released) and this
one wakes (``drmas_bench.pool.policy``). After the rollouts the pool holds every engine asleep for
the old log-probs and the update. The first wake in the next step syncs the new weights
(``WorkerGroup.engine_wake``: an update marks the engine stale); a later wake in the same step syncs
only an engine whose sleep dropped its weights (SGLang releasing them). The reference wakes its
engine and syncs the weights for every generate call of its lockstep loop; the step's metrics count
both (``rollout/weight_syncs`` against ``rollout/reference_syncs``).

**auto** (default) is pooled when the budget says the engines of some GPU do not all fit at once,
else awake: a run whose engines fit keeps today's behaviour and costs no wake, and one that does not
fit runs instead of running out of memory.

**The budget** per GPU: ``rollout.engines_awake`` (engines, times the largest footprint),
``rollout.engine_budget_gib``, else on CUDA the memory plan's (:func:`planned_budget`: the GPU less
what stays resident during rollouts: weights, optimiser states, process overhead; each engine booked
at the plan's figure), else none (CPU: nothing to budget, so auto means awake). The GPUs are the
groups' Ray GPU ids (groups with the same ids share a pool); in process every group is on one.
A sharded group (``fsdp.ranks`` > 1) is one engine to the pool: its handle sleeps and wakes every
rank's engine at once, so a stale group syncs on all ranks together (the sync is a collective);
colocated groups (a rank of each on every GPU) share one pool whose budget is one GPU's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

from drmas_bench.pool import Adopted, LocalPool
from drmas_bench.pool.policy import fmt_bytes
from drmas_bench.types import Trajectory, UserError
from drmas_trainer import metric_names
from drmas_trainer.forecast.memory import GIB, memory_plan
from drmas_trainer.forecast.shapes import model_shape

logger = logging.getLogger(__name__)

AWAKE, POOLED = "awake", "pooled"


@dataclass(frozen=True)
class Budget:
    """The rollout budget of each GPU's engines: ``bytes``, or ``models`` engines (times the largest
    footprint), or neither (none); ``footprints``: the bytes booked per worker group (``None``: what
    each engine reports); ``source``: where it came from, for the log."""

    bytes: int | None = None
    models: float | None = None
    footprints: dict[str, int] | None = None
    source: str = ""


def configured_budget(rollout: Any) -> Budget | None:
    """The budget the recipe gives (``rollout.engines_awake`` / ``rollout.engine_budget_gib``), else None."""
    if rollout.engines_awake is not None:
        return Budget(models=float(rollout.engines_awake), source=f"rollout.engines_awake {rollout.engines_awake}")
    if rollout.engine_budget_gib is not None:
        return Budget(bytes=int(rollout.engine_budget_gib * GIB), source=f"rollout.engine_budget_gib {rollout.engine_budget_gib:g}")
    return None


def budget_from_plan(plan: Any) -> Budget:
    """A memory plan's (``drmas_trainer.forecast.memory.MemoryPlan``) rollout budget: its per-GPU
    ``rollouts[gpu].budget`` (the GPU less the training state, other processes and one sync bucket),
    the smallest over the GPUs, each engine booked at the plan's figure (weights + KV cache, or the
    engine's static share)."""
    return Budget(bytes=min(r.budget for r in plan.rollouts), footprints={m.name: int(m.engine) for m in plan.groups},
                  source=f"memory plan: {fmt_bytes(plan.gpu_bytes)} GPU less the resident states, other "
                         "processes and one sync bucket")


def planned_budget(cfg: Any, plan: dict[str, Any], use_ray: bool) -> Budget:
    """The memory plan's budget on this machine's GPU (none without CUDA, or for a model the plan
    cannot size): :func:`budget_from_plan` of ``drmas_trainer.forecast.memory``'s plan."""
    import torch

    if not torch.cuda.is_available():
        return Budget(source="no CUDA device: nothing to budget")
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / GIB
    try:
        shapes = {n: model_shape(str(g.settings.model)) for n, g in plan.items()}
        return budget_from_plan(memory_plan(cfg, plan, shapes, gpu_gib=gpu_gib, use_ray=use_ray))
    except UserError as e:
        return Budget(source=f"no memory plan ({e})")


def gpu_sets(infos: Iterable[dict[str, Any]], use_ray: bool) -> list[list[str]]:
    """The worker groups that share a GPU: in process all of them; as Ray actors those with the same
    ``ray_gpu_ids`` (no GPU ids: the host's memory, one set)."""
    infos = list(infos)
    if not use_ray:
        return [[i["name"] for i in infos]]
    by: dict[tuple[str, ...], list[str]] = {}
    for i in infos:
        by.setdefault(tuple(sorted(str(g) for g in i.get("ray_gpu_ids") or [])), []).append(i["name"])
    return list(by.values())


def choose(requested: str, per_gpu: list[list[int]], budget: Budget) -> tuple[str, str]:
    """(``awake`` | ``pooled``, why): ``requested`` unless it is ``auto``; auto is pooled when the
    engines of some GPU (their footprints in ``per_gpu``) exceed the budget together."""
    if requested != "auto":
        return requested, f"rollout.engines: {requested}"
    if budget.models is None and budget.bytes is None:
        return AWAKE, f"auto: {budget.source}"
    worst = max(per_gpu, key=sum)
    limit = budget.bytes if budget.bytes is not None else int((budget.models or 0) * max(worst))
    if sum(worst) > limit:
        return POOLED, (f"auto: {len(worst)} engines need {fmt_bytes(sum(worst))} on one GPU, the budget is "
                        f"{fmt_bytes(limit)} ({budget.source})")
    return AWAKE, f"auto: every GPU's engines fit the budget of {fmt_bytes(limit)} ({budget.source})"


def reference_syncs(trajs: Iterable[Trajectory]) -> int:
    """Weight syncs the reference makes for these rollouts: its loop calls agent a's k-th turn of every
    episode in one batch, and each batch wakes the engine and syncs its weights; so one per distinct
    (agent, k) over the step's trajectories."""
    calls: set[tuple[str, int]] = set()
    for t in trajs:
        seen: Counter[str] = Counter()
        for turn in t.turns:
            calls.add((turn.agent, seen[turn.agent]))
            seen[turn.agent] += 1
    return len(calls)


def engine_metrics(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, int]:
    """The step's engine counters (``WorkerGroup.engine_counters`` at its start and end): per worker
    group under ``wg/<g>/`` and summed over the team."""
    rec: dict[str, int] = {}
    for key, name in metric_names.ENGINE_COUNTERS.items():
        total = 0
        for wg in after:
            d = int(after[wg].get(key, 0)) - int(before.get(wg, {}).get(key, 0))
            rec[metric_names.wg(wg, name)] = d
            total += d
        rec[name] = total
    return rec


class WorkerEngine:
    """A worker group's engine as the pool sees it: ``generate``, ``sleep`` and ``wake`` go through
    the group (``WorkerGroup`` or its Ray handle), which syncs a stale engine when it wakes."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    async def generate(self, requests: list) -> list:
        return await self.worker.generate(requests)

    async def sleep(self) -> None:
        await self.worker.engine_sleep()

    async def wake(self) -> None:
        await self.worker.engine_wake()


class RolloutEngines:
    """The rollout engines of a run, awake or pooled (module docstring). Build with :meth:`start`."""

    def __init__(self, mode: str, workers: dict[str, Any], why: str, pools: dict[str, LocalPool] | None = None) -> None:
        self.mode = mode
        self.workers = workers
        self.why = why
        self.pools = dict(pools or {})  # worker group -> its GPU's pool

    @classmethod
    async def start(cls, cfg: Any, workers: dict[str, Any], infos: list[dict[str, Any]], plan: dict[str, Any],
                    use_ray: bool) -> "RolloutEngines":
        """Decide awake or pooled for these started worker groups and, pooled, adopt their engines
        (held asleep until the first rollout)."""
        requested = cfg.rollout.engines
        budget = configured_budget(cfg.rollout)
        if budget is None and requested != AWAKE:
            budget = planned_budget(cfg, plan, use_ray)
        budget = budget or Budget(source="rollout.engines: awake")
        if budget.bytes is not None and budget.bytes <= 0:
            raise UserError(f"the rollout budget leaves no room for an engine ({budget.source}: "
                            f"{fmt_bytes(budget.bytes)}); see `drmas-bench train --plan` for what the GPU holds")
        if requested == AWAKE or (requested == "auto" and budget.bytes is None and budget.models is None):
            why = choose(requested, [], budget)[1]
            logger.info(f"[train] rollout engines: awake ({why})")
            return cls(AWAKE, workers, why)
        info = dict(zip(workers, await asyncio.gather(*(w.engine_info() for w in workers.values()))))
        fp = {n: int((budget.footprints or {}).get(n) or info[n]["footprint_bytes"]) for n in workers}
        sets = gpu_sets(infos, use_ray)
        mode, why = choose(requested, [[fp[n] for n in s] for s in sets], budget)
        logger.info(f"[train] rollout engines: {mode} ({why})")
        if mode == AWAKE:
            return cls(AWAKE, workers, why)
        pools: dict[str, LocalPool] = {}
        for names in sets:
            pool = LocalPool({n: Adopted(WorkerEngine(workers[n]), fp[n], bool(info[n]["awake"]),
                                         model=str(plan[n].settings.model) if n in plan else "") for n in names},
                             budget_bytes=budget.bytes, budget_models=budget.models, preload=False,
                             meter_interval_s=1.0)  # the trainer's memory is measured elsewhere: sample rarely
            await pool.start()
            await pool.hold_asleep()  # the budget holds from here: nothing awake until the first rollout
            pools.update({n: pool for n in names})
        return cls(POOLED, workers, why, pools)

    def _distinct_pools(self) -> list[LocalPool]:
        return list({id(p): p for p in self.pools.values()}.values())

    def views(self) -> dict[str, Any]:
        """``{worker group: engine-like}`` for ``TeamRuntime``: the groups themselves when awake, the
        pools' views when pooled."""
        if self.mode == AWAKE:
            return dict(self.workers)
        return {n: self.pools[n].view(n) for n in self.workers}

    async def before_rollout(self) -> None:
        """Pooled: release the hold; the engines wake on demand under the budget. An engine woken
        since the hold by its own group (the warm start's sync, a validation's generate) is put back
        to sleep first, so the budget holds from the first request."""
        held = [n for n, p in self.pools.items() if p.state_of(n) == "asleep"]
        await asyncio.gather(*(self.workers[n].engine_sleep() for n in held))
        for p in self._distinct_pools():
            p.release()

    async def after_rollout(self) -> None:
        """Pooled: hold every engine asleep (returns when their memory is free) for the update."""
        await asyncio.gather(*(p.hold_asleep() for p in self._distinct_pools()))

    async def after_update(self) -> None:
        """Awake: sync every group's engine now (today's step 6). Pooled: nothing; the engine is
        stale and its next wake syncs it."""
        if self.mode == AWAKE:
            await asyncio.gather(*(w.sync_weights() for w in self.workers.values()))

    async def counters(self) -> dict[str, dict[str, int]]:
        """``WorkerGroup.engine_counters`` per worker group (a group without them reports none)."""
        names = [n for n, w in self.workers.items() if hasattr(w, "engine_info")]
        got = await asyncio.gather(*(self.workers[n].engine_info() for n in names))
        return {n: dict(i.get("counters", {})) for n, i in zip(names, got)}

    def describe(self) -> dict[str, Any]:
        """The mode, why, and (pooled) each pool's groups and budget, for ``RUN/workers.json``."""
        pools = [{"groups": [n for n, q in self.pools.items() if q is p], "budget_bytes": p.budget_bytes,
                  "budget_models": p.budget_models} for p in self._distinct_pools()]
        return {"mode": self.mode, "why": self.why, **({"pools": pools} if pools else {})}

    async def close(self) -> None:
        """Close the pools (the engines stay with their worker groups, which close them)."""
        for p in self._distinct_pools():
            await p.close()
