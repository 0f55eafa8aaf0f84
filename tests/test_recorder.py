"""The recorder (drmas_bench.recorder): finished trajectories graded and written in threads of their
own, in batches by count or by age, with back-pressure on the event loop and errors handed back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from drmas_bench.recorder import Recorder


def test_batches_by_count_and_every_item_is_written_in_order():
    written: list[list[int]] = []
    rec = Recorder(lambda b: None, lambda b: written.append(list(b)), flush_every=4, flush_s=10.0)
    for i in range(10):
        rec.put(i)
    rec.close()
    rec.join(5)
    assert [x for b in written for x in b] == list(range(10))
    assert all(len(b) <= 4 for b in written) and rec.unwritten == 0 and rec.written == 10


def test_a_lone_item_is_written_within_flush_s():
    """One finished trajectory, nothing after it: on disk after about flush_s, not at the end."""
    when: list[float] = []
    rec = Recorder(lambda b: None, lambda b: when.append(time.monotonic()), flush_every=64, flush_s=0.2)
    t0 = time.monotonic()
    rec.put("one")
    deadline = t0 + 5
    while not when and time.monotonic() < deadline:
        time.sleep(0.01)
    assert when and 0.15 <= when[0] - t0 < 2.0
    rec.close()
    rec.join(5)


def test_writing_is_not_queued_behind_the_default_thread_pool():
    """The default pool (where retrievals run) fully blocked: batches still reach the writer."""
    written: list[int] = []
    release = threading.Event()

    async def main():
        loop = asyncio.get_running_loop()
        blockers = [loop.run_in_executor(None, release.wait) for _ in range(64)]  # every worker busy
        rec = Recorder(lambda b: None, lambda b: written.extend(b), flush_every=2, flush_s=0.05)
        for i in range(6):
            rec.put(i)
        for _ in range(200):
            if len(written) == 6:
                break
            await asyncio.sleep(0.01)
        got = list(written)
        release.set()
        await asyncio.gather(*blockers)
        await rec.finish()
        return got

    assert asyncio.run(main()) == list(range(6))


def test_room_waits_while_too_much_is_unwritten():
    gate = threading.Event()
    rec = Recorder(lambda b: gate.wait(5), lambda b: None, flush_every=1, flush_s=0.0, max_unwritten=3)

    async def main():
        for i in range(3):
            rec.put(i)
        waiter = asyncio.ensure_future(rec.room())
        await asyncio.sleep(0.1)
        blocked = not waiter.done()
        gate.set()
        await asyncio.wait_for(waiter, 5)
        await rec.finish()
        return blocked

    assert asyncio.run(main()) is True


def test_a_grading_error_is_raised_on_the_event_loop_side_and_nothing_after_it_is_written():
    written: list[int] = []

    def grade(batch):
        if 3 in batch:
            raise ValueError("grader broke")

    rec = Recorder(grade, lambda b: written.extend(b), flush_every=1, flush_s=0.0)
    for i in range(6):
        try:
            rec.put(i)
        except ValueError:
            break
    rec.close()
    with pytest.raises(ValueError, match="grader broke"):
        rec.join(5)
    assert written == [0, 1, 2]


def test_a_stop_while_finishing_still_writes_everything():
    """The waiting coroutine cancelled (SIGTERM in the CLI) while batches are graded: they are written."""
    written: list[int] = []
    rec = Recorder(lambda b: time.sleep(0.05), lambda b: written.extend(b), flush_every=2, flush_s=0.0)

    async def main():
        for i in range(10):
            rec.put(i)
        task = asyncio.ensure_future(rec.finish())
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert written == list(range(10))
