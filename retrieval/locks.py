"""One inter-process lock for the project: ``fcntl.flock`` on a lock file, held for a ``with`` block.

It lives here, in the package that imports nothing of the others, so the retrieval builds (a
passage store written by one of several processes), the model cache (one build of an alias) and
the checkpoint cache (one download of a checkpoint) share it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive lock on the file ``path`` (created with its folder; a no-op where fcntl is
    missing). Waits for the holder; the kernel releases it if the holder dies."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
