"""The pool's side of the trainer's rollouts: engines it adopts and groups it holds asleep.

**Adopted engines** (:class:`Adopted`): an engine someone else created and keeps (the trainer's
worker groups: the engine lives beside its policy, so weights never travel). The pool schedules it
like its own, starting from the state it was handed in, and never closes it. **Holding asleep**
(:meth:`HoldAsleep.hold_asleep` / :meth:`HoldAsleep.release`): the trainer's update phase needs the
engines' memory; held groups are put to sleep (the policy's ``Sleep`` decision) and stay asleep
until released. ``PoolBase`` inherits :class:`HoldAsleep`; the bookkeeping it uses is PoolBase's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from drmas_bench.pool.policy import ASLEEP
from drmas_bench.types import UserError


@dataclass
class Adopted:
    """An engine the pool adopts instead of creating it (the adopt hook): the pool wakes, sleeps and
    serves it under its budget but never closes it (its owner does).

    - ``engine``: anything with ``async generate(requests)``, ``async sleep()``, ``async wake()``
      (e.g. a trainer worker group's engine seen through ``drmas_trainer.rollout_engines``).
    - ``footprint``: bytes it occupies awake (what the budget books for it).
    - ``awake``: its state when adopted.
    - ``model``: for the pool's stats.
    """

    engine: Any
    footprint: int
    awake: bool = True
    model: str = ""


class HoldAsleep:
    """``hold_asleep`` / ``release`` / ``state_of`` of a pool (``PoolBase``'s groups, ``_kick``,
    ``_rounds`` and ``_errors``)."""

    _groups: dict[str, Any]
    _rounds: set[asyncio.Task]
    _errors: list[str]

    def _group(self, wg: str) -> Any:  # PoolBase's
        raise NotImplementedError

    def _kick(self) -> None:  # PoolBase's
        raise NotImplementedError

    async def hold_asleep(self, groups: list[str] | None = None) -> None:
        """Hold ``groups`` (default: all) asleep: each is put to sleep once its running round is
        done, is never woken until :meth:`release`, and its new requests wait. Returns when every
        one of them is asleep (the memory is free)."""
        names = list(self._groups) if groups is None else [self._group(n).name for n in groups]
        for n in names:
            self._groups[n].held = True
        kicked = False
        while True:
            self._kick()
            busy = [t for n in names for t in (self._groups[n].sleep_task, self._groups[n].wake_task)
                    if t is not None and not t.done()]
            busy += [t for t in self._rounds if not t.done()] if any(self._groups[n].serving for n in names) else []
            if busy:
                await asyncio.gather(*busy, return_exceptions=True)
                kicked = False
                continue
            if all(self._groups[n].state == ASLEEP for n in names):
                return
            failed = [n for n in names if not self._groups[n].held]
            if failed:
                raise UserError(f"worker group(s) {', '.join(failed)} could not be put to sleep: "
                                + "; ".join(e for e in self._errors if e.split(':')[0] in failed))
            if kicked:  # nothing running and the policy sleeps nothing: a bug, not a wait
                raise RuntimeError(f"pool: held groups {names} are neither asleep nor going to sleep")
            kicked = True
            await asyncio.sleep(0)

    def state_of(self, wg: str) -> str:
        """The pool's view of ``wg``: ``asleep``, ``waking``, ``awake`` or ``sleeping``."""
        return self._group(wg).state

    def release(self, groups: list[str] | None = None) -> None:
        """End :meth:`hold_asleep` for ``groups`` (default: all): they wake again on demand."""
        for n in list(self._groups) if groups is None else groups:
            self._group(n).held = False
        self._kick()
