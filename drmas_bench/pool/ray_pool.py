"""``RayPool``: each worker group is a Ray actor placed in one placement group over a pool of GPUs;
the dispatch policy runs in the driver (the same ``policy.py`` as ``LocalPool``).

    import ray
    ray.init(num_cpus=2, num_gpus=2)           # on a CPU machine: two *logical* GPUs
    specs = {wg: EngineSpec("hf", "tiny-random") for wg in ("verifier", "searcher", "answerer")}
    async with RayPool(specs) as pool:           # 3 worker groups, 2 GPUs: one waits its turn
        [c] = await pool.generate("verifier", [request])

Each actor creates its engine inside itself with ``make_engine(kind, model, **options)`` (so the
engine lives on the actor's GPU: Ray sets ``CUDA_VISIBLE_DEVICES``). Two ways to share the GPUs:

- **whole GPUs** (``gpus_per_group=1``, the default): an actor owns one GPU while it exists. Sleeping
  a worker group closes its engine and ends its actor, which frees the GPU (``release_on_sleep``);
  waking it creates a new actor (the engine reloads its weights). At most ``#GPUs`` engines are
  resident (the policy's ``max_awake``), so the third of three worker groups on two GPUs waits
  until the least recently used idle one is released, then runs on the freed GPU.
- **shared GPUs** (``gpus_per_group=0.5`` etc., ``release_on_sleep=False``): actors stay; sleeping
  calls ``engine.sleep()`` in the actor (weights to pinned host memory on CUDA) and the memory
  budget (``budget_bytes`` / ``budget_models``) decides who is resident. Every worker group must
  fit in the placement group at once.

Options: those of :class:`~drmas_bench.pool.base.PoolBase` (``budget_bytes``, ``budget_models``,
``max_awake``, ``max_wait_s``, ``preload`` (default ``False`` here: actors start on first use),
``meter_interval_s``, ``timeline_max``) plus

- ``num_gpus``: GPUs the placement group reserves (``None``: every GPU of the Ray cluster).
- ``gpus_per_group``: GPUs per worker-group actor: a fraction of one GPU, or a whole number
  (bundles of that many GPUs). ``0``: no GPUs, no placement group (actors anywhere, CPU engines).
- ``release_on_sleep``: sleeping ends the actor and frees its GPU share (``None``: True for whole
  GPUs, False for fractions).
- ``address``: attach to this Ray cluster (``"auto"``, ``host:port``, ``ray://...``) when Ray is not
  initialised yet; ``None``: ``$RAY_ADDRESS``, else start a local Ray (see ``cluster.py``).
- ``ship_code``: send this checkout's packages to the workers in the job's ``runtime_env``
  (``None``: when attaching to an address).
- ``ray_init``: keyword arguments for a *local* ``ray.init`` (``num_cpus``, ``num_gpus``...) when Ray is
  not initialised yet (the pool then shuts Ray down on close).
- ``placement_timeout_s``: how long to wait for the placement group's GPUs, and for each actor to be
  placed (its process started; the engine's model load is not counted), before a one-line error
  that names the demand and what the cluster has free.
- ``actor_options``: extra ``.options(...)`` for the actors (e.g. ``runtime_env``).

``stats()`` adds per worker group the actors' process ids, GPU ids and Ray nodes over time, and reports
``peak_rss_bytes`` / ``peak_cuda_bytes`` as the largest peak of any one actor process (each
process measures itself: psutil RSS, ``torch.cuda.max_memory_allocated``).

Ray is imported only here, when a RayPool is made; without it the error names
``pip install drmas-bench[ray]``.
"""

from __future__ import annotations

import asyncio
import os
import re
import traceback
from typing import Any, Mapping

from drmas_bench.engines import make_engine, traits
from drmas_bench.pool.base import PoolBase
from drmas_bench.pool.cluster import driver_model_name, import_ray, init_ray, node_label, on_node, ray_address
from drmas_bench.pool.groups import EngineSpec, WorkerGroup
from drmas_bench.pool.memory import MemoryMeter, cuda_peak_bytes
from drmas_bench.types import Completion, Request, UserError


