"""The coordinating side of a split run: start the workers, deal them the episodes, take back each
finished trajectory for the runner to record (``drmas_bench.split``'s docstring says what is kept where).

    stats, pool_stats = await run_split(plan, store, run)   # run: runner.run_episodes with api's error lines

:class:`Dispatcher` is the runner's ``EpisodeRun.remote``: each ``play(task, idx)`` goes to the live
worker with the fewest episodes outstanding (so a slow worker is dealt fewer), in one message per
worker per turn of the event loop, and resolves when the trajectory comes back. A worker that dies
fails the episodes it held with one line naming it, and the run stops as at an episode's error: what
finished is written, the same command resumes. :class:`ProcessWorker` hosts a worker in a spawned
process (``worker.process_main``, a pipe each way), :class:`RayWorker` in a Ray actor
(``worker.SplitActor``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
from typing import Any, Awaitable, Callable

from drmas_bench import runner
from drmas_bench.calls import CallChain
from drmas_bench.log import one_line
from drmas_bench.pool.cluster import import_ray, init_ray, ray_address
from drmas_bench.pool.ray_pool import ray_error_line
from drmas_bench.signals import signal_name
from drmas_bench.split.worker import Result, SplitActor, plan_blob, process_main
from drmas_bench.types import Task, Trajectory, UserError

logger = logging.getLogger(__name__)

Deliver = Callable[[int, list[Result]], None]
Died = Callable[[int, BaseException], None]


class Dispatcher:
    """Deals episodes to workers and resolves each with the trajectory a worker sends back."""

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = tasks
        self._task_index = {(t.benchmark, t.id): i for i, t in enumerate(tasks)}
        self._waiting: dict[int, tuple[asyncio.Future, int, int]] = {}  # item -> (future, worker, task index)
        self._flush_due = False
        self._ids = itertools.count()
        self.failure: BaseException | None = None
        self.attach([])

    def attach(self, workers: list[Any]) -> None:
        """The workers to deal to (each with ``send(items)``; they report back to ``deliver`` / ``died``)."""
        self.workers = workers
        self._outgoing: list[list[tuple[int, int, int]]] = [[] for _ in workers]
        self.load = [0] * len(workers)  # episodes dealt and not back, per worker
        self.episodes = [0] * len(workers)  # trajectories each worker sent back

    async def play(self, task: Task, idx: int) -> Trajectory:
        if self.failure is not None:
            raise self.failure
        w = min(range(len(self.workers)), key=self.load.__getitem__)
        item, ti = next(self._ids), self._task_index[(task.benchmark, task.id)]
        fut = asyncio.get_running_loop().create_future()
        self._waiting[item] = (fut, w, ti)
        self.load[w] += 1
        self._outgoing[w].append((item, ti, idx))
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)
        try:
            return await fut
        finally:
            if self._waiting.pop(item, None) is not None:  # cancelled (a stop): a late result is dropped
                self.load[w] -= 1

    def _flush(self) -> None:
        self._flush_due = False
        for w, items in enumerate(self._outgoing):
            if items:
                self._outgoing[w] = []
                self.workers[w].send(items)

    def deliver(self, w: int, results: list[Result]) -> None:
        """A worker's finished episodes: each trajectory gets its task back and resolves its ``play``."""
        for item, traj, err in results:
            entry = self._waiting.pop(item, None)
            if entry is None:
                continue
            fut, _, ti = entry
            self.load[w] -= 1
            if fut.done():
                continue
            if err is not None:
                fut.set_exception(err)
            else:
                traj.task = self.tasks[ti]
                self.episodes[w] += 1
                fut.set_result(traj)

    def died(self, w: int, err: BaseException) -> None:
        """Worker ``w`` is gone: no episode goes to it again, those it held fail with ``err``."""
        self.failure = self.failure or err
        self.load[w] = 1 << 60
        for item, (fut, held_by, _) in list(self._waiting.items()):
            if held_by == w:
                del self._waiting[item]
                if not fut.done():
                    fut.set_exception(err)


def _died_line(label: str, how: str) -> UserError:
    return UserError(f"{label} died ({how}) while playing episodes")


