"""Batch math grading in worker processes with a hard per-item timeout.

`grade_math_many(pairs)` grades `(response, gold)` pairs with `grade_math` in a small pool of
worker processes and returns one `GradeResult` per pair, in input order. An item that uses more
than `timeout_s` seconds of its worker's **CPU time** (a pathological expression that makes sympy
hang) has its worker killed and is retried once, alone, with `RETRY_FACTOR` times the limit; only
an item that hits that too is recorded as `status="timeout"` and counted incorrect. The worker is
replaced and the rest of the batch carries on. CPU time, not wall time: on a loaded machine a
worker gets a fraction of a core and an item takes longer on the clock but not in CPU seconds,
so a verdict does not depend on what else the machine is doing. (Where a process's CPU time cannot
be read, `/proc` missing, wall time is the limit.) A worker that neither finishes nor uses CPU
(stopped, swapped out) is still killed after `WALL_CAP_FACTOR` times the limit in wall time. No
signals are used, so it works from any thread, a Ray actor, or a notebook.

How the pool works (`GradingPool`):

- N worker processes, each with its own pipe, started with multiprocessing's "forkserver" context
  (a clean server process imports sympy once and forks workers from it, so a start or restart
  takes milliseconds) or "spawn" where forkserver does not exist. Never plain "fork": forking a
  process that holds torch or CUDA threads is unsafe. Items with the same gold answer travel in
  the same chunks (`group_by_gold`), so each worker parses a gold once and reuses it from cache. The parent cuts the batch into chunks (a few to a few dozen
  items, to keep pipe traffic low) and sends a chunk to each idle worker.
- Before each item a worker writes (chunk id, position, start time, its CPU time) into a small
  shared-memory heartbeat. The parent reads the heartbeats and each busy worker's CPU time
  (`process_cpu_seconds`) to find any item past its limit, so the limit is per item even though
  work travels in chunks. Results come back at the end of a chunk, or
  every `FLUSH_S` seconds within a long chunk, so a kill loses little finished work.
- A stuck worker is killed (SIGKILL); its unfinished items (except the stuck one) go back to the
  front of the queue, and a fresh worker is spawned. A worker that dies by itself (a crash, the
  OOM killer) records its current item as `status="error"` the same way.

`grade_math_many` keeps one shared pool per worker count, started on first use and closed at
interpreter exit, so repeated calls pay the process start-up (about a second: Python + sympy)
once. Concurrent calls from several threads each get a pool of their own.

Works from any `__main__`: the workers never import the parent's `__main__` (multiprocessing normally
re-runs the main script in every "spawn"/"forkserver" child, which fails for a script fed on stdin,
whose `__main__.__file__` is "<stdin>", and re-enters a script that grades at import time). The
worker entry is a function of `grade_worker` (one worker process: what it runs, how it starts), so
nothing in `__main__` is needed: see `grade_worker.start_process`.
The one consequence: a custom `backend` function must live in an importable module, not in
`__main__` (refused with a ValueError that says so).
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import multiprocessing.spawn
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Sequence

from drmas_bench.grading.grade_worker import (
    GradeResult,
    check_backend_importable,
    process_cpu_seconds,
    start_process,
    worker_main,
)
from drmas_bench.grading.graders import get_backend, resolve_backend

# "forkserver" where the platform has it: one clean server process imports sympy once and forks
# each worker from it (fast start and restart, no inherited threads); "spawn" elsewhere.
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
PRELOAD = ["drmas_bench.grading.grading_workers", "drmas_bench.grading._warm"]  # _warm grades a few answers
POLL_S = 0.05  # the parent re-reads heartbeats at least this often
STARTUP_TIMEOUT_S = 120.0  # a worker that never starts an item within this is considered broken
MAX_STARTUP_FAILURES = 3
RETRY_FACTOR = 4.0  # an item past its CPU limit is graded once more, alone, with this many times the limit
WALL_CAP_FACTOR = 20.0  # wall-clock backstop per item, as a multiple of its CPU limit


@dataclass
class _Worker:
    proc: Any
    conn: Any
    heartbeat: Any
    started_at: float = 0.0  # when the process was started
    ready: bool = False  # the worker has imported everything and waits for work
    chunk: list[int] | None = None  # input indices of the chunk in flight
    chunk_id: int = -1
    received: int = 0  # results received for the chunk in flight (a prefix)

    def current_item(self) -> tuple[int, float] | None:
        """(position, start time) of the item this worker is grading now, if readable."""
        t0 = self.heartbeat[2]
        cid, pos = self.heartbeat[0], self.heartbeat[1]
        if t0 == 0.0 or t0 != self.heartbeat[2] or int(cid) != self.chunk_id:
            return None
        return int(pos), t0

    def item_cpu_seconds(self) -> float | None:
        """CPU seconds the worker has used on its current item; None when not measurable."""
        start = self.heartbeat[3]
        now = process_cpu_seconds(self.proc.pid) if start >= 0 else None
        return None if now is None else max(0.0, now - start)


@dataclass
class _Batch:
    pairs: Sequence[tuple[str, str]]
    backend: Any
    timeout_s: float | None
    results: list[GradeResult | None] = field(default_factory=list)
    queue: deque = field(default_factory=deque)  # chunks of input indices
    left: int = 0
    retried: set = field(default_factory=set)  # indices that hit their limit once: alone, larger limit

    def limit(self, idx: int) -> float | None:
        """The CPU-time limit of item `idx` (None: no limit)."""
        if self.timeout_s is None:
            return None
        return self.timeout_s * (RETRY_FACTOR if idx in self.retried else 1.0)


class GradingPool:
    """A pool of grading worker processes (see the module docstring).

    workers: number of processes (default: usable CPUs, at most 8).
    start_method: "forkserver" (default where available) or "spawn"; never "fork" (unsafe in a
      process that holds torch or CUDA threads).
    One batch at a time: `grade` is not meant to be called from two threads at once on the same
    pool (`grade_math_many` takes care of that). Use as a context manager, or call `close()`."""

    def __init__(self, workers: int | None = None, start_method: str = START_METHOD):
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start_method must be 'spawn' or 'forkserver', not {start_method!r}")
        self.size = max(1, workers or default_workers())
        self.ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self.ctx.set_forkserver_preload(PRELOAD)  # takes effect when the server first starts
        self.workers: list[_Worker] = []
        self.startup_failures = 0
        self._next_chunk_id = 0
        self._closed = False

    # -- lifecycle
    def __enter__(self) -> "GradingPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _spawn(self) -> _Worker:
        heartbeat = self.ctx.RawArray("d", 4)  # chunk id, position, wall start, CPU start
        parent_conn, child_conn = self.ctx.Pipe(duplex=True)
        proc = self.ctx.Process(target=worker_main, args=(child_conn, heartbeat), daemon=True, name="drmas-grader")
        start_process(proc)
        child_conn.close()
        return _Worker(proc, parent_conn, heartbeat, started_at=time.monotonic())

    def _discard(self, w: _Worker) -> None:
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(timeout=2)
        w.conn.close()
        self.workers.remove(w)

    def close(self) -> None:
        """Stop every worker (politely, then by force)."""
        if self._closed:
            return
        self._closed = True
        for w in self.workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 1.0
        for w in list(self.workers):
            w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            self._discard(w)

    # -- grading
    def grade(
        self,
        pairs: Iterable[tuple[str, str]],
        timeout_s: float | None = 5.0,
        backend: str | Callable[[str, str], bool] = "careful",
        chunk_size: int | None = None,
    ) -> list[GradeResult]:
        """Grade every (response, gold) pair; results in input order, one per pair.

        timeout_s: limit per item in seconds of the worker's CPU time (None: no limit); an item past
          it is retried once, alone, with RETRY_FACTOR times the limit before it is a "timeout".
        backend: a grader name from `registry.GRADERS` ("careful", "reference_compat", "math_verify")
          or a picklable function (extracted, gold) -> bool (given the careful extraction).
        chunk_size: items per message to a worker (default: adapted to the batch size)."""
        if self._closed:
            raise RuntimeError("this GradingPool is closed")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")

        get_backend(backend)  # an unknown name fails here, once, not in every worker
        check_backend_importable(backend)
        pairs = list(pairs)
        if not pairs:
            return []
        batch = _Batch(pairs, backend, timeout_s, results=[None] * len(pairs), left=len(pairs))
        size = chunk_size or max(1, min(128, len(pairs) // (self.size * 4)))
        order = group_by_gold(pairs)
        for start in range(0, len(order), size):
            batch.queue.append(order[start:start + size])
        try:
            self._run(batch)
        except BaseException:
            self._reset()  # a half-done batch leaves workers in unknown states
            raise
        return batch.results  # type: ignore[return-value]

    def _reset(self) -> None:
        for w in list(self.workers):
            self._discard(w)

    def _run(self, batch: _Batch) -> None:
        while batch.left:
            self._dispatch(batch)
            watched = [w for w in self.workers if w.chunk is not None or not w.ready]
            timeout = self._wait_time(watched, batch)
            ready = wait([w.conn for w in watched] + [w.proc.sentinel for w in watched], timeout=timeout)
            for w in watched:
                alive = self._drain(w, batch) if (w.conn in ready or w.proc.sentinel in ready) else True
                if not alive or (w.proc.sentinel in ready and not w.proc.is_alive()):
                    self._lost(w, batch, "error", "grading worker died")
                else:
                    self._check_deadline(w, batch)

    def _dispatch(self, batch: _Batch) -> None:
        """Start workers while there is more queued work than workers; feed the ready idle ones."""
        while len(self.workers) < min(self.size, len(batch.queue) + self._busy()):
            self.workers.append(self._spawn())
        for w in self.workers:
            if not batch.queue:
                return
            if not w.ready or w.chunk is not None:
                continue
            chunk = batch.queue.popleft()
            self._next_chunk_id += 1
            w.chunk, w.chunk_id, w.received = chunk, self._next_chunk_id, 0
            try:
                w.conn.send((w.chunk_id, batch.backend, [batch.pairs[i] for i in chunk]))
            except (OSError, ValueError):  # died while idle: the sentinel check reports it
                pass

    def _busy(self) -> int:
        return sum(w.chunk is not None for w in self.workers)

    def _wait_time(self, busy: list[_Worker], batch: _Batch) -> float:
        """Until the next poll, or sooner when an item could reach its limit (CPU seconds never run
        faster than the clock, so the wall time left is a lower bound)."""
        now, wait_s = time.monotonic(), POLL_S
        for w in busy:
            item = w.current_item()
            limit = batch.limit(w.chunk[item[0]]) if item is not None and w.chunk and item[0] < len(w.chunk) else None
            if limit is not None:
                used = w.item_cpu_seconds()
                wait_s = min(wait_s, limit - (now - item[1] if used is None else used))
        return max(0.0, wait_s)

    def _drain(self, w: _Worker, batch: _Batch) -> bool:
        """Take every message waiting from `w`; False when its pipe is closed (it died)."""
        try:
            while w.conn.poll():
                self._receive(w, w.conn.recv(), batch)
        except (EOFError, OSError):
            return False
        return True

    def _receive(self, w: _Worker, msg: tuple, batch: _Batch) -> None:
        if msg[0] == "ready":
            w.ready = True
            self.startup_failures = 0
            return
        if msg[0] == "fatal":
            raise RuntimeError(f"a grading worker cannot read its work: {msg[1]}")
        chunk_id, first_pos, results = msg
        if chunk_id != w.chunk_id or w.chunk is None:
            return
        for k, r in enumerate(results):
            idx = w.chunk[first_pos + k]
            if idx in batch.retried:
                r.attempts = 2
            batch.results[idx] = r
        batch.left -= len(results)
        w.received = first_pos + len(results)
        if w.received >= len(w.chunk):
            w.chunk = None

    def _check_deadline(self, w: _Worker, batch: _Batch) -> None:
        if not w.ready:
            if time.monotonic() - w.started_at > STARTUP_TIMEOUT_S:
                self._lost(w, batch, "error", f"grading worker did not start within {STARTUP_TIMEOUT_S:g} s")
            return
        item = w.current_item()
        if item is None or w.chunk is None or item[0] >= len(w.chunk):
            return
        limit = batch.limit(w.chunk[item[0]])
        if limit is None:
            return
        wall = time.monotonic() - item[1]
        cpu = w.item_cpu_seconds()
        if cpu is None and wall > limit:  # no CPU clock here: the wall clock is the limit
            self._lost(w, batch, "timeout", f"killed after {limit:g} s (wall clock)", item)
        elif cpu is not None and cpu > limit:
            self._lost(w, batch, "timeout", f"killed after {limit:g} s of CPU time", item)
        elif wall > WALL_CAP_FACTOR * limit:
            self._lost(w, batch, "timeout", f"killed after {wall:.3g} s wall clock ({cpu or 0:.3g} s of CPU time)", item)

    def _lost(self, w: _Worker, batch: _Batch, status: str, detail: str, item: tuple[int, float] | None = None) -> None:
        """Kill `w`; its current item gets `status`; its other unfinished items are re-queued."""
        was_ready = w.ready
        self._discard(w)
        if status == "error" and w.proc.exitcode is not None:
            detail += f" (exit code {w.proc.exitcode})"
        item = item or w.current_item()  # the heartbeat of a dead process no longer moves
        chunk = w.chunk or []
        if not was_ready:
            self.startup_failures += 1
            if self.startup_failures >= MAX_STARTUP_FAILURES:
                raise RuntimeError(f"grading workers keep failing to start: {detail}")
        if item is None:  # between items: nothing to blame, re-queue what is unfinished
            if chunk[w.received:]:
                batch.queue.appendleft(chunk[w.received:])
            return
        pos, t0 = item
        idx = chunk[pos]
        rest = chunk[w.received:pos] + chunk[pos + 1:]
        if rest:
            batch.queue.appendleft(rest)
        if status == "timeout" and idx not in batch.retried:  # once more, alone, with a larger limit
            batch.retried.add(idx)
            batch.queue.append([idx])
            return
        response, _ = batch.pairs[idx]

        attempts = 2 if idx in batch.retried else 1
        batch.results[idx] = GradeResult(False, status, resolve_backend(batch.backend)[0](response), time.monotonic() - t0,
                                         detail, attempts)
        batch.left -= 1


def group_by_gold(pairs: Sequence[tuple[str, str]]) -> list[int]:
    """Input indices with equal golds next to each other (golds in order of first appearance), so
    a chunk tends to hold one question's samples and a worker parses each gold once."""
    first: dict[str, int] = {}
    for i, (_, gold) in enumerate(pairs):
        first.setdefault(gold, i)
    return sorted(range(len(pairs)), key=lambda i: first[pairs[i][1]])


