"""Worker groups as Ray actors (the single-controller layout of the reference).

    init_ray(cfg.ray.num_cpus, cfg.ray.num_gpus, cfg.ray.address, cfg.ray.ship_code)   # or attach
    check_worker_demand(cfg.ray, plan)                       # one-line error if the cluster is too small
    handle = RayWorkerHandle.spawn(name, agents, settings, model_path, gpus=1.0, ...)
    await handle.ready(timeout_s=60)                         # placed in time, else a one-line error
    await handle.update(rows, ...)                           # same async API as WorkerGroup
    await handle.close()

Each worker group lives in one actor that reserves ``ray.gpus_per_worker`` GPUs (logical GPUs on a
CPU machine: ``ray.init(num_cpus=2, num_gpus=N)``, as the tests do). The actor holds the policy,
the optimiser and the rollout engine; the controller (``trainer.py``) only sends requests and rows
and receives completions and metrics; weights never travel (the engine is synced inside the actor,
checkpoints are written by the actor into the checkpoint root, which must be storage the actors
share with the controller: one node, a shared mount, or an fsspec URL the actor uploads to; the
controller checks every group's files are there before it marks a checkpoint complete). Model names are resolved inside the actor, on its
node (``drmas_bench.pool.cluster``); attaching to a cluster ships the code (docs/scaling.md).

Resources are checked up front: the demand of all worker groups (``len(plan) x gpus_per_worker``
GPUs) is compared with ``ray.cluster_resources()`` before any actor exists, and a demand the cluster
cannot meet is a one-line error that names both and how to make it fit (fractional
``ray.gpus_per_worker``, ``--shared``). Waiting for an actor to be *placed* (resources held by
someone else) is bounded by ``ray.timeout_s``; loading the model inside the actor is not. Actor
output reaches the driver (``log_to_driver=True``); an exception in an actor is printed there with
its traceback and reaches the controller as a one-line :class:`UserError`.

The actor is an *async* actor: concurrent ``generate`` calls from the controller's episodes run
together in its event loop, where the engine's micro-batcher gathers them into batches.
"""

from __future__ import annotations

import math
import os
import traceback
from typing import Any

from drmas_bench.pool.cluster import init_ray as cluster_init
from drmas_bench.pool.cluster import node_label, on_node, ray_address
from drmas_bench.pool.ray_pool import check_demand, ray_error_line, wait_placed
from drmas_bench.types import UserError


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("the Ray trainer needs ray: pip install 'drmas-bench[ray]' (or train with --local)") from None
    return ray


def init_ray(num_cpus: int | None = None, num_gpus: int | None = None, address: str | None = None,
             ship_code: bool | None = None) -> bool:
    """Start Ray (``num_cpus`` / ``num_gpus``) or attach to ``address`` (else ``$RAY_ADDRESS``) unless
    it is already up; returns True when this call did. ``ship_code``: send this checkout's packages
    in the runtime_env (None: when attaching). Actor stdout/stderr reach the driver
    (``log_to_driver``): a failing actor's traceback is seen."""
    require_ray()

    return cluster_init(ray_address(address), ship_code, num_cpus=num_cpus, num_gpus=num_gpus)


def shutdown_ray() -> None:
    ray = require_ray()
    if ray.is_initialized():
        ray.shutdown()


def worker_demand(n_groups: int, gpus_per_worker: float) -> dict[str, float]:
    """What ``n_groups`` worker-group actors reserve together (they hold their GPUs all run long)."""
    return {"GPU": n_groups * float(gpus_per_worker)}


def check_worker_demand(ray_cfg: Any, plan: dict[str, Any]) -> None:
    """One-line UserError, before any actor is made, when the Ray cluster has fewer GPUs in total
    than the worker groups reserve; the message says how to make the recipe fit."""

    n, g = len(plan), float(ray_cfg.gpus_per_worker)
    ray = require_ray()
    have = float(ray.cluster_resources().get("GPU", 0.0))
    if have > 0:
        fit = f"--set ray.gpus_per_worker={math.floor(have / n * 100) / 100:g} (the groups share the GPUs; lower " \
              f"engine_options.mem_fraction_static to match)"
    else:
        fit = "--local (worker groups in this process) or ray.num_gpus=N logical GPUs on a CPU machine"
    hint = f"{n} worker group(s) ({', '.join(plan)}) x ray.gpus_per_worker={g:g}; to fit: {fit}"
    if n > 1:
        hint += ", or --shared (one worker group per model)"
    check_demand(worker_demand(n, g), "this training run", hint)


