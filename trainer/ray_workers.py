"""Worker groups as Ray actors (the single-controller layout of the reference).

    init_ray(cfg.ray)                                       # or join a cluster with ray.address
    handle = RayWorkerHandle.spawn(name, agents, settings, model_path, gpus=1.0, ...)
    await handle.update(rows, ...)                          # same async API as WorkerGroup
    await handle.close()

Each worker group lives in one actor that reserves ``ray.gpus_per_worker`` GPUs (logical GPUs on a
CPU machine: ``ray.init(num_cpus=2, num_gpus=N)``, as the tests do). The actor holds the policy,
the optimiser and the rollout engine; the controller (``trainer.py``) only sends requests and rows
and receives completions and metrics; weights never travel (the engine is synced inside the actor,
checkpoints are written by the actor into the run directory, which must be on a filesystem the
actors share with the controller, i.e. one node or a shared mount).

The actor is an *async* actor: concurrent ``generate`` calls from the controller's episodes run
together in its event loop, where the engine's micro-batcher gathers them into batches.
"""

from __future__ import annotations

import os
from typing import Any

from drmas_bench.types import UserError

_ENV = ("DRMAS_CACHE_DIR", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
        "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "DRMAS_DATA_DIR")


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("the Ray trainer needs ray: pip install 'drmas-bench[ray]' (or train with --local)") from None
    return ray


def init_ray(num_cpus: int | None = None, num_gpus: int | None = None, address: str | None = None) -> bool:
    """Start (or join) Ray unless it is already up; returns True when this call started it."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    env = {k: os.environ[k] for k in _ENV if k in os.environ}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}, "log_to_driver": False, "include_dashboard": False}
    if address:
        kwargs["address"] = address
    else:
        kwargs.update(num_cpus=num_cpus, num_gpus=num_gpus)
    ray.init(**kwargs)
    return True


def shutdown_ray() -> None:
    ray = require_ray()
    if ray.is_initialized():
        ray.shutdown()


class WorkerActor:
    """The body of a worker-group actor: a :class:`~drmas_trainer.worker.WorkerGroup` and a
    generic async ``call`` that runs one of its methods."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from drmas_trainer.worker import WorkerGroup

        self.wg = WorkerGroup(*args, **kwargs)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.wg, method)(*args, **kwargs)

    async def ray_info(self) -> dict[str, Any]:
        import ray

        info = await self.wg.info()
        info["ray_gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
        info["pid"] = os.getpid()
        return info


class RayWorkerHandle:
    """Controller-side handle of a worker-group actor, with the same async methods as WorkerGroup
    (``generate``, ``update``, ``sft``, ``sync_weights``, ``save``, ``load_optimizer``, ``info``,
    ``start_engine``, ``close``)."""

    def __init__(self, actor: Any, name: str) -> None:
        self.actor = actor
        self.name = name

    @classmethod
    def spawn(cls, name: str, agents: list[str], settings: Any, model_path: str, *, gpus: float = 1.0,
              **kwargs: Any) -> "RayWorkerHandle":
        ray = require_ray()
        remote = ray.remote(WorkerActor).options(num_gpus=gpus, num_cpus=0, name=None, max_concurrency=1000)
        return cls(remote.remote(name, agents, settings, model_path, **kwargs), name)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self.actor.call.remote(method, *args, **kwargs)

    async def generate(self, requests: list) -> list:
        return await self._call("generate", requests)

    async def start_engine(self) -> None:
        return await self._call("start_engine")

    async def update(self, rows: list, **kwargs: Any) -> dict[str, Any]:
        return await self._call("update", rows, **kwargs)

    async def sft(self, examples: list, **kwargs: Any) -> dict[str, float]:
        return await self._call("sft", examples, **kwargs)

    async def sync_weights(self) -> float:
        return await self._call("sync_weights")

    async def save(self, folder: str, optimizer_path: str | None = None) -> None:
        return await self._call("save", folder, optimizer_path)

    async def load_optimizer(self, path: str) -> None:
        return await self._call("load_optimizer", path)

    async def info(self) -> dict[str, Any]:
        return await self.actor.ray_info.remote()

    async def close(self) -> None:
        ray = require_ray()
        try:
            await self._call("close")
        finally:
            ray.kill(self.actor)
