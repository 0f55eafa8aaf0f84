"""What every pool shares: the scheduler that applies the dispatch policy (``policy.py``) to the
worker groups (``groups.py``: their specs, records and counters), engine views for ``TeamRuntime``,
the pool's stats and peak-memory metering.

A backend (``LocalPool``, ``RayPool``) supplies five coroutines over an opaque *handle* per worker
group (an engine, an actor): ``_load``, ``_sleep``, ``_wake``, ``_generate``, ``_close_handle``.
The engines do the sleeping and waking; the pool only decides when.

Adopted engines and holding asleep (the trainer's rollouts): ``adopt.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Mapping

import drmas_bench.pool.policy as policy
from drmas_bench.pool.adopt import Adopted, HoldAsleep
from drmas_bench.pool.groups import Ticket, WorkerGroup
from drmas_bench.pool.memory import MemoryMeter, cuda_peak_bytes
from drmas_bench.pool.policy import ASLEEP, AWAKE, SLEEPING, WAKING, BudgetError, GroupState, Serve
from drmas_bench.types import Completion, Request, UserError


class PoolEngineView:
    """One worker group of a pool seen as an engine: ``await view.generate(requests)``. Put these in
    ``TeamRuntime``'s ``engines`` dict (``pool.views()``); closing a view does nothing (the pool owns
    the engine)."""

    name = "pool"

    def __init__(self, pool: "PoolBase", wg: str) -> None:
        self.pool = pool
        self.wg = wg
        self.model = pool._groups[wg].model

    async def generate(self, requests: list[Request]) -> list[Completion]:
        return await self.pool.generate(self.wg, requests)

    @property
    def is_awake(self) -> bool:
        return self.pool._groups[self.wg].state == AWAKE

    def footprint_bytes(self) -> int:
        return self.pool._groups[self.wg].footprint or 0

    async def close(self) -> None:
        """No-op: ``await pool.close()`` closes the engines."""

    def __repr__(self) -> str:
        return f"PoolEngineView({self.wg!r}, model={self.model!r})"


class PoolBase(HoldAsleep):
    """Owns the worker groups of a run and their engines; wakes and sleeps them on demand under a
    memory budget (see ``policy.py`` for the rules).

    Options (keyword arguments):

    - ``budget_bytes``: bytes the awake engines may occupy together (accelerator memory, or host
      memory on CPU); ``None``: unlimited.
    - ``budget_models``: the budget as a number of engines, resolved to bytes as
      ``budget_models x`` the largest footprint measured so far (handy when the footprint is only
      known after loading). Give at most one of the two.
    - ``max_awake``: most engines resident at once (``None``: no limit).
    - ``max_wait_s``: a group whose oldest request waited this long is served next (``None``: off,
      the pure most-pending rule).
    - ``preload``: ``start()`` loads every engine once, in order, sleeping earlier ones as the
      budget requires (errors such as a model larger than the budget surface at start).
    - ``meter_interval_s``: RSS sampling period of the peak-memory meter.
    - ``timeline_max``: most events kept in ``pool.timeline`` (``(t, event, worker group)``; events
      ``load``/``loaded``, ``wake``/``awake``, ``sleep``/``asleep``, ``serve``/``served``, ``wait``).

    Use from ONE event loop: ``async with Pool(...) as pool: ...`` (or ``await pool.start()`` /
    ``await pool.close()``).
    """

    kind = "base"

    def __init__(
        self,
        groups: Mapping[str, Any],
        *,
        budget_bytes: int | None = None,
        budget_models: float | None = None,
        max_awake: int | None = None,
        max_wait_s: float | None = None,
        preload: bool = True,
        meter_interval_s: float = 0.02,
        timeline_max: int = 10_000,
    ) -> None:
        if not groups:
            raise UserError("a pool needs at least one worker group")
        if budget_bytes is not None and budget_models is not None:
            raise UserError("give the pool budget_bytes or budget_models, not both")
        if budget_bytes is not None and budget_bytes <= 0:
            raise UserError(f"pool budget_bytes must be > 0, got {budget_bytes}")
        if budget_models is not None and budget_models <= 0:
            raise UserError(f"pool budget_models must be > 0, got {budget_models}")
        if max_awake is not None and max_awake < 1:
            raise UserError(f"pool max_awake must be >= 1, got {max_awake}")
        self._budget_bytes = budget_bytes
        self.budget_models = budget_models
        self.max_awake = max_awake
        self.max_wait_s = max_wait_s
        self.preload = preload
        self._groups: dict[str, WorkerGroup] = {}
        for name, spec in groups.items():
            g = WorkerGroup(name=name, spec=spec, model=str(getattr(spec, "model", "") or ""))
            g.hint = getattr(spec, "footprint_hint", None)
            if isinstance(spec, Adopted):  # in place, in the state it was handed over: no load
                g.adopted, g.handle, g.footprint = True, spec.engine, int(spec.footprint)
                g.state = AWAKE if spec.awake else ASLEEP
            self._groups[name] = g
        self.meter = MemoryMeter(meter_interval_s)
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._closed = False
        self._rounds: set[asyncio.Task] = set()
        self._waiting: policy.Wait | None = None
        self._peak_resident = 0
        self._errors: list[str] = []
        self._t0 = time.perf_counter()
        # (seconds since the pool was made, event, worker group); events: load, loaded, wake, awake,
        # sleep, asleep, serve, served, wait (the policy's Wait: group = the one waiting)
        self.timeline: deque[tuple[float, str, str]] = deque(maxlen=timeline_max)

    # ------------------------------------------------------------------ backend hooks

    async def _load(self, g: WorkerGroup) -> tuple[Any, int]:
        """Create the engine of ``g``; return (handle, footprint bytes)."""
        raise NotImplementedError

    async def _sleep(self, g: WorkerGroup) -> Any:
        """Put ``g`` to sleep; return its handle afterwards (``None``: released, reload on wake)."""
        raise NotImplementedError

    async def _wake(self, g: WorkerGroup) -> Any:
        """Wake ``g`` (its handle is not None); return the handle."""
        raise NotImplementedError

    async def _generate(self, g: WorkerGroup, requests: list[Request]) -> list[Completion]:
        raise NotImplementedError

    async def _close_handle(self, g: WorkerGroup) -> None:
        raise NotImplementedError

    async def _backend_start(self) -> None:
        """Backend set-up before any load (RayPool: the placement group)."""

    async def _backend_close(self) -> None:
        """Backend tear-down after every engine is closed."""

    def _memory_stats(self) -> dict[str, Any]:
        return {"peak_rss_bytes": self.meter.peak_rss, "peak_cuda_bytes": cuda_peak_bytes()}

    # ------------------------------------------------------------------ public API

    @property
    def groups(self) -> list[str]:
        return list(self._groups)

    @property
    def budget_bytes(self) -> int | None:
        """The budget in bytes (``budget_models`` resolved with the largest footprint so far)."""
        if self.budget_models is None:
            return self._budget_bytes
        largest = self._largest_footprint()
        return None if largest is None else int(self.budget_models * largest)

    def view(self, wg: str) -> PoolEngineView:
        """An engine-like view of worker group ``wg`` (``async generate(requests)``)."""
        self._group(wg)
        return PoolEngineView(self, wg)

    def views(self) -> dict[str, PoolEngineView]:
        """``{worker group: view}``: a drop-in ``engines`` dict for ``TeamRuntime``."""
        return {name: PoolEngineView(self, name) for name in self._groups}

    async def start(self) -> "PoolBase":
        """Start metering, set up the backend and (``preload``) load every engine once, in order."""
        if self._closed:
            raise UserError(f"{type(self).__name__} is closed")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return self
            self.meter.start()
            try:
                await self._backend_start()
            except BaseException:
                await self.close()
                raise
            self._started = True
        if self.preload:
            try:
                for name in self._groups:
                    await self.warm(name)
            except BaseException:
                await self.close()
                raise
        return self

    async def warm(self, wg: str) -> None:
        """Make sure ``wg`` is loaded and awake now (scheduled like a request, so the budget holds)."""
        await self._submit(self._group(wg), [])

    async def generate(self, wg: str, requests: list[Request]) -> list[Completion]:
        """One Completion per Request of worker group ``wg``, in order; waits for the group's turn."""
        g = self._group(wg)
        if not requests:
            return []
        if not self._started:
            await self.start()
        return await self._submit(g, list(requests))

    def stats(self) -> dict[str, Any]:
        """Counters for the run summary (all JSON-serialisable)."""
        groups = {name: g.stats() for name, g in self._groups.items()}
        tot = lambda k: sum(v[k] for v in groups.values())  # noqa: E731
        mem = self._memory_stats()
        cuda = mem.get("peak_cuda_bytes")
        return {
            "pool": self.kind,
            "budget_bytes": self.budget_bytes,
            "budget_models": self.budget_models,
            "max_awake": self.max_awake,
            "wakes": tot("wakes"),
            "sleeps": tot("sleeps"),
            "loads": tot("loads"),
            "wake_s": round(tot("wake_s"), 4),
            "load_s": round(tot("load_s"), 4),
            "sleep_s": round(tot("sleep_s"), 4),
            "requests": tot("requests"),
            "peak_resident_bytes": self._peak_resident,
            **mem,
            "peak_memory_bytes": cuda if cuda is not None else mem.get("peak_rss_bytes"),
            "peak_memory_kind": "cuda_max_allocated" if cuda is not None else "rss",
            "errors": list(self._errors),
            "groups": groups,
        }

    async def close(self) -> None:
        """Fail queued requests, let running rounds finish, close every engine, stop metering."""
        if self._closed:
            return
        self._closed = True
        err = UserError(f"{type(self).__name__} was closed before the request was served")
        for g in self._groups.values():
            while g.tickets:
                t = g.tickets.popleft()
                if not t.future.done():
                    t.future.set_exception(err)
        if self._rounds:
            await asyncio.gather(*list(self._rounds), return_exceptions=True)
        for g in self._groups.values():
            for task in (g.wake_task, g.sleep_task):
                if task is not None and not task.done():
                    await asyncio.gather(task, return_exceptions=True)
        for g in self._groups.values():
            if g.adopted:  # its owner closes it; the pool lets go
                g.handle = None
                continue
            if g.handle is not None:
                try:
                    await self._close_handle(g)
                except Exception as exc:  # keep closing the others
                    self._errors.append(f"{g.name}: close failed: {type(exc).__name__}: {exc}")
                g.handle = None
            g.state = ASLEEP
        await self._backend_close()
        self.meter.stop()

    async def __aenter__(self) -> "PoolBase":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ scheduling

    def _group(self, wg: str) -> WorkerGroup:
        if wg not in self._groups:
            raise UserError(f"unknown worker group {wg!r}; the pool has: {', '.join(self._groups)}")
        return self._groups[wg]

    def _largest_footprint(self) -> int | None:
        known = [g.footprint for g in self._groups.values() if g.footprint is not None]
        return max(known) if known else None

    def _limits(self) -> tuple[int | None, int | None]:
        """(budget bytes, max awake) for the policy. With ``budget_models`` and no footprint measured
        yet, only one engine may load at a time (its footprint then sizes the budget)."""
        budget = self.budget_bytes
        if self.budget_models is not None and budget is None:
            return None, 1
        return budget, self.max_awake

    def _snapshot(self) -> list[GroupState]:
        budget = self.budget_bytes
        largest = self._largest_footprint()
        out = []
        for g in self._groups.values():
            fp = policy.estimate_footprint(g.footprint, hint=g.hint, largest_known=largest, budget=budget)
            oldest = g.tickets[0].t if g.tickets else float("inf")
            out.append(GroupState(g.name, fp, g.state, g.serving, g.pending, oldest, g.last_used, g.held))
        return out

    async def _submit(self, g: WorkerGroup, requests: list[Request]) -> list[Completion]:
        if self._closed:
            raise UserError(f"{type(self).__name__} is closed")
        fut = asyncio.get_running_loop().create_future()
        ticket = Ticket(requests, fut, time.monotonic())
        g.tickets.append(ticket)
        self._kick()
        try:
            return await fut
        except asyncio.CancelledError:  # the caller gave up: do not serve (or count) its requests
            if ticket in g.tickets:
                g.tickets.remove(ticket)
                self._kick()
            raise

    def _kick(self) -> None:
        """Apply policy decisions until the policy says wait or there is nothing pending."""
        if self._closed:
            return
        while True:
            try:
                budget, max_awake = self._limits()
                d = policy.decide(self._snapshot(), budget, max_awake=max_awake,
                                  now=time.monotonic(), max_wait_s=self.max_wait_s)
            except BudgetError as exc:
                g = self._groups[exc.group]
                g.counters.errors += len(g.tickets)
                self._fail(g, exc)
                continue
            if isinstance(d, policy.Wait) and d != self._waiting:
                self._log("wait", d.group)
            self._waiting = d if isinstance(d, policy.Wait) else None
            if isinstance(d, policy.Sleep):
                for name in d.groups:
                    s = self._groups[name]
                    s.state = SLEEPING
                    s.sleep_task = asyncio.create_task(self._do_sleep(s))
                continue
            if not isinstance(d, Serve):
                return
            self._apply(d)

    def _log(self, event: str, wg: str) -> None:
        self.timeline.append((round(time.perf_counter() - self._t0, 4), event, wg))

    def _fail(self, g: WorkerGroup, exc: BaseException) -> None:
        while g.tickets:
            t = g.tickets.popleft()
            if not t.future.done():
                t.future.set_exception(exc)

    def _apply(self, d: Serve) -> None:
        g = self._groups[d.group]
        tickets = list(g.tickets)
        g.tickets.clear()
        now = time.monotonic()
        g.serving += 1
        g.last_used = now
        if d.wake:
            running_sleeps = [x.sleep_task for x in self._groups.values() if x.sleep_task is not None]
            for name in d.sleep:
                s = self._groups[name]
                s.state = SLEEPING
                s.sleep_task = asyncio.create_task(self._do_sleep(s))
                running_sleeps.append(s.sleep_task)
            g.state = WAKING
            g.wake_task = asyncio.create_task(self._do_wake(g, running_sleeps))
        self._note_resident()
        task = asyncio.create_task(self._round(g, tickets))
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    def _note_resident(self) -> None:
        largest = self._largest_footprint()
        used = sum(policy.estimate_footprint(g.footprint, hint=g.hint, largest_known=largest, budget=None)
                   for g in self._groups.values() if g.state in (AWAKE, WAKING))
        self._peak_resident = max(self._peak_resident, used)

    async def _do_sleep(self, g: WorkerGroup) -> None:
        t0 = time.perf_counter()
        self._log("sleep", g.name)
        try:
            g.handle = await self._sleep(g)
            self._log("asleep", g.name)
            g.state = ASLEEP
            g.counters.sleeps += 1
            g.counters.sleep_s += time.perf_counter() - t0
        except Exception as exc:
            g.state = AWAKE  # still holds its memory
            g.held = False  # not asked again (hold_asleep reports it)
            self._errors.append(f"{g.name}: sleep failed: {type(exc).__name__}: {exc}")
        finally:
            g.sleep_task = None
            self._kick()

    async def _do_wake(self, g: WorkerGroup, sleeps: list[asyncio.Task]) -> None:
        if sleeps:  # the budget must hold physically: the memory we take is freed first
            await asyncio.gather(*sleeps, return_exceptions=True)
        t0 = time.perf_counter()
        try:
            if g.handle is None:
                self._log("load", g.name)
                g.handle, fp = await self._load(g)
                self._log("loaded", g.name)
                g.footprint = int(fp)
                g.counters.loads += 1
                g.counters.load_s += time.perf_counter() - t0
                budget = self.budget_bytes
                if budget is not None and g.footprint > budget:
                    exc = BudgetError(g.name, g.footprint, budget)
                    await self._sleep_quietly(g)
                    raise exc
            else:
                self._log("wake", g.name)
                g.handle = await self._wake(g)
                self._log("awake", g.name)
                g.counters.wakes += 1
                g.counters.wake_s += time.perf_counter() - t0
            g.state = AWAKE
            self._note_resident()
        except BaseException:
            g.state = ASLEEP
            raise
        finally:
            self._kick()

    async def _sleep_quietly(self, g: WorkerGroup) -> None:
        try:
            g.handle = await self._sleep(g)
        except Exception as exc:  # pragma: no cover - best effort
            self._errors.append(f"{g.name}: sleep failed: {type(exc).__name__}: {exc}")

    async def _round(self, g: WorkerGroup, tickets: list[Ticket]) -> None:
        start = time.monotonic()
        try:
            wake = g.wake_task
            if wake is not None:
                try:
                    await asyncio.shield(wake)
                except BaseException as exc:
                    g.counters.errors += sum(len(t.requests) for t in tickets)
                    for t in tickets:
                        if not t.future.done():
                            t.future.set_exception(exc)
                    return
            work = [t for t in tickets if t.requests]
            for t in tickets:
                if not t.requests and not t.future.done():
                    t.future.set_result([])  # a warm-up ticket: awake is all it asked for
            for t in work:
                g.counters.queue_s += (start - t.t) * len(t.requests)
            if not work:
                return
            g.counters.rounds += 1
            g.counters.requests += sum(len(t.requests) for t in work)
            self._log("serve", g.name)
            results = await asyncio.gather(*(self._generate(g, t.requests) for t in work), return_exceptions=True)
            self._log("served", g.name)
            for t, r in zip(work, results):
                if t.future.done():
                    continue
                if isinstance(r, BaseException):
                    g.counters.errors += len(t.requests)
                    t.future.set_exception(r)
                else:
                    t.future.set_result(r)
        finally:
            g.serving -= 1
            g.last_used = time.monotonic()
            if g.wake_task is not None and g.wake_task.done():
                g.wake_task = None
            self._kick()

