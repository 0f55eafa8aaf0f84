"""Run limits: ``--max-usd`` and ``--max-tokens`` stop a run cleanly when its spending reaches them.

    drmas-bench eval --model M --suite math --prices prices.yaml --max-usd 5 --max-tokens 2000000

Where a limit comes from (the precedence of ``drmas_bench.api``): the team file's ``limits:`` <
the flags / ``EvalConfig.max_usd`` / ``max_tokens`` for the whole run; a team file's
``agents.NAME.limits:`` for one agent (its own calls only). ``--max-usd`` (or any ``max_usd``) needs
a price sheet (``--prices``): without one it is refused before the run starts.

What counts (:class:`Meter`): every call this run's engines computed, in dollars under the price
sheet (``pricing.call_cost``, the figure summary.json's ``usd`` adds up) and in tokens (prompt +
completion). A call served by the call cache is free: $0 and 0 tokens (it spent nothing). A
resumed run starts from what its kept samples spent (the run directory's selected records) plus
what earlier stops spent on episodes they abandoned (the previous summary's
``run.limits.used.abandoned``), so the limit is on the run directory, not on one process. A call
whose token usage is unknown (a server that reports none, with no tokenizer here to count it)
cannot be counted: under a limit that covers its agent the run stops with one line naming the fix
(``--tokenizer``).

When it is checked: before each call, and before each episode starts. Once a limit is reached no
call starts, from any agent; a call already in flight cannot be taken back, so it finishes and
counts, and an episode that needs another call is abandoned (never written half; a re-run runs it
again identically: per-request seeds). So that a tight limit is not spent on first calls of
episodes it cannot finish (256 episodes in flight by default), a new episode starts only while what
was used plus the episodes in flight and it, each at the mean spending of the finished episodes,
stays within every limit; otherwise it waits for one to end (:meth:`Meter.start_episode`; the
kept samples of a resumed run are the first measure, and before any episode finished one runs
alone). A run therefore overshoots by about what its episodes in flight spend beyond that mean; the
hard bound is the calls in flight when a limit is crossed, at most one per episode in flight, each
at most its prompt plus ``max_new_tokens``. A limit below what one episode spends finishes nothing:
no summary is written (there is nothing to summarize), the line says so.

What a stop leaves: every finished sample on disk, ``summary.json``'s ``run.stopped`` (``{limit,
agent, value, used, reason}``, the key ``drmas_bench.export.source.STOP_KEYS`` reads first) and
``run.limits`` (the limits and what was used), summary.md's first line naming the limit, and on the
command line one line on stderr and exit code :data:`EXIT_CODE` (3). The limits are not part of the
run's identity: a re-run with a higher limit resumes the same run directory and finishes it; a
re-run whose limit the kept samples already reach stops before any model loads, with the same
line, and loses nothing.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from drmas_bench.types import UserError

if TYPE_CHECKING:  # records (and numpy under it) load when a run counts, not when the CLI starts
    from drmas_bench.records import TurnView

#: the exit code of a command stopped by a limit (2: a refusal, 128+N: a signal)
EXIT_CODE = 3

#: the limit keys (EvalConfig fields, team-file keys) -> their flags
KEYS = {"max_usd": "--max-usd", "max_tokens": "--max-tokens"}


class LimitReached(Exception):
    """A run stopped by a limit. ``stop``: summary.json's ``run.stopped``; ``summary``: the
    :class:`drmas_bench.api.Summary` written for the finished samples (set by ``evaluate``)."""

    def __init__(self, stop: dict[str, Any], summary: Any = None) -> None:
        super().__init__(stop.get("reason", "a limit was reached"))
        self.stop = stop
        self.summary = summary

    def line(self) -> str:
        """The one line the CLI prints."""
        if self.summary is None:
            return (f"stopped: {self.stop['reason']} before any sample finished (the limit is below what one "
                    "episode spends), so there is no summary; re-run with a higher limit")
        return (f"stopped: {self.stop['reason']}; finished samples are kept in {self.summary.run_dir}; re-run with a "
                "higher limit to resume")


@dataclass(frozen=True)
class Limits:
    """The limits of one run: run-wide (``max_usd`` / ``max_tokens``) and per agent
    (``agents[name] = {"max_usd": ..., "max_tokens": ...}``); ``where``: each limit's source for
    messages (``"--max-usd"``, ``"team.yaml: limits.max_usd"``, ``"team.yaml: agents.solver.limits.max_tokens"``)."""

    max_usd: float | None = None
    max_tokens: int | None = None
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The limits as summary.json's ``run.limits`` shows them."""
        return {"max_usd": self.max_usd, "max_tokens": self.max_tokens, "agents": self.agents}