class EngineActor:
    """The body of a worker group's actor: one engine, created inside the actor process by
    ``start`` (not the constructor, so that ``ping`` answers as soon as Ray has placed the actor:
    the wait for resources has a timeout, the model load does not)."""

    def __init__(self) -> None:
        self.meter: MemoryMeter | None = None
        self.engine: Any = None

    def ping(self) -> int:
        return os.getpid()

    def start(self, kind: str, model: str, options: dict[str, Any], meter_interval_s: float = 0.05) -> dict[str, Any]:

        self.meter = MemoryMeter(meter_interval_s)
        self.meter.start()
        try:
            self.engine = make_engine(kind, model, **options)
        except UserError as e:  # one line, naming the node (a model missing *there*)
            raise on_node(e) from None
        except Exception:  # the traceback reaches the driver's log (log_to_driver); the caller gets one line
            traceback.print_exc()
            raise
        return self.ready()

    def ready(self) -> dict[str, Any]:
        ray = import_ray()
        return {"footprint": int(self.engine.footprint_bytes()), "pid": os.getpid(), "node": node_label(),
                "gpu_ids": [str(x) for x in ray.get_gpu_ids()], **self.memory()}

    def memory(self) -> dict[str, Any]:
        self.meter.sample()
        return {"peak_rss_bytes": self.meter.peak_rss, "peak_cuda_bytes": cuda_peak_bytes()}

    async def generate(self, requests: list[Request]) -> tuple[list[Completion], dict[str, Any]]:
        out = await self.engine.generate(requests)
        return out, self.memory()

    async def sleep(self) -> dict[str, Any]:
        await self.engine.sleep()
        return self.memory()

    async def wake(self) -> dict[str, Any]:
        await self.engine.wake()
        return self.memory()

    async def close(self) -> dict[str, Any]:
        if self.engine is None:  # start() failed or never ran
            return {}
        mem = self.memory()
        await self.engine.close()
        self.meter.stop()
        return mem


_REMOTE: dict[str, Any] = {}


def remote_actor_class() -> Any:
    """``ray.remote(EngineActor)``, made once per process."""
    if "actor" not in _REMOTE:
        _REMOTE["actor"] = import_ray().remote(EngineActor)
    return _REMOTE["actor"]


def _fmt_resources(res: Mapping[str, float], keys: Any) -> str:
    return ", ".join(f"{float(res.get(k, 0.0)):g} {k}" for k in keys)


def check_demand(demand: Mapping[str, float], what: str, hint: str = "") -> None:
    """Before any placement group or actor is made: a one-line UserError when the Ray cluster's
    *total* resources (``ray.cluster_resources()``) cannot meet ``demand`` (e.g. ``{"GPU": 2}``)
    at all, naming the demand and what the cluster has (``hint``: how to make it fit)."""
    ray = import_ray()
    have = ray.cluster_resources()
    keys = [k for k, v in demand.items() if v > 0]
    if any(demand[k] > float(have.get(k, 0.0)) + 1e-9 for k in keys):
        raise UserError(f"{what} needs {_fmt_resources(demand, keys)} but the Ray cluster has "
                        f"{_fmt_resources(have, keys)}" + (f"; {hint}" if hint else ""))


async def wait_placed(ref: Any, timeout_s: float | None, what: str, demand: Mapping[str, float]) -> Any:
    """Await ``ref`` (an actor's first, trivial call: it returns once Ray has placed the actor and
    started its process); after ``timeout_s`` a one-line UserError naming the demand, the cluster
    and what is free now (resources held by other actors or jobs), never a silent hang."""
    try:
        return await asyncio.wait_for(ref, timeout=timeout_s)
    except asyncio.TimeoutError:
        ray = import_ray()
        keys = [k for k, v in demand.items() if v > 0] or ["CPU"]
        raise UserError(
            f"{what}: Ray could not place its actor ({_fmt_resources(demand, keys) or 'no resources'}) within "
            f"{timeout_s:g} s (cluster: {_fmt_resources(ray.cluster_resources(), keys)}; free now: "
            f"{_fmt_resources(ray.available_resources(), keys)}); other actors or jobs hold them: free them, "
            f"or raise the timeout") from None