def default_workers() -> int:
    """Usable CPUs (the process's affinity where known), at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, min(8, n))


# -------------------------------------------------------------------------- the shared pools

_shared: dict[int, tuple[GradingPool, threading.Lock]] = {}
_shared_guard = threading.Lock()


def shutdown_shared_pools() -> None:
    """Stop the worker processes of `grade_math_many`'s shared pools (they restart on next use)."""
    with _shared_guard:
        for pool, lock in list(_shared.values()):
            got = lock.acquire(timeout=5.0)  # let a running batch finish, but never hang at exit
            try:
                pool.close()
            finally:
                if got:
                    lock.release()
        _shared.clear()


atexit.register(shutdown_shared_pools)


def grade_math_many(
    pairs: Iterable[tuple[str, str]],
    timeout_s: float | None = 5.0,
    workers: int | None = None,
    backend: str | Callable[[str, str], bool] = "careful",
) -> list[GradeResult]:
    """Grade (response, gold) pairs in worker processes with a hard per-item timeout.

    pairs: (model response, gold answer) pairs; the response's last boxed answer is graded.
    timeout_s: CPU seconds per item before its worker is killed; the item is graded once more,
      alone, with RETRY_FACTOR times that, and recorded as "timeout" if it hits that too (None: no
      limit).
    workers: worker processes (default: usable CPUs, at most 8).
    backend: a grader name from `registry.GRADERS`: "careful" (default) | "reference_compat" |
      "math_verify"; or a picklable module-level function (extracted answer, gold) -> bool.
    Returns one GradeResult per pair, in input order. Safe to call from any thread."""
    size = max(1, workers or default_workers())
    with _shared_guard:
        if size not in _shared or _shared[size][0]._closed:
            _shared[size] = (GradingPool(size), threading.Lock())
        pool, lock = _shared[size]
    if lock.acquire(blocking=False):
        try:
            return pool.grade(pairs, timeout_s=timeout_s, backend=backend)
        finally:
            lock.release()
    with GradingPool(size) as private:  # another thread is using the shared pool right now
        return private.grade(pairs, timeout_s=timeout_s, backend=backend)
