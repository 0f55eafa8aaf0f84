"""The pool's dispatch policy: pure functions over a snapshot of the worker groups.

The pool (``LocalPool`` / ``RayPool``) keeps, per worker group, a :class:`GroupState` and asks
:func:`decide` what to do next, again and again, until the answer is "wait" or "nothing to do":

1. **Who goes next.** Among worker groups with pending requests, the one with the most pending
   requests; ties go to the group whose oldest pending request is oldest (then by name, so the
   answer is deterministic). With ``max_wait_s`` set, a group whose oldest request has waited at
   least that long jumps ahead (oldest first), so an open-loop load cannot starve a small group.
2. **Awake (or waking)?** Serve it now (an engine may run several rounds at once; its own
   micro-batcher merges them).
3. **Asleep?** It must wake. Its footprint must fit in the memory budget (and, with ``max_awake``,
   in the number of engines that may be resident at once). If it does not fit, put **idle**
   (awake, not serving) engines to sleep, least recently used first, until it does. Never sleep a
   serving or waking engine.
4. **Still does not fit** (serving engines hold the budget)? **Wait**: nothing else is dispatched
   until a serving engine finishes (strict priority: the head of the queue is never overtaken, so
   it cannot starve behind engines that happen to be awake).

**Held asleep.** A group can be *held* (the trainer's update phase: its memory belongs to the
update): before anything else, every held group that is awake and idle is put to sleep
(:class:`Sleep`); a held group is never woken or served, its requests wait for the release, and it
does not block the groups behind it. A held group that is still serving finishes its round first.

A single engine larger than the whole budget can never be served: :class:`BudgetError` names the
worker group and both sizes.

States: ``asleep`` (no weights resident; also "not loaded yet"), ``waking`` (a wake or first load
is running: counts as resident, cannot be put to sleep), ``awake``, ``sleeping`` (a sleep is
running: its memory is already promised to whoever woke next; the pool makes every wake wait for
running sleeps, so the budget also holds physically).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from drmas_bench.types import UserError

ASLEEP = "asleep"
WAKING = "waking"
AWAKE = "awake"
SLEEPING = "sleeping"
STATES = (ASLEEP, WAKING, AWAKE, SLEEPING)


class BudgetError(UserError):
    """A worker group's engine is larger than the pool's whole memory budget."""

    def __init__(self, group: str, footprint: int, budget: int) -> None:
        self.group = group
        self.footprint = footprint
        self.budget = budget
        super().__init__(
            f"worker group {group!r} needs {fmt_bytes(footprint)} ({footprint} bytes) but the pool's "
            f"memory budget is {fmt_bytes(budget)} ({budget} bytes); raise the budget or use a smaller model"
        )


@dataclass(frozen=True)
class GroupState:
    """What the policy knows about one worker group at one moment.

    - ``name``: the worker group.
    - ``footprint``: bytes its engine occupies when awake (an estimate until it was first loaded,
      see :func:`estimate_footprint`).
    - ``state``: one of ``asleep``, ``waking``, ``awake``, ``sleeping``.
    - ``serving``: rounds of requests in flight on its engine (a waking group counts the round
      that woke it).
    - ``pending``: requests queued for it and not yet dispatched.
    - ``oldest``: arrival time of its oldest pending request (any monotonic clock;
      ``inf`` when none).
    - ``last_used``: when it last started or finished serving (least recently used = smallest).
    - ``held``: held asleep (see the module docstring): put to sleep when idle, never woken.
    """

    name: str
    footprint: int
    state: str = ASLEEP
    serving: int = 0
    pending: int = 0
    oldest: float = math.inf
    last_used: float = 0.0
    held: bool = False

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"unknown state {self.state!r} for group {self.name!r}; one of {', '.join(STATES)}")

    @property
    def resident(self) -> bool:
        """Its memory counts against the budget (awake or waking)."""
        return self.state in (AWAKE, WAKING)

    @property
    def idle(self) -> bool:
        """Awake and serving nothing: a candidate for sleeping."""
        return self.state == AWAKE and self.serving == 0


@dataclass(frozen=True)
class Serve:
    """Dispatch the pending requests of ``group``. ``wake``: wake it first (after the groups in
    ``sleep`` were put to sleep, in that order)."""

    group: str
    wake: bool = False
    sleep: tuple[str, ...] = ()


@dataclass(frozen=True)
class Wait:
    """``group`` is next but does not fit while ``blocked_by`` (serving / waking groups) hold the
    budget; decide again when one of them finishes."""

    group: str
    blocked_by: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Sleep:
    """Put ``groups`` to sleep now (held groups that are awake and idle), in that order."""

    groups: tuple[str, ...]


Decision = Serve | Wait | Sleep | None


def fmt_bytes(n: float) -> str:
    """Human-readable bytes (binary units): ``fmt_bytes(3 * 2**20) == '3.0 MiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def estimate_footprint(known: int | None, *, hint: int | None, largest_known: int | None,
                       budget: int | None) -> int:
    """Bytes to budget for a group: its measured footprint once loaded; before that the hint the
    user gave, else the largest footprint measured so far (at most the budget: a group is not
    refused for another group's size), else the whole budget (so the very first load runs alone),
    else 0 (no budget: nothing to respect)."""
    if known is not None:
        return known
    if hint is not None:
        return hint
    if largest_known is not None:
        return largest_known if budget is None else min(largest_known, budget)
    return budget if budget is not None else 0