class WorkerActor:
    """The body of a worker-group actor: a :class:`~drmas_trainer.worker.WorkerGroup` (made by
    ``setup``, so that ``ping`` answers as soon as the actor is placed) and a generic async ``call``
    that runs one of its methods. An unexpected exception is printed with its traceback (it reaches
    the driver's log) before it travels back."""

    def __init__(self) -> None:
        self.wg: Any = None

    async def ping(self) -> int:
        return os.getpid()

    async def rendezvous(self) -> str:
        """``tcp://IP:PORT`` where this actor (rank 0 of a sharded group) will listen."""
        ray = require_ray()
        from drmas_trainer.fsdp.sharding import free_port

        ip = ray.util.get_node_ip_address()
        return f"tcp://{ip}:{free_port(ip)}"

    async def setup(self, *args: Any, **kwargs: Any) -> None:
        """Build the worker group; with ``rank`` / ``world`` / ``init_method`` in ``kwargs``, one rank of
        a sharded group (``drmas_trainer.fsdp.worker``)."""
        from drmas_trainer.worker import WorkerGroup

        try:
            if "world" in kwargs:
                from drmas_trainer.fsdp.worker import ShardedWorkerGroup

                self.wg = ShardedWorkerGroup(*args, **kwargs)
            else:
                self.wg = WorkerGroup(*args, **kwargs)
        except UserError as e:  # e.g. a model folder missing on this node: say which node
            raise on_node(e) from None
        except Exception:
            traceback.print_exc()
            raise

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.wg is None:
            if method == "close":
                return None
            raise UserError(f"worker group actor: {method} called before setup")
        try:
            return await getattr(self.wg, method)(*args, **kwargs)
        except UserError:
            raise
        except Exception:
            traceback.print_exc()
            raise

    async def ray_info(self) -> dict[str, Any]:
        ray = require_ray()
        info = await self.wg.info()
        info["ray_gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
        info["pid"] = os.getpid()

        info["node"] = node_label()
        return info


class WorkerCalls:
    """The worker group's methods as the controller calls them on a remote group (``WorkerGroup``'s
    async API): each sends its name and arguments through ``_call``, which a handle defines (one Ray
    actor: :class:`RayWorkerHandle`; every rank of a sharded group: ``fsdp.ray_group.ShardedRayHandle``)."""

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def generate(self, requests: list) -> list:
        return await self._call("generate", requests)

    async def start_engine(self) -> None:
        return await self._call("start_engine")

    async def update(self, rows: list, **kwargs: Any) -> dict[str, Any]:
        return await self._call("update", rows, **kwargs)

    async def score_rows(self, rows: list, **kwargs: Any) -> dict[str, Any]:
        return await self._call("score_rows", rows, **kwargs)

    async def sft(self, examples: list, **kwargs: Any) -> dict[str, Any]:
        return await self._call("sft", examples, **kwargs)

    async def sync_weights(self) -> float:
        return await self._call("sync_weights")

    async def engine_sleep(self) -> None:
        """The group's engine(s) to sleep (the rollout pool's sleep of this group)."""
        return await self._call("engine_sleep")

    async def engine_wake(self) -> None:
        """The group's engine(s) awake; a stale sharded group syncs on all ranks together (a collective)."""
        return await self._call("engine_wake")

    async def engine_info(self) -> dict[str, Any]:
        return await self._call("engine_info")

    async def save(self, folder: str, optimizer_path: str | None = None) -> None:
        return await self._call("save", folder, optimizer_path)

    async def load_optimizer(self, path: str) -> None:
        return await self._call("load_optimizer", path)


class RayWorkerHandle(WorkerCalls):
    """Controller-side handle of a worker-group actor, with the same async methods as WorkerGroup
    (``generate``, ``update``, ``score_rows``, ``sft``, ``sync_weights``, ``save``, ``load_optimizer``, ``info``,
    ``start_engine``, ``engine_sleep``, ``engine_wake``, ``engine_info``, ``close``). ``spawn`` asks Ray for the
    actor; ``ready`` waits for it (with a timeout) and builds the worker group inside it. A failed remote call is a
    one-line UserError."""

    def __init__(self, actor: Any, name: str, setup: tuple[tuple, dict] | None = None, gpus: float = 0.0) -> None:
        self.actor = actor
        self.name = name
        self.gpus = gpus
        self._setup = setup
        self._placed = setup is None

    @classmethod
    def spawn(cls, name: str, agents: list[str], settings: Any, model_path: str, *, gpus: float = 1.0,
              bundle: tuple[Any, int] | None = None, **kwargs: Any) -> "RayWorkerHandle":
        """``bundle``: (placement group, bundle index) to place the actor in (a sharded group's rank)."""
        ray = require_ray()
        opts: dict[str, Any] = {}
        if bundle is not None:
            opts["scheduling_strategy"] = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                placement_group=bundle[0], placement_group_bundle_index=bundle[1])
        remote = ray.remote(WorkerActor).options(num_gpus=gpus, num_cpus=0, name=None, max_concurrency=1000, **opts)
        return cls(remote.remote(), name, ((name, agents, settings, model_path), kwargs), gpus)

    async def ready(self, timeout_s: float | None = 60.0) -> None:
        """Wait until Ray has placed the actor (at most ``timeout_s``), then build the worker group
        in it (loading the model: no timeout)."""

        await wait_placed(self.actor.ping.remote(), timeout_s, f"worker group {self.name!r}", {"GPU": self.gpus})
        self._placed = True
        if self._setup is not None:
            args, kwargs = self._setup
            await self._remote(self.actor.setup, *args, **kwargs)
            self._setup = None

    async def _remote(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        ray = require_ray()
        try:
            return await fn.remote(*args, **kwargs)
        except ray.exceptions.RayError as e:
            raise UserError(f"worker group {self.name!r} (Ray actor): {ray_error_line(e)}") from None

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self._remote(self.actor.call, method, *args, **kwargs)

    async def info(self) -> dict[str, Any]:
        return await self._remote(self.actor.ray_info)

    async def close(self) -> None:
        ray = require_ray()
        try:
            if self._placed:  # an actor Ray never placed would never answer
                await self._call("close")
        finally:
            ray.kill(self.actor)
