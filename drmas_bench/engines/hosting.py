"""Where an engine runs and which options it gets: the ONE place the pool and the trainer create engines.

    opts = fit_options("sglang", {"max_batch": 64, "device": "cuda", "dtype": "bfloat16"}, user_opts)
    engine = host_engine("sglang", "Qwen/Qwen3-4B", **opts)   # a ChildEngine: SGLang in its own process
    engine = host_engine("hf", "tiny-random", max_batch=16)   # an HFEngine in this process

- ``fit_options(kind, generic, given)``: *generic* options are the ones the program sets for every
  engine (``max_batch``, ``device``, ``dtype``); each is kept only when engine ``kind``'s
  ``Options`` dataclass has a field of that name (``max_batch`` -> hf only; ``dtype`` -> hf and
  sglang, which then run in the trainer's compute dtype). The user's own options (``given``) pass
  unchanged and win, so a key the engine does not know is still an error naming it.
- ``host_engine(kind, model, **options)``: ``make_engine`` in this process, unless the engine class
  declares ``process_wide = True`` (SGLang: process-wide configuration, a ``shutdown`` that kills
  every child process of its process); then a :class:`ChildEngine` runs it in its own process.
- ``ChildEngine``: the engine protocol (``generate`` / ``sleep`` / ``wake`` / ``update_weights`` /
  ``is_awake`` / ``footprint_bytes`` / ``close``) over a ``multiprocessing`` *spawn* child and a
  pipe. Calls run concurrently in the child (one event loop, the engine's own). The constructor
  waits until the child has built its engine (``start_timeout_s``), so the footprint is known then.
  ``update_weights`` streams buckets of ``bucket_bytes``: CPU tensors as raw bytes, CUDA tensors as
  CUDA IPC handles (copied on the child's GPU before use, so the parent's memory is free to go);
  one bucket is in flight at a time. ``update_adapter(name, config, tensors)`` (engines that serve
  LoRA adapters) sends one adapter's tensors the same way, in one message (adapters are small).
  A child that dies fails every pending call with an
  ``EngineError``; closing one child never touches another.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import itertools
import multiprocessing as mp
import pickle
import threading
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any, Mapping

from drmas_bench.engines import engine_class, make_engine, traits
from drmas_bench.engines.base import EngineError
from drmas_bench.engines.weights import DEFAULT_BUCKET_BYTES, buckets, iterate
from drmas_bench.log import squeeze
from drmas_bench.types import Completion, Request, UserError

GENERIC_OPTIONS = ("max_batch", "device", "dtype")  # what the program sets; kept where the engine has it
_CALLS = ("generate", "sleep", "wake")  # engine methods a ChildEngine forwards as plain calls


def option_names(kind: str) -> set[str]:
    """Field names of engine ``kind``'s ``Options`` dataclass."""
    return {f.name for f in dataclasses.fields(engine_class(kind).Options)}


def fit_options(kind: str, generic: Mapping[str, Any], given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The options for ``make_engine(kind, ...)``: the ``generic`` ones engine ``kind`` accepts, then
    the user's ``given`` ones unchanged (they override; unknown keys stay errors)."""
    odd = sorted(set(generic) - set(GENERIC_OPTIONS))
    if odd:  # a programming error, not a user's: generic options are the ones listed here
        raise ValueError(f"not a generic engine option: {', '.join(odd)} (known: {', '.join(GENERIC_OPTIONS)})")
    names = option_names(kind)
    out = {k: v for k, v in generic.items() if k in names}
    for k, v in (given or {}).items():
        out.pop(k.replace("-", "_"), None)
        out[k] = v
    return out


def is_process_wide(kind: str) -> bool:
    """Whether engine ``kind`` keeps process-wide state (then it needs a process of its own)."""
    return traits(kind).process_wide


def host_engine(kind: str, model: str, **options: Any) -> Any:
    """An engine of ``kind`` for ``model``: in this process, or in a child when ``is_process_wide``."""
    if is_process_wide(kind):
        return ChildEngine(kind, model, options)
    return make_engine(kind, model, **options)


# ---------------------------------------------------------------------- wire format


def _encode_bucket(bucket: list[tuple[str, Any]]) -> tuple[str, bytes]:
    """A weight bucket as bytes: CUDA tensors as IPC handles (torch's multiprocessing pickler),
    CPU tensors as (name, dtype, shape, raw bytes)."""
    import torch

    if any(getattr(t, "is_cuda", False) for _, t in bucket):
        import torch.multiprocessing  # noqa: F401 - registers the CUDA IPC reductions

        return "ipc", bytes(ForkingPickler.dumps(bucket))
    rows = []
    for name, t in bucket:
        t = t.detach().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        rows.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), raw))
    return "raw", pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)


