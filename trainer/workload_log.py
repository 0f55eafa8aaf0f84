"""A step's workload, measured: what the hours model (drmas_trainer.forecast.hours) otherwise assumes from the
recipe's ``plan:`` section - which generate calls a step makes, how many episodes are still running
at each, and how long its prompts and responses are.

The trainer logs it every step (:func:`step_metrics`, names in drmas_trainer.metric_names), and
``drmas-bench train --plan --workload RUN`` reads it back (:func:`load`) from either

- a training run's ``metrics.jsonl`` (its first steps: ``--workload RUN`` averages every step
  logged, ``RUN:K`` the first K), or
- an eval run's ``samples.jsonl`` (``drmas-bench eval`` of the starting team, or a stand-in team
  with the same workflow): each record's turns hold the call's prompt and response tokens.

A generate call is identified by the workflow's call index - the turn's position in the episode,
from 0 - and the agent that answered it: the reference's lockstep orchestra serves call i of every
open episode as one batch, which then waits for its longest response.

    wl = load("runs/eval_team")          # a MeasuredWorkload
    print(wl.source, [c.episodes for c in wl.calls])
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from drmas_bench.records import view
from drmas_bench.report.runs import load_run
from drmas_bench.types import UserError
from drmas_trainer import metric_names as mn
from drmas_trainer.forecast.workload import CallLoad, Workload
from drmas_trainer.runlog import read_metrics


@dataclass(frozen=True)
class MeasuredCall:
    """One generate call of a step: the workflow's call ``index``, its ``agent``, the episodes
    still running at it, and its mean prompt, mean response and longest response tokens."""

    index: int
    agent: str
    episodes: float
    prompt_tokens: float
    response_mean: float
    response_max: float


@dataclass(frozen=True)
class MeasuredWorkload:
    """A step's measured workload: ``episodes`` started per step, the ``calls`` in order, and
    ``source``: where the figures come from (a file and which steps or episodes)."""

    episodes: float
    calls: tuple[MeasuredCall, ...]
    source: str

    def share(self, c: MeasuredCall) -> float:
        """The share of the step's episodes call ``c`` serves."""
        return c.episodes / self.episodes if self.episodes else 0.0

    def for_plan(self, cap: int) -> Workload:
        """The hours model's input (drmas_trainer.forecast.workload): each call's share of the step's
        episodes, its mean prompt, and its mean and longest response capped at ``cap`` (the recipe's
        max_new_tokens: a stand-in team's eval may have run with another)."""
        calls = tuple(CallLoad(c.agent, self.share(c), c.prompt_tokens, min(c.response_mean, cap),
                               min(c.response_max, cap)) for c in self.calls if c.episodes)
        return Workload(calls, f"measured: {self.source}", measured=True)


def _turn_figures(records: Iterable[Any]) -> tuple[int, dict[tuple[int, str], list[tuple[int, int]]]]:
    """(episodes, (call index, agent) -> [(prompt tokens, response tokens) per episode that made it])."""
    calls: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    n = 0
    for r in records:
        n += 1
        for i, t in enumerate(view(r).turns):
            calls[(i, t.agent)].append((t.call.prompt_tokens, t.call.completion_tokens))
    return n, calls


def measure(records: Iterable[Any], source: str) -> MeasuredWorkload:
    """The workload of ``records`` (trajectories, stored records or their views) as one step."""
    n, calls = _turn_figures(records)
    out = [MeasuredCall(i, a, len(xs), sum(p for p, _ in xs) / len(xs), sum(r for _, r in xs) / len(xs),
                        max(r for _, r in xs)) for (i, a), xs in sorted(calls.items())]
    return MeasuredWorkload(float(n), tuple(out), source)


def step_metrics(trajs: Iterable[Any], group_of: dict[str, str]) -> dict[str, float]:
    """The step's workload figures for its record: per generate call (``agent/<a>/workload/call<i>/...``),
    per worker group (the tokens its update trains on) and the episodes started."""
    trajs = list(trajs)
    wl = measure(trajs, "this step")
    rec: dict[str, float] = {mn.WL_EPISODES: wl.episodes}
    for c in wl.calls:
        for name, v in zip(mn.WL_CALL_FIGURES, (c.episodes, c.prompt_tokens, c.response_mean, c.response_max)):
            rec[mn.call(c.agent, c.index, name)] = v
    for g in dict.fromkeys(group_of.values()):
        rows = [(c.episodes * c.prompt_tokens, c.episodes * c.response_mean) for c in wl.calls
                if group_of.get(c.agent) == g]
        rec[mn.wg(g, mn.WL_PROMPT_TOKENS)] = sum(p for p, _ in rows)
        rec[mn.wg(g, mn.WL_RESPONSE_TOKENS)] = sum(r for _, r in rows)
    return rec


_CALL_KEY = re.compile(r"^agent/(?P<agent>.+)/workload/call(?P<index>\d+)/(?P<name>.+)$")


def from_metrics(records: list[dict[str, Any]], source: str) -> MeasuredWorkload:
    """The mean workload of training steps' records (a call a step did not make counts 0 episodes
    there; its token figures are the mean over the steps that made it, the longest their maximum)."""
    per: dict[tuple[int, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        for k, v in r.items():
            m = _CALL_KEY.match(k)
            if m:
                per[(int(m["index"]), m["agent"])]["workload/" + m["name"]].append(float(v))
    steps = len(records)
    calls = []
    for (i, a), f in sorted(per.items()):
        def mean(name: str) -> float:
            return sum(f[name]) / len(f[name]) if f[name] else 0.0
        calls.append(MeasuredCall(i, a, sum(f[mn.WL_EPISODES]) / steps, mean(mn.WL_PROMPT), mean(mn.WL_RESPONSE),
                                  max(f[mn.WL_RESPONSE_MAX], default=0.0)))
    episodes = sum(float(r.get(mn.WL_EPISODES, 0.0)) for r in records) / steps
    return MeasuredWorkload(episodes, tuple(calls), source)


def load(spec: str) -> MeasuredWorkload:
    """``--workload``'s value: ``RUN`` or ``RUN:K`` (a training run's first K steps); a training run
    (``metrics.jsonl``) or an eval run (``samples.jsonl``). One-line errors for anything else."""
    path, _, k = spec.rpartition(":") if re.search(r":\d+$", spec) else (spec, "", "")
    run = Path(path)
    first = int(k) if k else None
    if first is not None and first < 1:
        raise UserError(f"--workload {spec}: the number of steps after ':' must be positive")
    if (run / "metrics.jsonl").is_file():
        recs = [r for r in read_metrics(run / "metrics.jsonl") if mn.WL_EPISODES in r]
        if not recs:
            raise UserError(f"--workload {spec}: {run / 'metrics.jsonl'} has no step with the workload figures "
                            f"({mn.WL_EPISODES}); the run predates them or has no RL step yet")
        recs = recs[:first] if first else recs
        steps = [int(r.get("step", 0)) for r in recs]
        return from_metrics(recs, f"{run / 'metrics.jsonl'}, steps {min(steps)}-{max(steps)} ({len(recs)} logged)")
    if first is not None:
        raise UserError(f"--workload {spec}: ':{k}' counts training steps, and {run} has no metrics.jsonl")
    samples = run / "samples.jsonl"
    if samples.is_file():
        recs = load_run(run, compact=True).views  # the run's own selection: what its summary counts
        return measure(recs, f"{samples}, {len(recs)} episodes of an eval run (one step's worth)")
    raise UserError(f"--workload {spec}: neither {run / 'metrics.jsonl'} (a training run) nor {samples} (an eval "
                    f"run) is there")
