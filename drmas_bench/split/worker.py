"""A split run's worker: the team's engines, the retriever and the call cache of one plan, playing the
episodes its coordinator hands it and sending each finished trajectory back (``drmas_bench.split``).

    core = WorkerCore(blob, index)      # blob: ``plan_blob(plan)``, the plan as the coordinator holds it
    await core.start()                  # opens the call cache, the retriever, the pool of engines
    core.play([(item, task_index, sample_idx), ...])
    results = await core.take(0.2)      # [(item, trajectory or None, error or None), ...]
    stats = await core.close()          # the pool's stats

Two hosts run a ``WorkerCore``: :func:`process_main`, a spawned process talking over a pipe (the
default), and :class:`SplitActor`, a Ray actor whose methods the coordinator calls. Each episode is
played by ``runner.play``, the function the one-process run plays it with, so a record does not
depend on where it was played: every call's seed derives from the run seed and the (task, sample,
agent, turn) (``workflows.base.sample_seed``). A trajectory travels without its task (the
coordinator holds the tasks and puts it back). Grading, writing and the summary stay with the
coordinator.

A worker ignores SIGINT, SIGTERM and SIGHUP: the coordinator (which a Ctrl-C or ``timeout`` reaches
as well) decides when it stops, after keeping what finished. A process worker whose coordinator is
gone (its pipe closed) cancels its episodes and exits.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import queue
import resource
import signal
import threading
import traceback
from dataclasses import replace
from typing import Any

from drmas_bench import runner
from drmas_bench.benchmarks.catalog import get_benchmark
from drmas_bench.call_cache import CallCache
from drmas_bench.calls import CallChain
from drmas_bench.engines import ENGINES
from drmas_bench.pool import make_pool, specs_from_team
from drmas_bench.retrievers import open_retriever
from drmas_bench.types import Trajectory
from drmas_bench.workflows import get_workflow

Result = tuple[int, Any, Any]  # (item id, trajectory without its task or None, exception or None)


def plan_blob(p: Any) -> bytes:
    """What a worker is built from, pickled once for every worker: the plan (``drmas_bench.plan.Plan``)
    with its workflow and benchmarks by name (they hold functions made by their registries, looked up
    again in the worker: ``plan_from_blob``), and the engine registry's entries of its worker groups (a
    backend registered at run time, as a test double is, is known in the worker too)."""
    kinds = {g.engine for g in p.team.worker_groups.values()}
    light = replace(p, resolved=replace(p.resolved, benches=[], wf=None))
    return pickle.dumps({"plan": light, "workflow": p.wf.name, "benchmarks": [b.name for b in p.benches],
                         "engines": {k: ENGINES.entry(k) for k in kinds if k in ENGINES}})


def plan_from_blob(blob: bytes) -> Any:
    """The plan ``plan_blob`` packed, its workflow and benchmarks from this process's registries."""
    doc = pickle.loads(blob)
    for kind, entry in doc["engines"].items():  # the built-in ones are registered here already
        if kind not in ENGINES:
            ENGINES.register(kind, entry)
    p = doc["plan"]
    benches = [get_benchmark(name) for name in doc["benchmarks"]]
    return replace(p, resolved=replace(p.resolved, benches=benches, wf=get_workflow(doc["workflow"])))


