"""What a run fetches, merges or builds before it starts, planned apart from doing it.

``plan()`` opens nothing: each thing a configuration needs that this machine does not hold yet (a
checkpoint under a URL, a reference-trainer checkpoint to merge, a model folder under a URL, an
alias to build) becomes a :class:`Step`: its source, where it will land in the drmas cache, its
size where known, and whether the cache held it when planned. Planning reads what it must to say
so (a remote ``latest`` pointer and ``COMPLETE`` marker, a folder listing, the shards' content
identity) and writes nothing: no download, no lock, no folder. ``api.run`` (or ``drmas-bench models
prepare``, ahead of time) performs the pending steps with :func:`perform`, one at a time, each
under its own lock into a partial folder renamed into place, so an interrupted step leaves nothing
half-made in the cache and the next attempt goes on from what it finished (the files already
downloaded, the worker groups already merged).

Each kind of step is a subclass beside the code that does the work (``checkpoints.CheckpointCopy``,
``checkpoints.copies.ModelCopy``, ``checkpoints.verl.ReferenceMerge``, ``models.names.AliasBuild``); this
module is their leaf: the base class, the progress bar they share and the loop that runs them.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Iterable

logger = logging.getLogger(__name__)


def human_bytes(n: int) -> str:
    """``1234567`` -> ``1.2 MB`` (decimal units, as download sizes are usually given)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"  # pragma: no cover


@dataclass(frozen=True)
class Step:
    """One thing to fetch, merge or build before a run: ``source`` -> ``dest`` (in the drmas cache)."""

    action: ClassVar[str] = "prepare"  # what the step does, in a few words ("fetch checkpoint", ...)
    source: str  # a URL, a folder, or an alias name
    dest: Path  # where the result will be (the folder the run then reads)
    size_bytes: int | None = None  # what is read or downloaded, where the planner could tell
    done: bool = False  # the cache held it when planned (performing it again does nothing)

    def describe(self) -> str:
        """One line: ``fetch checkpoint s3://b/r/step_3 -> <cache>/checkpoints/ab12... (12.3 MB)``."""
        size = f", {human_bytes(self.size_bytes)}" if self.size_bytes is not None else ""
        state = "in the cache" if self.done else "to do"
        return f"{self.action} {self.source} -> {self.dest} ({state}{size})"

    def perform(self, show_progress: bool) -> Path:
        """Do the step (a no-op when its result is in the cache) and return ``dest``."""
        raise NotImplementedError


def pending(steps: Iterable[Step]) -> list[Step]:
    """The steps not done, each once (two worker groups on one model share its step)."""
    seen: dict[tuple[str, Path], Step] = {}
    for s in steps:
        if not s.done:
            seen.setdefault((s.action, s.dest), s)
    return list(seen.values())


def perform(steps: Iterable[Step], show_progress: bool = True, log: Callable[[str], None] | None = None) -> None:
    """Perform the pending ``steps`` in order, one line each before and after."""
    log = log or logger.info
    todo = pending(steps)
    for i, step in enumerate(todo, 1):
        log(f"[prepare] {i}/{len(todo)} {step.describe()}")
        t0 = time.monotonic()
        step.perform(show_progress)
        log(f"[prepare] {i}/{len(todo)} done in {time.monotonic() - t0:.1f} s")


class Bar:
    """A progress bar on stderr for long preparation work (quiet when stderr is not a terminal):
    ``bar(done, total)``; ``unit`` formats the counts (``human_bytes`` for downloads)."""

    def __init__(self, label: str, show: bool, unit: Callable[[int], str] = str):
        self.label, self.unit = label, unit
        self.show = show and sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if self.show:
            width = 30
            fill = width * done // max(total, 1)
            sys.stderr.write(f"\r[prepare] {self.label} [{'#' * fill}{'.' * (width - fill)}] "
                             f"{self.unit(done)}/{self.unit(total)}")
            if done >= total:
                sys.stderr.write("\n")
            sys.stderr.flush()
