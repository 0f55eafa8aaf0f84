"""``LocalPool``: every worker group's engine in this process (the default pool).

    from drmas_bench.pool import EngineSpec, LocalPool
    specs = {wg: EngineSpec("hf", "smollm2-135m-instruct", {"device": "cpu"}) for wg in ("v", "s", "a")}
    async with LocalPool(specs, budget_models=1) as pool:
        [c] = await pool.generate("v", [request])
        runtime = TeamRuntime(team, pool.views(), sampling)     # or route a whole run through it
        print(pool.stats())

Each value of ``groups`` is an :class:`EngineSpec` (created with ``hosting.host_engine`` in a worker
thread when the pool first needs it: in this process, or in a child process of its own for an engine
with process-wide state such as ``sglang``), a zero-argument factory returning an engine, or an
engine that already exists (its memory is in use before the pool can budget it: prefer specs or
factories), or :class:`~drmas_bench.pool.base.Adopted` (an engine someone else owns and keeps,
scheduled in place and never closed by the pool: the trainer's worker groups hand theirs over this
way, in process or as Ray actors, whose calls are just as asynchronous from here).

Options: those of :class:`~drmas_bench.pool.base.PoolBase` (``budget_bytes``, ``budget_models``,
``max_awake``, ``max_wait_s``, ``preload``, ``meter_interval_s``) plus

- ``trim_host_memory``: after putting an engine to sleep on CPU, ask glibc to hand freed heap pages
  back to the OS (``malloc_trim(0)``), so RSS tracks the resident engines (``None``: only on Linux,
  a no-op elsewhere).
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import sys
from typing import Any, Mapping

from drmas_bench.engines import hosting
from drmas_bench.pool.base import Adopted, PoolBase
from drmas_bench.pool.groups import EngineSpec, WorkerGroup
from drmas_bench.types import Completion, Request, UserError


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class LocalPool(PoolBase):
    """Worker groups and their engines in this process (see the module docstring)."""

    kind = "local"

    def __init__(self, groups: Mapping[str, Any], *, trim_host_memory: bool | None = None, **options: Any) -> None:
        for name, spec in groups.items():
            if not (isinstance(spec, (EngineSpec, Adopted)) or callable(spec) or hasattr(spec, "generate")):
                raise UserError(
                    f"worker group {name!r}: expected an EngineSpec, an engine, a factory or Adopted(engine, "
                    f"footprint), got {type(spec).__name__}"
                )
        super().__init__(groups, **options)
        for g in self._groups.values():
            if not g.model and hasattr(g.spec, "generate"):
                g.model = str(getattr(g.spec, "model", ""))
        self.trim_host_memory = sys.platform.startswith("linux") if trim_host_memory is None else trim_host_memory

    async def _load(self, g: WorkerGroup) -> tuple[Any, int]:
        spec = g.spec
        try:
            if isinstance(spec, EngineSpec):
                engine = await asyncio.to_thread(hosting.host_engine, spec.kind, spec.model, **spec.options)
            elif hasattr(spec, "generate"):
                engine = spec
                if not engine.is_awake:
                    await engine.wake()
            else:
                engine = await asyncio.to_thread(spec)
        except UserError as exc:
            raise type(exc)(f"worker group {g.name!r}: {exc}") from exc
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise UserError(f"worker group {g.name!r}: cannot create its engine: {type(exc).__name__}: {first}") from exc
        if not g.model:
            g.model = str(getattr(engine, "model", ""))
        return engine, int(engine.footprint_bytes())

    async def _sleep(self, g: WorkerGroup) -> Any:
        await g.handle.sleep()
        if self.trim_host_memory:
            await asyncio.to_thread(_malloc_trim)
        return g.handle

    async def _wake(self, g: WorkerGroup) -> Any:
        await g.handle.wake()
        return g.handle

    async def _generate(self, g: WorkerGroup, requests: list[Request]) -> list[Completion]:
        return await g.handle.generate(requests)

    async def _close_handle(self, g: WorkerGroup) -> None:
        out = g.handle.close()
        if inspect.isawaitable(out):
            await out
        if self.trim_host_memory:
            _malloc_trim()

    def engine(self, wg: str) -> Any:
        """The engine of ``wg`` (``None`` before its first load), e.g. for ``update_weights``."""
        return self._group(wg).handle