def check_fits(group: str, footprint: int, budget: int | None) -> None:
    """Raise :class:`BudgetError` when one engine alone exceeds the budget."""
    if budget is not None and footprint > budget:
        raise BudgetError(group, footprint, budget)


def order(groups: Iterable[GroupState], *, now: float | None = None, max_wait_s: float | None = None) -> list[GroupState]:
    """Groups with pending requests, best first: most pending, then oldest request, then name.
    With ``max_wait_s`` (and ``now``), groups whose oldest request waited at least that long come
    first, oldest first."""
    cands = [g for g in groups if g.pending > 0 and not g.held]

    def key(g: GroupState) -> tuple:
        starving = max_wait_s is not None and now is not None and now - g.oldest >= max_wait_s
        if starving:
            return (0, g.oldest, 0, g.name)
        return (1, -g.pending, g.oldest, g.name)

    return sorted(cands, key=key)


def _fits(used: int, count: int, need: int, budget: int | None, max_awake: int | None) -> bool:
    return (budget is None or used + need <= budget) and (max_awake is None or count + 1 <= max_awake)


def make_room(groups: Sequence[GroupState], need: int, budget: int | None, *, max_awake: int | None = None,
              exclude: str | None = None) -> tuple[str, ...] | None:
    """The idle groups to put to sleep, least recently used first, so that one more engine of
    ``need`` bytes fits (budget and ``max_awake``); ``()`` when it fits already, ``None`` when even
    sleeping every idle group is not enough. ``exclude`` is never chosen (the group to wake)."""
    resident = [g for g in groups if g.resident and g.name != exclude]
    used = sum(g.footprint for g in resident)
    count = len(resident)
    chosen: list[str] = []
    idle = sorted((g for g in resident if g.idle), key=lambda g: (g.last_used, g.name))
    for g in idle:
        if _fits(used, count, need, budget, max_awake):
            break
        chosen.append(g.name)
        used -= g.footprint
        count -= 1
    return tuple(chosen) if _fits(used, count, need, budget, max_awake) else None


def to_hold(groups: Iterable[GroupState]) -> tuple[str, ...]:
    """The held groups to put to sleep now: awake and idle ones, least recently used first (a held
    group that is serving finishes its round; one that is waking is put to sleep once awake)."""
    return tuple(g.name for g in sorted((g for g in groups if g.held and g.idle), key=lambda g: (g.last_used, g.name)))


def decide(groups: Sequence[GroupState], budget: int | None, *, max_awake: int | None = None,
           now: float | None = None, max_wait_s: float | None = None) -> Decision:
    """The next step (see the module docstring): :class:`Sleep` (held groups first), :class:`Serve`,
    :class:`Wait`, or ``None`` when no request can be dispatched (none pending, or only held groups'
    requests). Raises :class:`BudgetError` when the next group can never fit.

    - ``budget``: bytes the resident engines may occupy together (``None``: unlimited).
    - ``max_awake``: most engines resident at once (``None``: no limit), e.g. one per GPU when each
      engine owns a whole GPU.
    - ``now`` / ``max_wait_s``: anti-starvation (see :func:`order`); both ``None`` by default.
    """
    if max_awake is not None and max_awake < 1:
        raise ValueError(f"max_awake must be >= 1, got {max_awake}")
    hold = to_hold(groups)
    if hold:
        return Sleep(hold)
    cands = order(groups, now=now, max_wait_s=max_wait_s)
    if not cands:
        return None
    head = cands[0]
    if head.resident:
        return Serve(head.name)
    check_fits(head.name, head.footprint, budget)
    sleep = make_room(groups, head.footprint, budget, max_awake=max_awake, exclude=head.name)
    if sleep is not None:
        return Serve(head.name, wake=True, sleep=sleep)
    blocked = tuple(sorted(g.name for g in groups if g.resident and not g.idle))
    used = sum(g.footprint for g in groups if g.resident)
    count = sum(1 for g in groups if g.resident)
    if budget is not None and used - sum(g.footprint for g in groups if g.idle) + head.footprint > budget:
        reason = (f"needs {fmt_bytes(head.footprint)}; {fmt_bytes(used)} of {fmt_bytes(budget)} resident, "
                  f"held by serving {', '.join(blocked)}")
    else:
        reason = f"{count} of {max_awake} engines resident, held by serving {', '.join(blocked)}"
    return Wait(head.name, blocked, reason)