def _start_error(label: str, e: BaseException) -> BaseException:
    """A worker that could not start: a user's mistake stays one line naming the worker."""
    return UserError(f"{label} could not start: {e}") if isinstance(e, UserError) else e


class ProcessWorker:
    """One worker in a spawned process (spawn, not fork: the coordinator may hold torch and threads)."""

    def __init__(self, index: int, label: str, blob: bytes, deliver: Deliver, died: Died) -> None:
        self.index, self.label, self._blob, self._deliver, self._died = index, label, blob, deliver, died
        self._conn: Any = None
        self.proc: Any = None
        self._closing = False
        self._gone = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._started, self._closed = loop.create_future(), loop.create_future()
        mp = multiprocessing.get_context("spawn")
        self._conn, child = mp.Pipe()
        self.proc = mp.Process(target=process_main, args=(child, self._blob, self.index),
                               name=f"drmas-split-worker-{self.index}")
        self.proc.start()
        child.close()
        self.label += f" (PID {self.proc.pid})"
        loop.add_reader(self._conn.fileno(), self._readable)
        await self._started

    def _readable(self) -> None:
        try:
            while self._conn.poll():
                msg = self._conn.recv()
                if msg[0] == "results":
                    self._deliver(self.index, msg[1])
                elif msg[0] == "ready":
                    self._started.set_result(msg[1])
                elif msg[0] == "failed":
                    self._started.set_exception(_start_error(self.label, msg[1]))
                elif msg[0] == "closed" and not self._closed.done():
                    self._closed.set_result(msg[1])
        except (EOFError, OSError):
            self._on_gone()

    def _on_gone(self) -> None:
        self._gone = True
        asyncio.get_running_loop().remove_reader(self._conn.fileno())
        self.proc.join(5)
        code = self.proc.exitcode
        how = f"killed by {signal_name(-code)}" if code is not None and code < 0 else f"exit code {code}"
        err = _died_line(self.label, how)
        if not self._started.done():
            self._started.set_exception(err)
        if not self._closed.done():
            self._closed.set_result({})
        if not self._closing:
            self._died(self.index, err)

    def send(self, items: list[tuple[int, int, int]]) -> None:
        if not self._gone:
            try:
                self._conn.send(("play", items))
            except OSError:  # it died: its pipe's end says so to _readable
                pass

    async def close(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Ask the worker to stop (its running episodes are cancelled) and wait for it; its pool's stats."""
        self._closing = True
        if self.proc is None:
            return {}
        stats: dict[str, Any] = {}
        if not self._gone and self._started.done() and self._started.exception() is None:
            try:
                self._conn.send(("stop",))
                stats = await asyncio.wait_for(asyncio.shield(self._closed), timeout_s)
            except (OSError, asyncio.TimeoutError):
                pass
        await asyncio.get_running_loop().run_in_executor(None, self.proc.join, 10)
        if self.proc.is_alive():  # not started (a failed start elsewhere) or not stopping: ended here
            self.proc.kill()
            await asyncio.get_running_loop().run_in_executor(None, self.proc.join, 10)
        if not self._gone:
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
            self._gone = True
        self._conn.close()
        return stats


class RayWorker:
    """One worker in a Ray actor (``worker.SplitActor``); its finished episodes are polled with ``take``."""

    def __init__(self, index: int, label: str, blob: bytes, deliver: Deliver, died: Died,
                 options: dict[str, Any]) -> None:
        self.index, self.label, self._blob, self._deliver, self._died = index, label, blob, deliver, died
        self._options = options
        self.actor: Any = None
        self._poller: asyncio.Future | None = None
        self._closing = False

    async def start(self) -> None:
        ray = import_ray()
        self.actor = ray.remote(SplitActor).options(**self._options).remote()
        try:
            await self.actor.start.remote(self._blob, self.index)
        except ray.exceptions.RayTaskError as e:
            raise _start_error(self.label, e.cause if isinstance(e.cause, BaseException) else e) from None
        except ray.exceptions.RayError as e:
            raise _died_line(self.label, ray_error_line(e)) from None
        self._poller = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        while not self._closing:
            try:
                results = await self.actor.take.remote(0.2)
            except Exception as e:  # noqa: BLE001 - the actor (or its node) is gone
                if not self._closing:
                    self._died(self.index, _died_line(self.label, ray_error_line(e)))
                return
            if results:
                self._deliver(self.index, results)

    def send(self, items: list[tuple[int, int, int]]) -> None:
        self.actor.play.remote(items)  # a dead actor fails the next take, which says so

    async def close(self, timeout_s: float = 60.0) -> dict[str, Any]:
        self._closing = True
        if self.actor is None:
            return {}
        if self._poller is not None:
            self._poller.cancel()
        stats: dict[str, Any] = {}
        try:
            stats = await asyncio.wait_for(self.actor.close.remote(), timeout_s)
        except Exception:  # noqa: BLE001 - an actor that died or hangs is ended below all the same
            pass
        import_ray().kill(self.actor)
        return stats


def ray_options(n: int, address: str | None) -> tuple[dict[str, Any], bool]:
    """Start or attach Ray; each worker actor's options (one GPU each where the cluster has GPUs,
    else one CPU) and whether this call started Ray (then the caller shuts it down)."""
    ray = import_ray()
    started = init_ray(ray_address(address)) if not ray.is_initialized() else False
    gpus, cpus = ray.cluster_resources().get("GPU", 0), ray.cluster_resources().get("CPU", 0)
    if 0 < gpus < n or (not gpus and cpus < n):
        what = "GPU" if gpus else "CPU (the cluster has no GPU)"
        if started:
            ray.shutdown()
        raise UserError(f"--workers {n} --pool ray: each worker actor takes one {what} and the Ray cluster has "
                        f"{gpus if gpus else cpus:g}; on a CPU machine ray.init(num_gpus=N) declares logical GPUs")
    return {"num_gpus": 1 if gpus else 0, "num_cpus": 0 if gpus else 1}, started


async def run_split(p: Any, store: Any, run: Callable[[runner.EpisodeRun], Awaitable[runner.RunStats]]
                    ) -> tuple[runner.RunStats, dict[str, Any]]:
    """Run plan ``p``'s pending episodes over ``p.cfg.workers`` workers into ``store`` (the run
    directory, recorded here by ``run``: ``runner.run_episodes`` with the caller's error lines).
    -> (RunStats, the pool section: how the run was split and each worker's pool stats)"""
    cfg, n = p.cfg, p.cfg.workers
    backend = "ray" if cfg.pool == "ray" else "processes"
    blob = plan_blob(p)
    ray_started = False
    workers: list[Any] = []
    disp = Dispatcher(p.tasks)
    try:
        if backend == "ray":
            options, ray_started = ray_options(n, cfg.ray_address)
            workers += [RayWorker(i, f"split worker {i} of {n} (Ray actor)", blob, disp.deliver, disp.died, options)
                        for i in range(n)]
        else:
            workers += [ProcessWorker(i, f"split worker {i} of {n}", blob, disp.deliver, disp.died) for i in range(n)]
        disp.attach(workers)
        logger.info(f"[eval] starting {n} workers ({backend}), each with the team's engines")
        await asyncio.gather(*(w.start() for w in workers))
        logger.info("[eval] workers ready: " + ", ".join(w.label for w in workers))
        ctx = runner.eval_run(p, None, store, None, CallChain(prices=p.prices), remote=disp,
                              concurrency=cfg.concurrency * n)
        logger.info(f"[eval] {len(p.tasks)} questions x {cfg.n} samples over {n} workers, workflow {p.wf.name}, "
                    f"run dir {store.path}")
        stats = await run(ctx)
    finally:
        closed = await asyncio.gather(*(w.close() for w in workers), return_exceptions=True)
        if ray_started:
            import_ray().shutdown()
    worker_stats: list[dict[str, Any]] = [s if isinstance(s, dict) else {"errors": [one_line(s)]} for s in closed]
    split = {"workers": n, "backend": backend, "episodes_by_worker": list(disp.episodes)}
    return stats, {"split": split, "workers": worker_stats,
                   "groups": next((s["groups"] for s in worker_stats if s.get("groups")), {})}
