"""The rollout engine's lifecycle in a worker group: sleep, wake, and the sync a wake may need.

An update marks the engine's weights *stale* (``WorkerGroup.update``); :meth:`EngineLifecycle.engine_wake`
(and ``WorkerGroup.generate``, which wakes through it) syncs a stale engine before it serves, and
also one whose sleep dropped weights it cannot restore itself (an engine with
``keeps_weights_asleep = False``: SGLang releasing its weights; ``hf`` keeps them). So a request
never meets old weights, whoever woke the engine: the trainer after the update, or the rollout
pool that adopted it (``drmas_trainer.rollout_engines``). Every sync, wake, sleep and generate call
is counted in ``engine_counters`` for the step's metrics. ``WorkerGroup`` inherits this; the engine,
the flags and the counters are its attributes.
"""

from __future__ import annotations

import asyncio
from typing import Any


class EngineLifecycle:
    """``engine_wake`` / ``engine_sleep`` / ``engine_info`` of a worker group (module docstring)."""

    engine: Any
    engine_counters: dict[str, int]
    _engine_stale: bool
    _engine_lost: bool
    _engine_lock: asyncio.Lock | None

    def _init_lifecycle(self) -> None:
        self._engine_stale = False  # the policy changed since the engine last got its weights
        self._engine_lost = False  # the engine's last sleep dropped weights only a sync restores
        self._engine_lock = None  # one wake (and its sync) at a time; made in the running loop
        self.engine_counters = {"syncs": 0, "wakes": 0, "sleeps": 0, "generate_calls": 0}

    async def start_engine(self) -> None:  # WorkerGroup's
        raise NotImplementedError

    async def sync_weights(self) -> float:  # WorkerGroup's
        raise NotImplementedError

    async def engine_wake(self) -> None:
        """Wake the engine; sync it first when its weights are stale or were dropped by its sleep."""
        if self.engine is None:
            await self.start_engine()
            return
        if self._engine_lock is None:
            self._engine_lock = asyncio.Lock()
        async with self._engine_lock:
            if self._engine_stale or self._engine_lost:
                await self.sync_weights()
            elif not self.engine.is_awake:
                await self.engine.wake()
                self.engine_counters["wakes"] += 1

    async def engine_sleep(self) -> None:
        """Put the engine to sleep (its weights and KV cache released, per its sleep mode)."""
        if self.engine is None or not self.engine.is_awake:
            return
        if self._engine_lock is None:
            self._engine_lock = asyncio.Lock()
        async with self._engine_lock:
            if not self.engine.is_awake:
                return
            await self.engine.sleep()
            self.engine_counters["sleeps"] += 1
            if not getattr(self.engine, "keeps_weights_asleep", True):
                self._engine_lost = True

    async def engine_info(self) -> dict[str, Any]:
        """``{"awake", "footprint_bytes", "counters"}`` of the engine (what a pool adopting it needs)."""
        e = self.engine
        return {"awake": bool(e is not None and e.is_awake), "footprint_bytes": int(e.footprint_bytes()) if e else 0,
                "counters": dict(self.engine_counters)}