def _decode_bucket(kind: str, data: bytes) -> list[tuple[str, Any]]:
    import torch

    if kind == "ipc":
        return [(name, t.clone()) for name, t in pickle.loads(data)]  # own copy: the sender may free its own
    out = []
    for name, dtype, shape, raw in pickle.loads(data):
        dt = getattr(torch, dtype)
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out.append((name, flat.view(dt).reshape(shape)))
    return out


def _portable_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else an ``EngineError`` with its type and one-line message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - anything unpicklable
        return EngineError(f"{type(exc).__name__}: {squeeze(exc)}")


# ---------------------------------------------------------------------- the child process


def _child_main(conn: Any, kind: str, model: str, options: dict[str, Any]) -> None:
    """Entry point of the child: build the engine, then serve calls until ``close`` or EOF."""
    asyncio.run(_serve(conn, kind, model, options))


async def _serve(conn: Any, kind: str, model: str, options: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    try:
        engine = await asyncio.to_thread(make_engine, kind, model, **options)
        conn.send_bytes(pickle.dumps(("ready", None, True, _state(engine))))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send_bytes(pickle.dumps(("ready", None, False, _portable_error(exc))))
        return
    child = _Child(conn, engine, loop)
    threading.Thread(target=child.read, name="drmas-child-reader", daemon=True).start()
    await child.serve()


class _Child:
    """The child's message loop once its engine is built: a reader thread puts each message from the
    pipe in ``inbox`` (None: the parent went away); ``serve`` hands each to the handler of its kind
    (``call``, ``update_begin`` / ``update_chunk`` / ``update_end``), which runs the engine's work as a
    task that replies when done; ``close`` (or EOF) ends the loop, then ``shut_down`` closes the engine."""

    def __init__(self, conn: Any, engine: Any, loop: asyncio.AbstractEventLoop):
        self.conn, self.engine, self.loop = conn, engine, loop
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.send_lock = threading.Lock()
        self.updates: dict[int, asyncio.Queue] = {}  # weight update id -> its buckets as they come
        self.tasks: set[asyncio.Task] = set()
        self.closing: int | None = None  # the id of the close call, answered after the engine closed

    def read(self) -> None:  # the reader thread
        while True:
            try:
                data = self.conn.recv_bytes()
            except (EOFError, OSError):
                self.loop.call_soon_threadsafe(self.inbox.put_nowait, None)
                return
            self.loop.call_soon_threadsafe(self.inbox.put_nowait, pickle.loads(data))

    def reply(self, call_id: int, ok: bool, value: Any) -> None:
        state = _state(self.engine)
        try:
            data = pickle.dumps(("reply", call_id, ok, value, state))
        except Exception as exc:  # noqa: BLE001 - an unpicklable result
            data = pickle.dumps(("reply", call_id, False, _portable_error(exc), state))
        with self.send_lock:
            self.conn.send_bytes(data)

    async def run(self, call_id: int, coro: Any) -> None:
        try:
            value = await coro
        except BaseException as exc:  # noqa: BLE001 - sent back to the caller
            self.reply(call_id, False, _portable_error(exc))
        else:
            self.reply(call_id, True, value)

    async def stream(self, call_id: int, q: asyncio.Queue) -> Any:
        while True:
            item = await q.get()
            if item is None:
                return
            if item == "abort":
                raise EngineError("weight update aborted by the sender")
            ack_id, pairs = item
            self.reply(ack_id, True, None)  # the engine started on this bucket: send the next one
            for pair in pairs:
                yield pair

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def serve(self) -> None:
        handlers = {"call": self.on_call, "update_begin": self.on_update_begin,
                    "update_chunk": self.on_update_chunk, "update_end": self.on_update_end}
        while True:
            msg = await self.inbox.get()
            if msg is None:  # the parent went away
                break
            op, call_id, *args = msg
            handler = handlers.get(op)
            if handler is not None and handler(call_id, args):  # True: the parent asked to close
                break
        await self.shut_down()

    def on_call(self, call_id: int, args: list[Any]) -> bool:
        method, a, kw = args
        if method == "close":
            self.closing = call_id
            return True
        if method in _CALLS:
            self.spawn(self.run(call_id, getattr(self.engine, method)(*a, **kw)))
        elif method == "update_adapter" and hasattr(self.engine, "update_adapter"):
            name, config, (kind_, data) = a
            self.spawn(self.run(call_id, self.engine.update_adapter(name, config, dict(_decode_bucket(kind_, data)))))
        else:
            self.reply(call_id, False, EngineError(f"engine process: unknown call {method!r}"))
        return False

    def on_update_begin(self, call_id: int, args: list[Any]) -> bool:
        bucket_bytes, flush_cache = args
        q = self.updates[call_id] = asyncio.Queue()
        pairs = self.stream(call_id, q)
        self.spawn(self.run(call_id, _update(self.engine, pairs, bucket_bytes, flush_cache, self.updates, call_id)))
        return False

    def on_update_chunk(self, call_id: int, args: list[Any]) -> bool:
        update_id, kind_, data = args
        if update_id in self.updates:
            self.updates[update_id].put_nowait((call_id, _decode_bucket(kind_, data)))
        else:  # the update already ended (failed): unblock the sender
            self.reply(call_id, True, None)
        return False

    def on_update_end(self, call_id: int, args: list[Any]) -> bool:
        update_id, abort = args
        if update_id in self.updates:
            self.updates[update_id].put_nowait("abort" if abort else None)
        return False

    async def shut_down(self) -> None:
        for q in self.updates.values():  # an update still waiting for buckets will get none now
            q.put_nowait("abort")
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        try:
            await self.engine.close()
            if self.closing is not None:
                self.reply(self.closing, True, None)
        except BaseException as exc:  # noqa: BLE001
            if self.closing is not None:
                self.reply(self.closing, False, _portable_error(exc))


async def _update(engine: Any, pairs: Any, bucket_bytes: int, flush_cache: bool,
                  updates: dict[int, asyncio.Queue], call_id: int) -> None:
    try:
        await engine.update_weights(pairs, bucket_bytes=bucket_bytes, flush_cache=flush_cache)
    finally:
        updates.pop(call_id, None)


def _state(engine: Any) -> dict[str, Any]:
    """What the parent mirrors after every reply: ``is_awake``, ``footprint_bytes()`` and
    ``keeps_weights_asleep``."""
    return {"awake": bool(engine.is_awake), "footprint": int(engine.footprint_bytes()),
            "keeps_weights": bool(getattr(engine, "keeps_weights_asleep", True))}


# ---------------------------------------------------------------------- the parent's proxy

_LIVE: "weakref.WeakSet[ChildEngine]" = weakref.WeakSet()


@atexit.register
def _close_children_at_exit() -> None:
    """Close the pipes of children still open, so they exit and the interpreter can join them."""
    for child in list(_LIVE):
        child._hang_up()


class ChildEngine:
    """Engine ``kind`` serving ``model`` in a spawned child process (see the module docstring).

    Args:
        kind, model, options: what ``make_engine`` gets in the child.
        start_timeout_s: how long to wait for the child to build its engine.
    """

    def __init__(self, kind: str, model: str, options: Mapping[str, Any] | None = None, *,
                 start_timeout_s: float = 600.0) -> None:
        self.name = kind
        self.model = model
        self._awake = False
        self._footprint = 0
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._pending_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._dead: BaseException | None = None
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        # not a daemon: SGLang starts processes of its own, which daemonic processes may not
        self._proc = ctx.Process(target=_child_main, args=(child_conn, kind, model, dict(options or {})),
                                 name=f"drmas-engine-{kind}", daemon=False)
        self._proc.start()
        child_conn.close()
        _LIVE.add(self)
        try:
            ready = self._wait_ready(start_timeout_s)
        except BaseException:
            self._hang_up()
            self._proc.join(timeout=5)
            if self._proc.is_alive():
                self._proc.kill()
            raise
        self._set_state(ready)
        threading.Thread(target=self._reader, name=f"drmas-engine-{kind}-reader", daemon=True).start()

    def _wait_ready(self, timeout_s: float) -> dict[str, Any]:
        waited = 0.0
        while not self._conn.poll(0.2):
            waited += 0.2
            if not self._proc.is_alive():
                raise EngineError(f"{self.name} engine process for {self.model!r} exited while starting "
                                  f"(exit code {self._proc.exitcode})")
            if waited >= timeout_s:
                raise EngineError(f"{self.name} engine process for {self.model!r} did not start in {timeout_s:.0f} s")
        try:
            _, _, ok, value = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            raise EngineError(f"{self.name} engine process for {self.model!r} exited while starting "
                              f"(exit code {self._proc.exitcode})") from None
        if not ok:
            raise value
        return value

    # ------------------------------------------------------------------ plumbing

    def _set_state(self, state: dict[str, Any]) -> None:
        self._awake = bool(state["awake"])
        self._footprint = int(state["footprint"])
        self._keeps_weights = bool(state.get("keeps_weights", True))

    def _reader(self) -> None:
        while True:
            try:
                msg = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError):
                break
            _, call_id, ok, value, state = msg
            self._set_state(state)
            with self._pending_lock:
                entry = self._pending.pop(call_id, None)
            if entry is not None:
                loop, fut = entry
                loop.call_soon_threadsafe(_resolve, fut, ok, value)
        self._proc.join(timeout=1)
        err = EngineError(f"{self.name} engine process for {self.model!r} exited (exit code {self._proc.exitcode})")
        with self._pending_lock:
            self._dead = err
            pending, self._pending = self._pending, {}
        for loop, fut in pending.values():
            loop.call_soon_threadsafe(_resolve, fut, False, err)

    def _register(self) -> tuple[int, asyncio.Future]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        call_id = next(self._ids)
        with self._pending_lock:
            if self._dead is not None:
                raise self._dead
            self._pending[call_id] = (loop, fut)
        return call_id, fut

    async def _send(self, msg: tuple) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)

        def write() -> None:
            with self._write_lock:
                if self._dead is not None:
                    raise self._dead
                self._conn.send_bytes(data)

        if len(data) > (1 << 20):
            await asyncio.to_thread(write)  # a weight bucket: do not block the event loop
        else:
            write()

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        call_id, fut = self._register()
        try:
            await self._send(("call", call_id, method, args, kwargs))
        except (OSError, EOFError) as exc:
            raise EngineError(f"{self.name} engine process for {self.model!r} is gone: {squeeze(exc)}") from None
        return await fut

    def _hang_up(self) -> None:
        try:
            self._conn.close()
        except OSError:
            pass

    # ------------------------------------------------------------------ the engine protocol

    @property
    def is_awake(self) -> bool:
        return self._awake

    def footprint_bytes(self) -> int:
        """The child engine's footprint as last reported (known from construction on)."""
        return self._footprint

    @property
    def keeps_weights_asleep(self) -> bool:
        """Whether the child engine's ``wake`` restores the weights its ``sleep`` released."""
        return getattr(self, "_keeps_weights", True)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    async def generate(self, requests: list[Request]) -> list[Completion]:
        if not requests:
            return []
        return await self._call("generate", list(requests))

    async def sleep(self) -> None:
        await self._call("sleep")

    async def wake(self) -> None:
        await self._call("wake")

    async def update_weights(self, named_tensors: Any, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                             flush_cache: bool = True) -> None:
        """Stream ``(name, tensor)`` pairs to the child's ``update_weights`` (one session there),
        one bucket in flight at a time; the child's error (e.g. SGLang refusing) is raised here."""
        update_id, done = self._register()
        await self._send(("update_begin", update_id, bucket_bytes, flush_cache))
        try:
            async for bucket in buckets(iterate(named_tensors), bucket_bytes):
                if done.done():
                    break
                ack_id, ack = self._register()
                kind, data = _encode_bucket(bucket)
                await self._send(("update_chunk", ack_id, update_id, kind, data))
                await asyncio.wait({ack, done}, return_when=asyncio.FIRST_COMPLETED)
                if not ack.done():
                    with self._pending_lock:
                        self._pending.pop(ack_id, None)
        except BaseException:  # our side failed (the tensors, the pipe): the child ends its session
            if not done.done():
                with contextlib.suppress(Exception):
                    await self._send(("update_end", next(self._ids), update_id, True))
                    await asyncio.wait({done}, timeout=60)
            raise
        if not done.done():
            await self._send(("update_end", next(self._ids), update_id, False))
        await done

    async def update_adapter(self, name: str, config: dict[str, Any], tensors: dict[str, Any]) -> None:
        """The child's ``update_adapter`` with ``tensors`` encoded as one weight bucket."""
        await self._call("update_adapter", name, dict(config), _encode_bucket(list(tensors.items())))

    async def close(self, timeout_s: float = 120.0) -> None:
        """Close the child's engine and wait for the process to exit; after ``timeout_s`` (or 60 s
        more for the exit) it is killed."""
        if self._proc.exitcode is None and self._dead is None:
            try:
                await asyncio.wait_for(self._call("close"), timeout_s)
            except (EngineError, UserError, asyncio.TimeoutError):
                pass
        self._hang_up()
        await asyncio.to_thread(self._proc.join, 60)
        if self._proc.is_alive():
            self._proc.kill()
            await asyncio.to_thread(self._proc.join, 5)
        _LIVE.discard(self)

    def __repr__(self) -> str:
        return f"ChildEngine({self.name!r}, model={self.model!r}, pid={self._proc.pid})"


def _resolve(fut: asyncio.Future, ok: bool, value: Any) -> None:
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
