"""The micro-batcher with a fake blocking batch function (no model)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from drmas_bench.engines.batcher import MicroBatcher


def test_gathers_concurrent_calls_and_keeps_order():
    calls: list[list[int]] = []

    def run_batch(items: list[int]) -> list[int]:
        calls.append(list(items))
        return [x * 10 for x in items]

    b = MicroBatcher(run_batch, max_batch=8, max_wait_ms=100)

    async def main():
        return await asyncio.gather(*(b.submit([i, i + 100]) for i in range(10)))

    outs = asyncio.run(main())
    assert outs == [[i * 10, (i + 100) * 10] for i in range(10)]
    assert all(len(c) <= 8 for c in calls)
    assert sum(len(c) for c in calls) == 20
    assert len(calls) == 3  # 20 items, at most 8 per batch
    assert b.stats.batches == 3 and b.stats.items == 20 and b.stats.largest == 8


def test_runs_in_a_thread_and_loop_stays_responsive():
    threads: set[str] = set()

    def run_batch(items):
        threads.add(threading.current_thread().name)
        time.sleep(0.3)
        return items

    b = MicroBatcher(run_batch, max_batch=4, max_wait_ms=1)
    ticks = 0

    async def ticker():
        nonlocal ticks
        for _ in range(20):
            await asyncio.sleep(0.01)
            ticks += 1

    async def main():
        await asyncio.gather(b.submit([1]), ticker())

    asyncio.run(main())
    assert threading.main_thread().name not in threads
    assert ticks == 20


def test_groups_by_key_and_serves_the_oldest_first():
    calls: list[list[int]] = []
    gate = threading.Event()

    def run_batch(items):
        gate.wait(5)
        calls.append(list(items))
        return items

    b = MicroBatcher(run_batch, max_batch=3, max_wait_ms=0, key=lambda x: x)

    async def main():
        first = asyncio.create_task(b.submit([50]))  # occupies the worker while the rest queue up
        await asyncio.sleep(0.05)
        rest = asyncio.create_task(b.submit([1, 100, 2, 101, 3, 102]))
        await asyncio.sleep(0.05)
        gate.set()
        return await first, await rest

    first, rest = asyncio.run(main())
    assert first == [50] and rest == [1, 100, 2, 101, 3, 102]
    assert calls[0] == [50]
    assert sorted(calls[1]) == [1, 2, 3]  # the oldest (1) with the most similar lengths
    assert sorted(calls[2]) == [100, 101, 102]


def test_errors_reach_every_caller_of_the_batch_and_the_worker_survives():
    def run_batch(items):
        if "boom" in items:
            raise ValueError("bad batch")
        return items

    b = MicroBatcher(run_batch, max_batch=4, max_wait_ms=50)

    async def main():
        r = await asyncio.gather(b.submit(["boom"]), b.submit(["ok"]), return_exceptions=True)
        later = await b.submit(["fine"])
        return r, later

    r, later = asyncio.run(main())
    assert all(isinstance(x, ValueError) for x in r)
    assert later == ["fine"]


def test_works_across_event_loops_and_closes():
    b = MicroBatcher(lambda xs: xs, max_batch=2, max_wait_ms=0)
    assert asyncio.run(b.submit([1])) == [1]
    assert asyncio.run(b.submit([2, 3, 4])) == [2, 3, 4]

    async def close():
        await b.close()

    asyncio.run(close())
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(b.submit([5]))
    with pytest.raises(ValueError):
        MicroBatcher(lambda xs: xs, max_batch=0)