def resolve_limits(max_usd: float | None, max_tokens: int | None, team: Any, prices: Any,
                   team_where: str = "team file") -> Limits | None:
    """The run's limits: the flags (``max_usd`` / ``max_tokens``, None = not given) over the team
    file's ``limits:``, plus its per-agent ``agents.NAME.limits:``; None when there are none. A
    dollar limit without a price sheet is one UserError naming where it came from."""
    run = dict(getattr(team, "limits", None) or {})
    where = {k: f"{team_where}: limits.{k}" for k in run}
    for key, v in (("max_usd", max_usd), ("max_tokens", max_tokens)):
        if v is not None:
            run[key], where[key] = v, KEYS[key]
    agents = {a: dict(d) for a, d in (getattr(team, "agent_limits", None) or {}).items() if d}
    for a, d in agents.items():
        for key in d:
            where[f"{a}.{key}"] = f"{team_where}: agents.{a}.limits.{key}"
    if not run and not agents:
        return None
    if prices is None:
        usd = [w for k, w in where.items() if k.endswith("max_usd")]
        if usd:
            raise UserError(f"{usd[0]} needs a price sheet to count dollars: pass --prices FILE (docs/pricing.md), "
                            "or limit tokens with --max-tokens")
    return Limits(run.get("max_usd"), run.get("max_tokens"), agents, where)


def _usage_of(turn: TurnView, prices: Any) -> tuple[int, float | None, bool]:
    """(tokens, dollars, usage known) of one recorded call as this run spent it: a cache hit spent
    nothing; dollars from ``pricing.call_cost`` (the summary's figure; None without prices)."""
    from drmas_bench.pricing import call_cost

    c = turn.call
    if not c.usage_known:
        return 0, None, False
    if c.cache_hit:
        return 0, 0.0, True
    return c.tokens, (call_cost(c, prices, turn.wg or "") if prices is not None else None), True


def _fmt(key: str, v: float) -> str:
    return f"${v:.4f}" if key == "max_usd" else f"{int(v):,} tokens"


