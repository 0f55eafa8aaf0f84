"""One grading worker process (the pool that runs them: ``grading_workers.GradingPool``).

- what it computes: ``GradeResult``, ``grade_one`` (one pair, in this process, grader errors caught);
- what runs in it: ``worker_main``, which grades chunks, writes a heartbeat before each item (chunk
  id, position, start time, its CPU time) and sends results at the end of a chunk or every
  ``FLUSH_S`` seconds;
- the clock the parent reads to find an item past its limit: ``process_cpu_seconds``;
- how it starts without re-running the parent's ``__main__``: ``start_process``, and
  ``check_backend_importable``, which refuses a backend the worker could not find.
"""

from __future__ import annotations

import multiprocessing.spawn
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from drmas_bench.grading.graders import extract_for

FLUSH_S = 0.1  # a worker sends partial chunk results at least this often
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class GradeResult:
    """The grade of one (response, gold) pair.

    correct: the answer is right (always False unless status is "ok").
    status: "ok" | "timeout" (killed after timeout_s) | "error" (the grader raised, or its worker died).
    extracted: the answer the grader extracted from the response (None when there is none).
    seconds: grading time of this item (for a timeout: the wall time until the last kill).
    detail: the error message for status "error" or "timeout", else "".
    attempts: 2 when the item hit its CPU limit once and was graded again, alone (`RETRY_FACTOR`).
    """

    correct: bool
    status: str
    extracted: str | None
    seconds: float
    detail: str = ""
    attempts: int = 1


def grade_one(response: str, gold: str, backend: str | Callable[[str, str], bool] = "careful") -> GradeResult:
    """Grade one pair in this process (no timeout), catching grader errors as status "error"."""

    t0 = time.perf_counter()
    extracted, equal = extract_for(response, backend)
    if equal is None:  # nothing to grade: wrong without asking
        return GradeResult(False, "ok", extracted, time.perf_counter() - t0)
    try:
        correct = bool(equal(extracted, gold))
    except Exception as e:  # any grader failure is recorded, never raised into the batch
        return GradeResult(False, "error", extracted, time.perf_counter() - t0, f"{type(e).__name__}: {e}"[:300])
    return GradeResult(correct, "ok", extracted, time.perf_counter() - t0)


# ---------------------------------------------------------------------- the worker loop


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds used so far by process `pid` (all its threads), from
    `/proc/PID/stat`; None where that cannot be read (no /proc, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (fields 14, 15)
    except (OSError, IndexError, ValueError):
        return None


def worker_main(conn, heartbeat) -> None:
    """Worker loop: receive (chunk_id, backend, pairs), grade, send (chunk_id, first_pos, results)."""
    # Ctrl-C and stop signals are the parent's business: a SIGTERM sent to the whole process group
    # (timeout, Slurm) must not kill the workers the parent's last flush still grades with
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    import drmas_bench.grading.math  # noqa: F401  (import sympy before the first deadline starts)

    conn.send(("ready", os.getpid()))
    pid = os.getpid()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        except Exception as e:  # e.g. a backend that cannot be unpickled here: say so, then stop
            conn.send(("fatal", f"{type(e).__name__}: {e}"[:300]))
            return
        if msg is None:
            return
        chunk_id, backend, pairs = msg
        done: list[GradeResult] = []
        first_pos, last_flush = 0, time.monotonic()
        for pos, (response, gold) in enumerate(pairs):
            heartbeat[2] = 0.0  # seqlock-style: start time last, so readers never pair old and new
            heartbeat[0] = chunk_id
            heartbeat[1] = pos
            cpu = process_cpu_seconds(pid)  # the same clock the parent reads (not process_time)
            heartbeat[3] = -1.0 if cpu is None else cpu
            heartbeat[2] = time.monotonic()
            done.append(grade_one(response, gold, backend))
            if time.monotonic() - last_flush > FLUSH_S and pos + 1 < len(pairs):
                conn.send((chunk_id, first_pos, done))
                first_pos, done, last_flush = pos + 1, [], time.monotonic()
        heartbeat[2] = 0.0
        conn.send((chunk_id, first_pos, done))


def check_backend_importable(backend: str | Callable[[str, str], bool]) -> None:
    """A callable backend travels to the workers by reference (module + name), and the workers never
    import `__main__`: refuse one they could not find, with a reason, before any worker sees it."""
    if isinstance(backend, str) or not hasattr(backend, "__qualname__"):
        return  # a name, or an object pickled by its parts (functools.partial): the workers report a failure
    module, name = getattr(backend, "__module__", None), backend.__qualname__
    if module in (None, "__main__", "__mp_main__"):
        why = "it is defined in __main__, which the grading workers do not import"
    elif "<locals>" in name or "<lambda>" in name:
        why = "a lambda or nested function cannot be found by name"
    else:
        return
    raise ValueError(f"grading backend {name}: {why}; make it a module-level function of an importable module")


# ------------------------------------------------------------------------ starting a worker


_no_main = threading.local()  # .on is True while this thread starts a grading worker
_installed: list = []  # the original get_preparation_data, once our wrapper is in place
_install_lock = threading.Lock()


def _preparation_data(name: str) -> dict:
    """multiprocessing's description of the parent for a new child, minus "import `__main__`" while
    this thread starts a grading worker (other threads and other process starts: unchanged)."""
    data = _installed[0](name)
    if getattr(_no_main, "on", False):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


def start_process(proc: Any) -> None:
    """`proc.start()` for a grading worker, telling the child not to re-import `__main__`.

    multiprocessing's "spawn" and "forkserver" children run the parent's main script (by path) or
    main module (by name) before unpickling their target, so that functions defined there resolve.
    Our worker needs nothing from `__main__` (its target is `worker_main` in this module; backends
    are refused when they live in `__main__`), and the re-run breaks whenever `__main__` is not a
    re-runnable file: `python - <<EOF` (no file "<stdin>"), a script that grades at import time (it
    grades again in every worker), a heavy or side-effecting entry point (a Ray worker, a notebook
    kernel). The description is built by `multiprocessing.spawn.get_preparation_data`, which every
    start method looks up on that module at call time; wrapping it once, gated by a thread-local
    flag, changes the description for the grading workers this thread starts and nothing else."""
    with _install_lock:
        if not _installed:  # once per interpreter
            _installed.append(multiprocessing.spawn.get_preparation_data)
            multiprocessing.spawn.get_preparation_data = _preparation_data
    _no_main.on = True
    try:
        proc.start()
    finally:
        _no_main.on = False
