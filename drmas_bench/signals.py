"""Stop signals: SIGTERM and SIGHUP stop a command the way Ctrl-C (SIGINT) does.

SIGTERM is what ``timeout``, Slurm, Kubernetes and ``docker stop`` send, SIGHUP what a closed
terminal sends. Python's default for both is to die on the spot, which skips every ``finally``:
an eval loses the finished episodes still in its flush buffer (up to ``--flush-every``). Under
:func:`stop_signals_as_interrupt` (the CLI wraps every command in it) both are handed to whoever
handles SIGINT at that moment, so one code path covers all three:

- inside ``asyncio.run`` (eval, train): asyncio's own SIGINT handler cancels the main task, every
  ``finally`` runs (the runner grades and appends what finished, engines and workers are released),
  then ``KeyboardInterrupt`` is raised; a second signal stops at once (a repeat of the same stop
  signal within 2 s is the same stop: ``timeout`` delivers its SIGTERM twice);
- elsewhere (index builds, loading): ``KeyboardInterrupt`` at once, as for Ctrl-C.

``ray.init`` replaces the SIGTERM handler of its driver; ``drmas_bench.pool.cluster.init_ray`` (the
one place Ray is started, for eval's Ray pool and the trainer) puts ours back (:func:`reclaim`).

The exit code says which signal stopped the command: ``128 + signal number`` (:func:`exit_code`),
the shell's convention: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP. A signal that was ignored
when the process started (``nohup`` ignores SIGHUP) stays ignored.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

_received: list[int] = []  # the stop signals seen since the last stop_signals_as_interrupt() began
_ours: list[int] = []  # the signals stop_signals_as_interrupt() handles right now
_last: dict[int, float] = {}  # signal -> when it last stopped us (time.monotonic)
REPEAT_S = 2.0  # a repeat of the same stop signal within this many seconds is the same stop


def _as_interrupt(signum: int, frame: Any) -> None:
    """Hand a stop signal to the current SIGINT handler (asyncio's, or Python's default). The same
    signal again within ``REPEAT_S`` is one stop, not a second (which would skip the flush):
    ``timeout`` sends SIGTERM to the command and then to its whole process group."""
    now = time.monotonic()
    if now - _last.get(signum, -REPEAT_S) < REPEAT_S:
        return
    _last[signum] = now
    _received.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored (a background job of a script): a stop signal must still stop
        raise KeyboardInterrupt


@contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """For the block's duration, SIGTERM and SIGHUP behave as SIGINT (see the module docstring).
    Outside the main thread (where Python allows no handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    _last.clear()
    before = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:  # leave an ignored (nohup) or a caller's handler alone
            before[sig] = signal.signal(sig, _as_interrupt)
    _ours[:] = list(before)
    try:
        yield
    finally:
        _ours.clear()
        for sig, old in before.items():
            signal.signal(sig, old)


def reclaim() -> None:
    """Put the stop-signal handlers back after a library replaced them (``ray.init`` makes SIGTERM
    ``sys.exit(15)`` in the driver, which would skip the flush and exit 15); a no-op outside
    :func:`stop_signals_as_interrupt` and outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _ours:
        if signal.getsignal(sig) is not _as_interrupt:
            signal.signal(sig, _as_interrupt)


def stopped_by() -> int:
    """The signal that stopped the command: the last stop signal received, else SIGINT."""
    return _received[-1] if _received else int(signal.SIGINT)


def exit_code() -> int:
    """``128 + signal number`` of :func:`stopped_by`: 130 SIGINT, 143 SIGTERM, 129 SIGHUP."""
    return 128 + int(stopped_by())


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


__all__ = ["STOP_SIGNALS", "exit_code", "reclaim", "signal_name", "stop_signals_as_interrupt", "stopped_by"]
