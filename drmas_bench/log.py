"""Messages and errors: one ``logging`` set-up for the CLI, one path for unexpected exceptions.

Progress and notes go through ``logging.getLogger(__name__)`` in every module (drmas_bench,
drmas_trainer, drmas_retrieval); :func:`setup` gives them one stderr handler whose format is the
bare message, so at the default level the text users (and tests) see is what ``print`` used to
write. Levels, from the CLI's global flags:

    -v / --verbose   DEBUG (also the messages of the engines, pool and trainer meant for debugging)
    (default)        INFO  (progress lines such as ``[eval] ...``, ``[train] ...``)
    -q / --quiet     WARNING (only warnings and errors; results on stdout are unchanged)

Errors. A :class:`~drmas_bench.types.UserError` is the user's mistake: the CLI prints it as one line.
An unexpected exception (a bug, a crash inside a run) becomes an :class:`UnexpectedError` - also
one line, naming where its traceback was kept (``RUN/error.log`` when a run directory is open, else
a temporary file) - and keeps the original exception as ``.original``; under ``--debug`` the CLI
re-raises that original so Python prints its full traceback.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from drmas_bench.types import UserError

LOGGERS = ("drmas_bench", "drmas_trainer", "drmas_retrieval")  # the packages whose messages we show
LEVELS = {-1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}  # -q, default, -v


class UnexpectedError(UserError):
    """An unexpected exception turned into one line; ``original`` is the exception itself (with its
    traceback), ``log`` the file where that traceback was written (or None)."""

    def __init__(self, message: str, original: BaseException, log: str | os.PathLike | None = None) -> None:
        super().__init__(message)
        self.original = original
        self.log = Path(log) if log is not None else None


def one_line(e: BaseException) -> str:
    """``"TypeName: first line of the message"``."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def squeeze(exc: BaseException | str) -> str:
    """An exception's whole message (or a text) on one line, its whitespace runs squeezed: what an
    ``EngineError`` quotes of a library's multi-line error."""
    return " ".join(str(exc).split())


def level_for(verbose: int = 0, quiet: int = 0) -> int:
    """The logging level of ``-v`` (count) and ``-q`` (count); ``-v`` wins over ``-q``."""
    return LEVELS[1 if verbose else -1 if quiet else 0]


def setup(level: int = logging.INFO, stream=None) -> logging.Handler:
    """One stderr handler (bare message format) on the project's loggers at ``level``; calling it
    again replaces the handler (tests call ``main()`` many times). Returns the handler."""
    handler = logging.StreamHandler(stream if stream is not None else _Stderr())
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.set_name("drmas-bench")
    for name in LOGGERS:
        lg = logging.getLogger(name)
        for h in [h for h in lg.handlers if h.get_name() == "drmas-bench"]:
            lg.removeHandler(h)
        lg.addHandler(handler)
        lg.setLevel(level)
        lg.propagate = False
    return handler


class _Stderr:
    """Writes to whatever ``sys.stderr`` is at the time (pytest's capsys swaps it per test)."""

    def write(self, s: str) -> int:
        return sys.stderr.write(s)

    def flush(self) -> None:
        sys.stderr.flush()


def _append(path: Path, text: str) -> bool:
    """Append ``text`` to ``path`` and sync it; on failure (a full disk, a read-only folder) put the
    file back as it was (removed if this call created it) and return False."""
    existed = path.exists()
    size = path.stat().st_size if existed else 0
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # a full disk may only say so here
        return True
    except OSError:
        try:
            if existed:
                os.truncate(path, size)
            else:
                path.unlink()
        except OSError:
            pass
        return False


def write_traceback(exc: BaseException, path: str | os.PathLike | None = None) -> Path | None:
    """Append ``exc``'s traceback to ``path`` (e.g. ``RUN/error.log``); returns where it went.

    When ``path`` is None or cannot be written (a full disk), a new temporary
    ``drmas-bench-error-*.log`` takes it and its path is returned, so a message can say where the
    traceback is; no empty or half-written file is left at ``path``. When no file can be written at
    all, the traceback goes to stderr and None is returned."""

    text = (f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} PID {os.getpid()}\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    if path is not None and _append(Path(path), text):
        return Path(path)
    try:
        fd, name = tempfile.mkstemp(prefix="drmas-bench-error-", suffix=".log")
        os.close(fd)
    except OSError:
        name = None
    if name is not None and _append(Path(name), text):
        return Path(name)
    try:
        sys.stderr.write(text)
    except OSError:
        pass
    return None


def unexpected(exc: BaseException, what: str = "unexpected error", *, log: str | os.PathLike | None = None,
               hint: str = "") -> UnexpectedError:
    """The one-line error for an unexpected ``exc``: ``"<what> (<Type: msg>); traceback in <log>[; hint]"``.
    ``log``: where the traceback already is (e.g. ``RUN/error.log``, or the temporary file
    ``write_traceback`` fell back to); None writes it to a temporary file (stderr when none can be written)."""
    path = Path(log) if log is not None else write_traceback(exc)
    return UnexpectedError(f"{what} ({one_line(exc)}); {traceback_note(path)}" + (f"; {hint}" if hint else ""), exc, path)


def traceback_note(path: str | os.PathLike | None) -> str:
    """Where a traceback went, for a one-line message (``write_traceback``'s result)."""
    return f"traceback in {path}" if path is not None else "traceback on stderr above (no file could be written)"


__all__ = ["LOGGERS", "UnexpectedError", "level_for", "one_line", "setup", "traceback_note", "unexpected", "write_traceback"]