def ray_error_line(exc: BaseException) -> str:
    """The one line that says why a Ray call failed: the actor's own UserError message as is, else
    the last line of the remote traceback that names an error, or why the actor died."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, UserError):
        return str(cause.args[0]) if cause.args else type(cause).__name__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if type(exc).__name__ in ("ActorDiedError", "RayActorError") and "creation task" not in text:
        why = next((ln for ln in lines if "died" in ln.lower() or "exit" in ln.lower()), lines[0] if lines else "")
        return f"its actor died ({why[:200]})"
    return next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else type(exc).__name__)


def _actor_error(name: str, exc: BaseException) -> UserError:
    return UserError(f"worker group {name!r}: its Ray actor failed: {ray_error_line(exc)}")


class RayPool(PoolBase):
    """Worker groups as Ray actors on a GPU placement group (see the module docstring)."""

    kind = "ray"

    def __init__(
        self,
        groups: Mapping[str, EngineSpec],
        *,
        num_gpus: int | None = None,
        gpus_per_group: float = 1.0,
        release_on_sleep: bool | None = None,
        ray_init: dict[str, Any] | None = None,
        address: str | None = None,
        ship_code: bool | None = None,
        placement_timeout_s: float = 60.0,
        actor_options: dict[str, Any] | None = None,
        preload: bool = False,
        **options: Any,
    ) -> None:
        for name, spec in groups.items():
            if not isinstance(spec, EngineSpec):
                raise UserError(f"worker group {name!r}: RayPool needs an EngineSpec (the actor builds the engine), "
                                f"got {type(spec).__name__}")
        if gpus_per_group < 0 or (gpus_per_group > 1 and gpus_per_group != int(gpus_per_group)):
            raise UserError(f"gpus_per_group must be a fraction of one GPU or a whole number, got {gpus_per_group}")
        self.ray = import_ray()
        super().__init__(groups, preload=preload, **options)
        self.num_gpus = num_gpus
        self.gpus_per_group = float(gpus_per_group)
        self.release_on_sleep = (gpus_per_group >= 1) if release_on_sleep is None else bool(release_on_sleep)
        self.ray_init = ray_init
        self.address = address
        self.ship_code = ship_code
        self.placement_timeout_s = placement_timeout_s
        self._extra_actor_options = dict(actor_options or {})
        self._user_max_awake = self.max_awake
        self._pg: Any = None
        self._we_started_ray = False
        self.slots: int | None = None
        self._actor_mem: dict[str, dict[str, Any]] = {}
        self._placements: dict[str, list[dict[str, Any]]] = {n: [] for n in groups}

    # ------------------------------------------------------------------ placement

    async def _backend_start(self) -> None:
        ray = self.ray
        if not ray.is_initialized():
            self._we_started_ray = init_ray(ray_address(self.address), self.ship_code, **(self.ray_init or {}))
        # what one actor asks for beyond its GPU share (actor_options): one line now if the cluster lacks it
        check_demand(self._actor_demand(with_gpus=False), "a RayPool worker-group actor",
                     "check actor_options (num_cpus / resources)")
        if self.gpus_per_group == 0:
            return
        total = ray.cluster_resources().get("GPU", 0)
        n = int(total) if self.num_gpus is None else int(self.num_gpus)
        self.num_gpus = n
        if n < 1 or n > total:
            raise UserError(f"RayPool: the pool needs {n if n >= 1 else 'at least 1'} GPU(s) but the Ray cluster has "
                            f"{total:g}; on a CPU machine ray.init(num_gpus=N) declares logical GPUs, or pass gpus_per_group=0")
        per_bundle = max(1, int(self.gpus_per_group))
        bundles = n // per_bundle
        if bundles < 1:
            raise UserError(f"RayPool: gpus_per_group={self.gpus_per_group:g} but the pool has only {n} GPU(s)")
        self.slots = bundles * (1 if self.gpus_per_group >= 1 else int(1 / self.gpus_per_group + 1e-9))
        if not self.release_on_sleep and len(self._groups) > self.slots:
            raise UserError(
                f"RayPool: {len(self._groups)} worker groups x {self.gpus_per_group:g} GPU do not fit on {n} GPU(s) at once; "
                f"use release_on_sleep=True or a smaller gpus_per_group")
        if self.release_on_sleep:
            self.max_awake = self.slots if self._user_max_awake is None else min(self.slots, self._user_max_awake)
        self._pg = ray.util.placement_group([{"GPU": float(per_bundle)}] * bundles, strategy="PACK")
        try:
            await asyncio.wait_for(self._pg.ready(), timeout=self.placement_timeout_s)
        except asyncio.TimeoutError:
            free = ray.available_resources().get("GPU", 0)
            raise UserError(f"RayPool: could not reserve {bundles} x {per_bundle} GPU within {self.placement_timeout_s:g} s "
                            f"(cluster: {total:g} GPUs, {free:g} free)") from None

    def _actor_demand(self, with_gpus: bool = True) -> dict[str, float]:
        """The resources one worker-group actor reserves (GPU share, CPUs, custom resources)."""
        opts = {"num_cpus": 0, "num_gpus": self.gpus_per_group, **self._extra_actor_options}
        demand = {"GPU": float(opts.get("num_gpus") or 0) if with_gpus else 0.0, "CPU": float(opts.get("num_cpus") or 0)}
        demand.update({str(k): float(v) for k, v in (opts.get("resources") or {}).items()})
        return demand

    def actor_options(self) -> dict[str, Any]:
        """``.options(...)`` of a worker-group actor: its GPU share inside the pool's placement group."""
        opts: dict[str, Any] = {"num_cpus": 0, "num_gpus": self.gpus_per_group}
        if self._pg is not None:
            opts["scheduling_strategy"] = self.ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=-1)
        opts.update(self._extra_actor_options)
        return opts

    async def _backend_close(self) -> None:
        if self._pg is not None:
            try:
                self.ray.util.remove_placement_group(self._pg)
            except Exception as exc:  # pragma: no cover - best effort
                self._errors.append(f"placement group removal failed: {exc}")
            self._pg = None
        if self._we_started_ray:
            self.ray.shutdown()

    # ------------------------------------------------------------------ hooks

    def _note_mem(self, g: WorkerGroup, mem: dict[str, Any]) -> None:
        """Keep the largest peaks any actor of ``g`` reported (actors come and go)."""
        seen = self._actor_mem.setdefault(g.name, {"peak_rss_bytes": None, "peak_cuda_bytes": None})
        for k in seen:
            v = mem.get(k)
            if v is not None:
                seen[k] = v if seen[k] is None else max(seen[k], v)

    async def _load(self, g: WorkerGroup) -> tuple[Any, int]:

        spec: EngineSpec = g.spec
        actor = remote_actor_class().options(**self.actor_options()).remote()
        try:
            await wait_placed(actor.ping.remote(), self.placement_timeout_s, f"worker group {g.name!r}",
                              self._actor_demand())
        except BaseException:
            self.ray.kill(actor)
            raise
        try:
            model = spec.model if traits(spec.kind).remote else driver_model_name(spec.model)
            info = await actor.start.remote(spec.kind, model, dict(spec.options))
        except Exception as exc:  # a RayTaskError (also when it wraps a UserError: its text is the traceback)
            self.ray.kill(actor)
            raise _actor_error(g.name, exc) from exc
        self._placements[g.name].append({"pid": info["pid"], "gpu_ids": info["gpu_ids"], "node": info["node"]})
        self._note_mem(g, info)
        return actor, int(info["footprint"])

    async def _sleep(self, g: WorkerGroup) -> Any:
        if self.release_on_sleep:
            try:
                self._note_mem(g, await g.handle.close.remote())
            finally:
                self.ray.kill(g.handle)
            return None
        self._note_mem(g, await g.handle.sleep.remote())
        return g.handle

    async def _wake(self, g: WorkerGroup) -> Any:
        self._note_mem(g, await g.handle.wake.remote())
        return g.handle

    async def _generate(self, g: WorkerGroup, requests: list[Request]) -> list[Completion]:
        out, mem = await g.handle.generate.remote(requests)
        self._note_mem(g, mem)
        return out

    async def _close_handle(self, g: WorkerGroup) -> None:
        try:
            self._note_mem(g, await g.handle.close.remote())
        finally:
            self.ray.kill(g.handle)

    # ------------------------------------------------------------------ stats

    def _memory_stats(self) -> dict[str, Any]:
        rss = [m["peak_rss_bytes"] for m in self._actor_mem.values() if m.get("peak_rss_bytes") is not None]
        cuda = [m["peak_cuda_bytes"] for m in self._actor_mem.values() if m.get("peak_cuda_bytes") is not None]
        return {"peak_rss_bytes": max(rss) if rss else 0, "peak_cuda_bytes": max(cuda) if cuda else None,
                "driver_peak_rss_bytes": self.meter.peak_rss}

    def stats(self) -> dict[str, Any]:
        st = super().stats()
        st.update(num_gpus=self.num_gpus, gpus_per_group=self.gpus_per_group, slots=self.slots,
                  release_on_sleep=self.release_on_sleep)
        for name, g in st["groups"].items():
            g["actors"] = list(self._placements.get(name, []))
            g["actor_memory"] = dict(self._actor_mem.get(name, {}))
        return st
