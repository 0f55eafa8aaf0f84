"""Finished trajectories to disk, off the event loop: grading and writing each in a thread of its own.

    rec = Recorder(grade, write, flush_every=16, flush_s=1.0)
    rec.put(trajectory)          # from the event loop, as each episode finishes; never blocks
    await rec.room()             # before starting another episode: waits while too much is unwritten
    rec.close(); rec.join()      # at the end (or on a stop): everything put is graded and written

Episodes finish on the event loop; their retrievals (and any other blocking work of the workflows) run
in asyncio's default thread pool. Grading and writing do not: the grader thread takes finished
trajectories from its own queue, in batches of ``flush_every`` or whatever has waited ``flush_s`` since
the oldest of them finished, grades them (``grade(batch)``: rewards, prices) and hands each batch to
the writer thread's queue, which appends it (``write(batch)``: one write and one fsync per batch). So a
finished episode reaches the disk within ``flush_s`` plus one grading and one write of a batch,
however many retrievals are queued, and a kill loses at most the episodes still running plus those
in these two queues (``unwritten``, which the runner keeps below ``max_unwritten`` by waiting before it
starts new episodes). A trajectory is referenced by nothing here once written.

An exception in either thread stops it; the next ``put``, ``room`` or ``join`` raises it in the
caller. Batches graded before a grading error are still written; the failed batch and those behind it
are not (the run stops, and a re-run redoes them).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Callable

_CLOSE = object()  # the end of a queue


class Recorder:
    """Grade-then-write pipeline of finished trajectories (see the module docstring).

    grade: fills each trajectory of a batch in place (reward, extra, cost), run in the grader thread;
    write: stores a graded batch (None: nothing to store), run in the writer thread; after_write:
    called in the writer thread with each stored batch (a trainer collecting them)."""

    def __init__(self, grade: Callable[[list[Any]], None], write: Callable[[list[Any]], Any] | None, *,
                 flush_every: int = 16, flush_s: float = 1.0, max_unwritten: int = 256,
                 after_write: Callable[[list[Any]], None] | None = None) -> None:
        self._grade, self._write, self._after = grade, write, after_write
        self.flush_every, self.flush_s, self.max_unwritten = max(1, flush_every), flush_s, max(1, max_unwritten)
        self._to_grade: queue.Queue = queue.Queue()
        self._to_write: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._unwritten = 0
        self.written = 0
        self.error: BaseException | None = None
        self._threads = [threading.Thread(target=self._grader, name="drmas-grader", daemon=True),
                         threading.Thread(target=self._writer, name="drmas-writer", daemon=True)]
        for t in self._threads:
            t.start()
        self._closed = False

    # ------------------------------------------------------------------ the event loop's side

    @property
    def unwritten(self) -> int:
        """Trajectories put and not yet written."""
        return self._unwritten

    def put(self, traj: Any) -> None:
        """Queue one finished trajectory for grading and writing (never blocks)."""
        self._raise()
        with self._lock:
            self._unwritten += 1
        self._to_grade.put((time.monotonic(), traj))

    async def room(self) -> None:
        """Wait (polling every 5 ms) while ``max_unwritten`` or more trajectories are unwritten."""
        while self._unwritten >= self.max_unwritten:
            self._raise()
            await asyncio.sleep(0.005)
        self._raise()

    def close(self) -> None:
        """No more puts: the threads write what they hold and stop."""
        if not self._closed:
            self._closed = True
            self._to_grade.put(_CLOSE)

    def join(self, timeout: float | None = None) -> None:
        """Block until both threads have stopped (after ``close``); raise what stopped either."""
        for t in self._threads:
            t.join(timeout)
        self._raise()

    async def finish(self) -> None:
        """``close`` and wait for everything put to be written, without blocking the event loop; a
        cancellation while waiting still waits (finished work is kept) and is then re-raised."""
        self.close()
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def resolve() -> None:
            if not done.done():
                done.set_result(None)

        def wait() -> None:  # its own thread: the default pool may be busy with retrievals
            self._join_threads()
            loop.call_soon_threadsafe(resolve)

        threading.Thread(target=wait, name="drmas-recorder-join", daemon=True).start()
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            self._join_threads()
            raise
        self._raise()

    # ------------------------------------------------------------------ the threads

    def _join_threads(self) -> None:
        for t in self._threads:
            t.join()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _grader(self) -> None:
        try:
            closing = False
            while not closing:
                first = self._to_grade.get()
                if first is _CLOSE:
                    break
                batch = [first[1]]
                deadline = first[0] + self.flush_s
                while len(batch) < self.flush_every:
                    try:
                        item = self._to_grade.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                    if item is _CLOSE:
                        closing = True
                        break
                    batch.append(item[1])
                self._grade(batch)
                self._to_write.put(batch)
        except BaseException as e:  # noqa: BLE001 - handed to the event loop's side
            self.error = e
        finally:
            self._to_write.put(_CLOSE)

    def _writer(self) -> None:
        try:
            while True:
                batch = self._to_write.get()
                if batch is _CLOSE:
                    break
                if self._write is not None:
                    self._write(batch)
                if self._after is not None:
                    self._after(batch)
                with self._lock:
                    self._unwritten -= len(batch)
                    self.written += len(batch)
        except BaseException as e:  # noqa: BLE001 - handed to the event loop's side
            self.error = e