def sendable(exc: BaseException, index: int) -> BaseException:
    """``exc`` as the coordinator will raise it: its traceback here kept as a note (a pickled exception
    loses its traceback), or a RuntimeError with its text when it cannot be pickled."""
    note = f"raised in split worker {index} (PID {os.getpid()}):\n" + "".join(
        traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        setattr(exc, "__notes__", [*getattr(exc, "__notes__", ()), note])  # what add_note keeps (3.11+)
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001 - an exception that does not pickle travels as its text
        out = RuntimeError(f"{type(exc).__name__}: {exc}")
        setattr(out, "__notes__", [note])
        return out


class WorkerCore:
    """One worker's engines and episodes (see the module docstring)."""

    def __init__(self, blob: bytes, index: int) -> None:
        self.p, self.index = plan_from_blob(blob), index
        self._running: set[asyncio.Future] = set()
        self._results: list[Result] = []
        self._ready = asyncio.Event()
        self._pool: Any = None
        self._cache: CallCache | None = None
        self._retriever: Any = None
        self.ctx: runner.EpisodeRun | None = None

    async def start(self) -> dict[str, Any]:
        """Open the call cache, the retriever and the pool (the engines that fit its budget load now)."""
        p = self.p
        if p.call_cache_dir:
            self._cache = CallCache.open(p.call_cache_dir)
        if p.retriever_spec:
            self._retriever = open_retriever(p.retriever_spec)
        opts = {"preload": False} if self._cache is not None else {}
        self._pool = make_pool("local", specs_from_team(p.team), budget_models=p.cfg.pool_budget, **opts)
        await self._pool.__aenter__()
        chain = CallChain(prices=p.prices, call_cache=self._cache)
        engines = chain.wrap(self._pool.views(), p.team, p.config_doc["identity"]["models"])
        self.ctx = runner.eval_run(p, runner.TeamRuntime(p.team, engines, p.sampling), None, self._retriever, chain)
        return {"pid": os.getpid()}

    def play(self, items: list[tuple[int, int, int]]) -> None:
        """Start one episode per (item id, task index, sample index); each result waits for ``take``."""
        for item, task_index, sample_idx in items:
            fut = asyncio.ensure_future(self._one(item, task_index, sample_idx))
            self._running.add(fut)
            fut.add_done_callback(self._running.discard)

    async def _one(self, item: int, task_index: int, sample_idx: int) -> None:
        assert self.ctx is not None
        try:
            traj: Trajectory = await runner.play(self.ctx, self.ctx.runtime, self.p.tasks[task_index], sample_idx)
            traj.task = None  # type: ignore[assignment]  # the coordinator puts its own copy back
            self._results.append((item, traj, None))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the coordinator raises it where the one-process run would
            self._results.append((item, None, sendable(e, self.index)))
        self._ready.set()

    async def take(self, wait_s: float) -> list[Result]:
        """The results finished since the last call; waits up to ``wait_s`` for a first one."""
        if not self._results:
            try:
                await asyncio.wait_for(self._ready.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
        self._ready.clear()
        out, self._results = self._results, []
        return out

    async def close(self) -> dict[str, Any]:
        """Cancel the episodes still running, close the engines, the retriever and the cache; the pool's
        stats (``peak_rss_bytes``: this process's, sampled) and this process's PID and CPU seconds."""
        for fut in list(self._running):
            fut.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        stats: dict[str, Any] = {}
        try:
            if self._pool is not None:
                await self._pool.__aexit__(None, None, None)
                stats = self._pool.stats()
        finally:
            close = getattr(self._retriever, "close", None)
            if callable(close):
                close()
            if self._cache is not None:
                self._cache.close()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {**stats, "process": {"pid": os.getpid(), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}}


# ------------------------------------------------------------------------------- a spawned process


def _ignore_stop_signals() -> None:
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def process_main(conn: Any, blob: bytes, index: int) -> None:
    """A spawned worker process: serve ``conn`` (a ``multiprocessing`` pipe) until told to stop or the
    coordinator is gone. Messages in: ``("play", items)``, ``("stop",)``; out: ``("ready", info)`` or
    ``("failed", exception)``, then ``("results", [...])`` as episodes finish, and ``("closed", stats)``."""
    from tqdm import tqdm

    _ignore_stop_signals()
    # the bars a library draws here (the retriever's) lock with a thread lock: tqdm's default also makes a
    # named semaphore, which a worker killed with SIGKILL would leave to a warning at the coordinator's exit
    tqdm.set_lock(threading.RLock())
    outbox: queue.Queue = queue.Queue()

    def send() -> None:  # its own thread: a full pipe never blocks the episodes or the reading of commands
        while (msg := outbox.get()) is not None:
            try:
                conn.send(msg)
            except (OSError, EOFError):
                return

    sender = threading.Thread(target=send, name="drmas-split-send", daemon=True)
    sender.start()
    try:
        asyncio.run(_serve(conn, blob, index, outbox))
    finally:
        outbox.put(None)
        sender.join(30)


async def _serve(conn: Any, blob: bytes, index: int, outbox: queue.Queue) -> None:
    loop = asyncio.get_running_loop()
    try:
        core = WorkerCore(blob, index)
        outbox.put(("ready", await core.start()))
    except BaseException as e:  # noqa: BLE001 - the coordinator names this worker and says why
        outbox.put(("failed", sendable(e, index)))
        return
    stop = asyncio.Event()

    def readable() -> None:
        try:
            while conn.poll():
                msg = conn.recv()
                if msg[0] == "play":
                    core.play(msg[1])
                else:
                    stop.set()
        except (EOFError, OSError):  # the coordinator is gone
            stop.set()
        if stop.is_set():
            loop.remove_reader(conn.fileno())

    loop.add_reader(conn.fileno(), readable)
    while not stop.is_set():
        results = await core.take(0.05)
        if results:
            outbox.put(("results", results))
    outbox.put(("closed", await core.close()))


# ------------------------------------------------------------------------------- a Ray actor


class SplitActor:
    """A ``WorkerCore`` behind Ray actor methods (the coordinator wraps this class with ``ray.remote``;
    its async methods make it an asyncio actor, so ``take`` waits while episodes run)."""

    def __init__(self) -> None:
        self.core: WorkerCore | None = None

    async def start(self, blob: bytes, index: int) -> dict[str, Any]:
        self.core = WorkerCore(blob, index)
        try:
            return await self.core.start()
        except BaseException as e:  # noqa: BLE001 - raised in the coordinator with this worker's note
            raise sendable(e, index) from None

    async def play(self, items: list[tuple[int, int, int]]) -> None:
        assert self.core is not None
        self.core.play(items)

    async def take(self, wait_s: float) -> list[Result]:
        assert self.core is not None
        return await self.core.take(wait_s)

    async def close(self) -> dict[str, Any]:
        return await self.core.close() if self.core is not None else {}
