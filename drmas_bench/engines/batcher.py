"""A micro-batcher: many coroutines each ``await submit(items)``; one worker gathers what is
pending into batches and runs a blocking batch function in a thread.

    batcher = MicroBatcher(run_batch, max_batch=32, max_wait_ms=5.0, key=len)
    results = await batcher.submit([item1, item2])   # from any number of coroutines at once

Options:

- ``run_batch(items) -> results``: a blocking function, called with at most ``max_batch`` items, that
  returns one result per item in order. It runs in a worker thread (``asyncio.to_thread``) so the
  event loop keeps serving other coroutines (HTTP calls, graders, progress bars) meanwhile. Only one
  batch runs at a time.
- ``max_batch``: the most items per call of ``run_batch``.
- ``max_wait_ms``: how long the oldest pending item may wait for company before its batch runs
  anyway. A full batch runs at once.
- ``key(item) -> number``: optional size of an item (e.g. prompt length). When more than
  ``max_batch`` items are pending, the batch is the ``max_batch`` items of most similar size that
  include the oldest one (less padding, and no item waits behind newer ones forever).

If ``run_batch`` raises, every caller in that batch gets the exception. A cancelled caller's items
still run if their batch has started (their results are dropped).

The worker is bound to the running event loop; using the batcher from a new loop (e.g. a second
``asyncio.run``) starts a new worker there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class BatcherStats:
    """Counters for tests and benchmarks."""

    batches: int = 0  # calls of run_batch
    items: int = 0  # items processed
    largest: int = 0  # largest batch seen
    sizes: list[int] = field(default_factory=list)  # every batch size, in order


@dataclass
class _Pending(Generic[T]):
    item: T
    future: asyncio.Future
    t: float  # monotonic arrival time


class MicroBatcher(Generic[T, R]):
    """Gather concurrent submissions into batches of at most ``max_batch`` (see module doc)."""

    def __init__(
        self,
        run_batch: Callable[[list[T]], list[R]],
        *,
        max_batch: int = 32,
        max_wait_ms: float = 5.0,
        key: Callable[[T], float] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.key = key
        self.stats = BatcherStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[_Pending[T]] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._closed = False

    async def submit(self, items: list[T]) -> list[R]:
        """Queue ``items`` and wait for their results (in the same order)."""
        if self._closed:
            raise RuntimeError("the batcher is closed")
        if not items:
            return []
        self._ensure_worker()
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        entries = [_Pending(it, loop.create_future(), now) for it in items]
        self._pending.extend(entries)
        self._wakeup.set()
        try:
            return list(await asyncio.gather(*(e.future for e in entries)))
        except asyncio.CancelledError:
            for e in entries:
                e.future.cancel()
            self._pending = [p for p in self._pending if not p.future.cancelled()]
            raise

    def _ensure_worker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            # a new event loop (or a dead worker): entries of an old loop can never complete
            if self._loop is not loop:
                self._pending = []
            self._loop = loop
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._work(), name="drmas-micro-batcher")

    def _take_batch(self) -> list[_Pending[T]]:
        """Remove and return the next batch from the pending list."""
        pend = self._pending
        if len(pend) <= self.max_batch:
            self._pending = []
            return pend
        if self.key is None:
            batch, self._pending = pend[: self.max_batch], pend[self.max_batch :]
            return batch
        key = self.key
        order = sorted(range(len(pend)), key=lambda i: (key(pend[i].item), i))
        oldest_pos = order.index(0)  # pend[0] is the oldest pending item
        best_lo, best_spread = 0, float("inf")
        lo_min = max(0, oldest_pos - self.max_batch + 1)
        lo_max = min(oldest_pos, len(order) - self.max_batch)
        for lo in range(lo_min, lo_max + 1):
            spread = key(pend[order[lo + self.max_batch - 1]].item) - key(pend[order[lo]].item)
            if spread < best_spread:
                best_lo, best_spread = lo, spread
        chosen = set(order[best_lo : best_lo + self.max_batch])
        batch = [pend[i] for i in sorted(chosen)]
        self._pending = [p for i, p in enumerate(pend) if i not in chosen]
        return batch

    async def _work(self) -> None:
        assert self._wakeup is not None
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            # wait for company: until a full batch is pending or the oldest item waited long enough
            while len(self._pending) < self.max_batch:
                left = self._pending[0].t + self.max_wait_s - time.monotonic() if self._pending else 0
                if left <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout=left)
                except asyncio.TimeoutError:
                    break
            self._pending = [p for p in self._pending if not p.future.cancelled()]
            if not self._pending:
                continue
            batch = self._take_batch()
            items = [p.item for p in batch]
            try:
                results = await asyncio.to_thread(self.run_batch, items)
                if len(results) != len(items):
                    raise RuntimeError(f"run_batch returned {len(results)} results for {len(items)} items")
            except asyncio.CancelledError:
                for p in batch:
                    if not p.future.done():
                        p.future.cancel()
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to every caller of the batch
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            self.stats.batches += 1
            self.stats.items += len(items)
            self.stats.largest = max(self.stats.largest, len(items))
            self.stats.sizes.append(len(items))
            for p, r in zip(batch, results):
                if not p.future.done():
                    p.future.set_result(r)

    async def close(self) -> None:
        """Stop the worker; callers still waiting get ``CancelledError``."""
        self._closed = True
        worker, self._worker = self._worker, None
        for p in self._pending:
            if not p.future.done():
                p.future.cancel()
        self._pending = []
        if worker is not None and not worker.done():
            try:
                if worker.get_loop() is asyncio.get_running_loop():
                    worker.cancel()
                    try:
                        await worker
                    except (asyncio.CancelledError, Exception):
                        pass
            except RuntimeError:
                pass