class Meter:
    """Counts what a run spent, per agent and in all, and says when a limit is reached (module
    docstring). ``prices``: the run's price sheet (with its worker-group aliases), or None."""

    def __init__(self, limits: Limits, prices: Any = None) -> None:
        self.limits = limits
        self.prices = prices
        self.agents: dict[str, dict[str, float]] = {}  # agent -> {tokens, usd, calls}
        self.stopped: dict[str, Any] | None = None  # run.stopped once a limit is reached
        self.running = 0  # episodes started and not ended (start_episode / end_episode)
        self._finished = 0  # episodes finished (kept samples included) and what they spent, per scope and key
        self._episode_sums: dict[tuple[str | None, str], float] = {}
        self._changed: Any = None  # asyncio.Condition, made on first use inside the running loop

    @property
    def tokens(self) -> int:
        return int(sum(a["tokens"] for a in self.agents.values()))

    @property
    def usd(self) -> float:
        return float(sum(a["usd"] for a in self.agents.values()))

    def _tally(self, agent: str) -> dict[str, float]:
        return self.agents.setdefault(agent, {"tokens": 0, "usd": 0.0, "calls": 0})

    def add_records(self, records: Iterable[dict[str, Any]]) -> "Meter":
        """Count the calls of kept samples (a resumed run's spending so far)."""
        from drmas_bench.records import RecordView

        for r in map(RecordView.of, records):
            for t in r.turns:
                self.add(t)
        return self

    def add_abandoned(self, summary: dict[str, Any] | None) -> "Meter":
        """Count what earlier stops of this run directory spent on episodes they abandoned (a
        previous summary.json's ``run.limits.used.abandoned``): spent, though on no kept sample."""
        gone = ((((summary or {}).get("run") or {}).get("limits") or {}).get("used") or {}).get("abandoned") or {}
        for agent, d in (gone.get("agents") or {}).items():
            if isinstance(d, dict):
                a = self._tally(str(agent))
                a["tokens"] += int(d.get("tokens") or 0)
                a["usd"] += float(d.get("usd") or 0.0)
        return self

    def covers(self, agent: str) -> bool:
        return bool(self.limits.max_usd is not None or self.limits.max_tokens is not None
                    or self.limits.agents.get(agent))

    def add(self, turn: Any) -> None:
        """Count one call (a ``records.TurnView``, or a stored turn); refuse one whose usage is unknown
        when a limit covers its agent. Does not check the limits (:meth:`check` does)."""
        from drmas_bench.records import TurnView

        turn = TurnView.of(turn)
        agent = turn.agent
        tokens, usd, known = _usage_of(turn, self.prices)
        if not known and self.covers(agent):
            raise UserError(f"the run's limits cannot count agent {agent!r}'s calls: worker group {turn.wg!r} "
                            "reported no token usage and no tokenizer here counts it (pass --tokenizer, or run "
                            "without --max-usd / --max-tokens)")
        a = self._tally(agent)
        a["tokens"] += tokens
        a["usd"] += usd or 0.0
        a["calls"] += 1

    def reached(self) -> dict[str, Any] | None:
        """:attr:`stopped`, set at the first limit reached (run-wide first, then per agent in order)."""
        if self.stopped is not None:
            return self.stopped
        for agent, key, limit in self._scopes():
            used = self._used(agent, key)
            if used >= limit:
                src = self.limits.where.get(f"{agent}.{key}" if agent else key, KEYS[key])
                name = f"{KEYS[key]} {limit:g}" if src == KEYS[key] else f"{key} {limit:g} ({src})"
                who = f"agent {agent!r}: " if agent else ""
                self.stopped = {"limit": KEYS[key], "agent": agent, "value": limit,
                                "used": round(used, 6) if key == "max_usd" else int(used),
                                "reason": f"{who}{name} reached ({_fmt(key, used)} spent)"}
                break
        return self.stopped

    def check(self) -> None:
        """Raise :class:`LimitReached` when a limit is reached: no call starts after that."""
        stop = self.reached()
        if stop is not None:
            raise LimitReached(stop)

    def _scopes(self) -> list[tuple[str | None, str, float]]:
        """(agent or None for the run, key, limit) of every limit set."""
        out = [(None, k, getattr(self.limits, k)) for k in KEYS if getattr(self.limits, k) is not None]
        return out + [(a, k, d[k]) for a, d in self.limits.agents.items() for k in KEYS if d.get(k) is not None]

    def _used(self, agent: str | None, key: str) -> float:
        if agent is None:
            return self.usd if key == "max_usd" else self.tokens
        a = self.agents.get(agent, {"tokens": 0, "usd": 0.0})
        return a["usd"] if key == "max_usd" else a["tokens"]

    def _episode_cost(self, turns: Iterable[TurnView]) -> dict[tuple[str | None, str], float]:
        """What one episode spent in each limit's scope."""
        out: dict[tuple[str | None, str], float] = {}
        for t in turns:
            tokens, usd, _ = _usage_of(t, self.prices)
            for scope in (None, t.agent):
                out[(scope, "max_tokens")] = out.get((scope, "max_tokens"), 0.0) + tokens
                out[(scope, "max_usd")] = out.get((scope, "max_usd"), 0.0) + (usd or 0.0)
        return out

    def _finish(self, cost: dict[tuple[str | None, str], float]) -> None:
        self._finished += 1
        for k, v in cost.items():
            self._episode_sums[k] = self._episode_sums.get(k, 0.0) + v

    def learn(self, records: Iterable[dict[str, Any]]) -> "Meter":
        """Take the kept samples as the first measure of what an episode spends (:meth:`start_episode`)."""
        from drmas_bench.records import RecordView

        for r in map(RecordView.of, records):
            self._finish(self._episode_cost(r.turns))
        return self

    def _fits_another(self) -> bool:
        """Whether what was used plus the episodes in flight and one more, each at the mean spending
        of the finished ones, stays within every limit (no episode finished yet: only one at a time)."""
        if not self._finished:
            return self.running == 0
        for scope, key, limit in self._scopes():
            mean = self._episode_sums.get((scope, key), 0.0) / self._finished
            if self._used(scope, key) + (self.running + 1) * mean > limit:
                return False
        return True

    async def start_episode(self) -> None:
        """Before an episode's first call (the runner's gate): raise :class:`LimitReached` once a limit
        is reached; wait while the episodes in flight are expected to spend what is left; with none in
        flight, start. Calls of episodes already started are only checked (:meth:`check`), so the
        budget goes to finishing episodes rather than to first calls of episodes it cannot finish."""
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with self._changed:
            while True:
                self.check()
                if self.running == 0 or self._fits_another():
                    break
                await self._changed.wait()
            self.running += 1

    async def end_episode(self, traj: Any) -> None:
        """An episode left (its ``Trajectory`` when it finished, None when abandoned, failed or never
        started): learn what it spent, wake the episodes waiting to start."""
        async with self._changed:
            if traj is not None:
                self._finish(self._episode_cost(call_turn(t.wg, t.completion, t.agent) for t in traj.turns))
            self.running -= 1
            self._changed.notify_all()

    def record(self, kept: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """summary.json's ``run.limits``: the limits, and what was used (in all and per agent)
        including ``abandoned``: what was counted but is on none of the ``kept`` records (calls of
        episodes a stop abandoned, in this process and in earlier stops)."""
        on_disk = Meter(self.limits, self.prices).add_records(kept).agents
        priced = self.prices is not None

        def figures(d: dict[str, float], calls: bool = True) -> dict[str, Any]:
            out = {"usd": round(d["usd"], 6) if priced else None, "tokens": int(d["tokens"])}
            return {**out, "calls": int(d["calls"])} if calls else out

        gone = {a: {"tokens": d["tokens"] - on_disk.get(a, {}).get("tokens", 0),
                    "usd": d["usd"] - on_disk.get(a, {}).get("usd", 0.0)} for a, d in sorted(self.agents.items())}
        gone = {a: d for a, d in gone.items() if d["tokens"] > 0 or d["usd"] > 1e-12}
        return {**self.limits.record(),
                "used": {"usd": round(self.usd, 6) if priced else None, "tokens": self.tokens,
                         "agents": {a: figures(d) for a, d in sorted(self.agents.items())},
                         "abandoned": {"usd": round(sum(d["usd"] for d in gone.values()), 6) if priced else None,
                                       "tokens": int(sum(d["tokens"] for d in gone.values())),
                                       "agents": {a: figures(d, calls=False) for a, d in gone.items()}}}}


def call_turn(wg: str, c: Any, agent: str) -> TurnView:
    """A live call (a ``Completion``) as the recorded turn the meter counts."""
    from drmas_bench.records import CallView, TurnView

    return TurnView(agent=agent, wg=wg, call=CallView(
        prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens, tokens_recorded=True,
        latency_s=c.latency_s, usage=c.usage, cache_hit=c.cache_hit))


class LimitedEngine:
    """One worker group's engine (a pool view, or the call cache's engine over it) under the run's
    :class:`Meter`: each request is checked before it goes out, each completion counted when it
    comes back."""

    def __init__(self, engine: Any, meter: Meter, wg: str) -> None:
        self.engine = engine
        self.meter = meter
        self.wg = wg

    async def generate(self, requests: list) -> list:
        self.meter.check()
        got = await self.engine.generate(requests)
        for r, c in zip(requests, got):
            self.meter.add(call_turn(self.wg, c, r.agent))
        return got

    def __getattr__(self, name: str) -> Any:  # name, model, is_awake, close: the wrapped engine's
        return getattr(self.engine, name)


def _previous_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run directory's summary.json from before this process (None: none, or unreadable)."""
    try:
        doc = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def start_meter(p: Any, store: Any) -> tuple[Meter, dict[str, Any] | None]:
    """The meter of plan ``p``'s run (``p.limits`` set) over its open run directory ``store``: what
    the kept samples and earlier stops spent counted. When that already reaches a limit and samples
    remain to be run, also the fields of the run's ``runner.RunStats`` (``skipped``, ``stopped``,
    ``limits``; nothing run): the caller stops before any model loads. -> (meter, fields or None)"""
    kept = store.selected()
    meter = Meter(p.limits, p.prices).add_records(kept).add_abandoned(_previous_summary(store.path)).learn(kept)
    stop = meter.reached()
    if stop is None:
        return meter, None
    done = store.done_keys()
    todo = sum((t.benchmark, t.id, i) not in done for t in p.tasks for i in range(p.cfg.n))
    if not todo:  # every sample is finished: the limit stops nothing
        return meter, None
    return meter, {"skipped": len(p.tasks) * p.cfg.n - todo, "stopped": stop, "limits": meter.record(kept)}


__all__ = ["EXIT_CODE", "LimitReached", "LimitedEngine", "Limits", "Meter", "resolve_limits", "start_meter"]
