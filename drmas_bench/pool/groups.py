"""A pool's worker groups: how one is made (``EngineSpec``, ``specs_from_team``), what the pool keeps
of it (``WorkerGroup``: its handle, state, queue of ``Ticket``s and ``GroupCounters``) and what it
reports of it (``WorkerGroup.stats``). The scheduler that moves them between states is ``base.py``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from drmas_bench.pool.policy import ASLEEP
from drmas_bench.types import Request


@dataclass
class EngineSpec:
    """How to create one worker group's engine: ``make_engine(kind, model, **options)``.

    - ``kind``: engine backend (``hf``, ``openai``, ``sglang``).
    - ``model``: alias, folder or hub id.
    - ``options``: the backend's options (``device``, ``max_batch``, ``sleep_mode``, ...).
    - ``footprint_hint``: bytes the engine will occupy, used to budget it before its first load
      (``None``: the largest footprint measured so far, else the whole budget).
    """

    kind: str
    model: str
    options: dict[str, Any] = field(default_factory=dict)
    footprint_hint: int | None = None


def specs_from_team(team: Any) -> dict[str, EngineSpec]:
    """``EngineSpec`` per worker group of a ``TeamSpec``: its engine kind, model and options, plus
    ``base_url`` when the group sets one (only then: the hf engine rejects the key)."""
    out: dict[str, EngineSpec] = {}
    for name, g in team.worker_groups.items():
        if hasattr(g, "engine_options"):  # agents.team.WorkerGroupSpec: base_url, api_key_env's key
            opts = g.engine_options()
        else:
            opts = dict(g.options)
            if getattr(g, "base_url", None):
                opts["base_url"] = g.base_url
        out[name] = EngineSpec(g.engine, g.model, opts)
    return out


@dataclass(eq=False)
class Ticket:
    """One ``generate`` call waiting for its worker group (``requests == []``: just wake it)."""

    requests: list[Request]
    future: asyncio.Future
    t: float  # monotonic arrival time

    @property
    def weight(self) -> int:
        return max(1, len(self.requests))


@dataclass
class GroupCounters:
    """Per worker group counters reported by ``Pool.stats()``."""

    loads: int = 0  # first loads (and re-creations of released actors, RayPool)
    load_s: float = 0.0
    wakes: int = 0  # wakes from sleep (loads not included)
    wake_s: float = 0.0
    sleeps: int = 0
    sleep_s: float = 0.0
    rounds: int = 0  # dispatches (one engine call per generate() call in the round)
    requests: int = 0
    queue_s: float = 0.0  # sum over requests of the time they waited before dispatch
    errors: int = 0


@dataclass
class WorkerGroup:
    name: str
    spec: Any  # EngineSpec | Engine | factory (LocalPool), EngineSpec (RayPool)
    handle: Any = None  # None: not loaded (or released)
    footprint: int | None = None
    hint: int | None = None
    state: str = ASLEEP
    serving: int = 0
    tickets: deque = field(default_factory=deque)
    last_used: float = 0.0
    wake_task: asyncio.Task | None = None
    sleep_task: asyncio.Task | None = None
    counters: GroupCounters = field(default_factory=GroupCounters)
    model: str = ""
    adopted: bool = False  # the pool did not create the engine and does not close it
    held: bool = False  # held asleep (hold_asleep) until released

    @property
    def pending(self) -> int:
        return sum(t.weight for t in self.tickets)

    def stats(self) -> dict[str, Any]:
        """This group's counters for ``Pool.stats()`` (JSON-serialisable), with what a server engine
        learned or could not switch off (``engine_notes``) when it says."""
        c = self.counters
        out: dict[str, Any] = {
            "model": self.model,
            "state": self.state,
            "footprint_bytes": self.footprint,
            "loads": c.loads,
            "load_s": round(c.load_s, 4),
            "wakes": c.wakes,
            "wake_s": round(c.wake_s, 4),
            "sleeps": c.sleeps,
            "sleep_s": round(c.sleep_s, 4),
            "rounds": c.rounds,
            "requests": c.requests,
            "queue_s": round(c.queue_s, 4),
            "errors": c.errors,
        }
        notes = getattr(self.handle, "server_notes", None) if self.handle is not None else None
        if isinstance(notes, list) and notes:  # what a server engine learned / could not switch off
            out["engine_notes"] = list(notes)
        return out
