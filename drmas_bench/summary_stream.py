"""One pass over a run's records for its summary (`metrics.summarize`), holding no record.

`SummaryStream.add` reads one trajectory record (a `records.RecordView`) and keeps of it what the
summary's figures need, as numbers in flat arrays (8 bytes a value, the `array` module): per sample
its question, sample index, outcome, wall time and recorded dollars; per call its sample, agent,
latency and priced dollars. Everything else is summed as it comes: per question (n, correct), per
(benchmark, agent) calls, tokens, usage sources and worker groups, per agent the protocol compliance
counts (each reply's reasons under its format rule, counted once), and the folds the workflow's
format rules and effects declare (`workflows.rules.Folded`; a plain function gets the list at the end).

What stays per sample are the numbers whose figure depends on them all: exact percentiles
(latencies) and sums whose float rounding follows the summary's record order (dollars, the QA
means). `metrics.summarize` puts them in that order (by benchmark, task id, sample index, ...) when
it computes the figures, so the summary is the same whatever order the records were read in.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from drmas_bench.figures import Effects, rule_labels
from drmas_bench.pricing import PriceSheet, turn_cost
from drmas_bench.records import USAGE_SOURCES, RecordView, TurnView
from drmas_bench.workflows import find_workflow
from drmas_bench.workflows.rules import Fold, FormatRule, as_rule, episode_functions, fold_of, ordered_reasons

QA_KEYS = ("em", "f1", "cover_em")


def role_rules(workflow: str | None) -> dict[str, FormatRule]:
    """{agent: format rule} that workflow ``workflow`` declares (`WorkflowSpec.rules`); {} for an
    unknown or unnamed workflow."""
    spec = find_workflow(workflow)
    return dict(spec.rules) if spec is not None else {}


def workflow_effects(workflow: str | None) -> Effects | None:
    """The effects block that workflow ``workflow`` declares (`figures.Effects`: key, fn, its figures),
    None when it has none."""
    spec = find_workflow(workflow)
    if spec is None or spec.effects is None:
        return None
    return spec.effects


def effect_labels(workflow: str | None) -> dict[str, str]:
    """{key: words} of the effects block workflow ``workflow`` declares (`WorkflowSpec.effect_labels`:
    its figures in order, then its other labels); {} for an unknown workflow."""
    spec = find_workflow(workflow)
    return spec.effect_labels() if spec is not None else {}


class Reader(Protocol):
    """Anything fed every record of a summary as it is read (``add(RecordView)``)."""

    def add(self, item: Any) -> None: ...


@dataclass
class AgentTally:
    """One agent's calls in one benchmark, summed."""

    calls: int = 0
    known: int = 0  # calls whose usage is known
    prompt_tokens: int = 0  # over the known calls
    completion_tokens: int = 0
    models: set[str] = field(default_factory=set)
    usage: Counter = field(default_factory=Counter)  # server / counted / unknown / flagged

    def add(self, t: TurnView) -> None:
        c = t.call
        self.calls += 1
        self.models.add(t.wg or "")
        if c.usage_known:  # per-call means over the calls whose counts mean something
            self.known += 1
            self.prompt_tokens += c.prompt_tokens
            self.completion_tokens += c.completion_tokens
        self.usage[c.usage if c.usage in USAGE_SOURCES else "unknown"] += 1
        self.usage["flagged"] += bool(c.notes)

    def merge(self, other: AgentTally) -> None:
        self.calls += other.calls
        self.known += other.known
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.models |= other.models
        self.usage.update(other.usage)


@dataclass
class AgentProtocol:
    """One agent's replies as its format rule reads them (what `metrics.compliance` reports)."""

    rule: FormatRule | None
    calls: int = 0
    valid: int = 0
    by_rules: int = 0
    reasons: Counter = field(default_factory=Counter)
    length_cut: int = 0
    empty_responses: int = 0
    figures: Fold | None = None

    def __post_init__(self) -> None:
        if self.rule is not None and self.rule.agent_figures is not None:
            self.figures = fold_of(self.rule.agent_figures)

    def add(self, t: TurnView) -> None:
        self.calls += 1
        self.valid += t.valid
        self.length_cut += t.call.finish == "length"
        self.empty_responses += not t.text.strip()
        if self.figures is not None:
            self.figures.add(t.text)
        if self.rule is not None:
            why = list(self.rule.reasons(t.text))
            self.reasons.update(why)
            self.by_rules += not why


class SummaryStream:
    """The summary's running state over records added one at a time (see the module docstring).

    workflow: the workflow that wrote the records (its rules and effects are folded as records come;
    None: none). prices: a price sheet (each call priced as it is read), or None. also: other readers
    fed every record (a run's protocol and call-cache sections)."""

    def __init__(self, workflow: str | None, prices: PriceSheet | None = None, also: Sequence[Reader] = ()) -> None:
        self.workflow = workflow
        self.prices = prices
        self.rules = {a: as_rule(r) for a, r in role_rules(workflow).items()}
        self.benchmarks: dict[str, int] = {}  # name -> code, in order of first appearance
        self.agent_codes: dict[str, int] = {}
        self.questions: dict[tuple[str, str], list[Any]] = {}  # key -> [n, c, text, sample indices, duplicates]
        self.s_bench, self.s_question, self.s_idx = array("i"), array("i"), array("q")
        self.s_correct, self.s_reward, self.s_wall, self.s_cost = array("b"), array("d"), array("d"), array("d")
        self.c_sample, self.c_agent, self.c_latency, self.c_usd = array("i"), array("i"), array("d"), array("d")
        self.question_codes: dict[tuple[str, str], int] = {}
        self.tallies: dict[tuple[int, int], AgentTally] = {}  # (benchmark code, agent code) -> tally
        self.qa: dict[str, tuple[array, array]] = {}  # em / f1 / cover_em -> (sample, value)
        self.timeouts: Counter = Counter()  # benchmark code -> samples whose grading timed out
        self.protocol: dict[str, AgentProtocol] = {}
        self.episode_folds = [fold_of(fn) for fn in episode_functions(self.rules)]
        self.effects = workflow_effects(workflow)
        self.effects_all = fold_of(self.effects[1]) if self.effects is not None else None
        self.effects_by_bench: dict[str, Fold] = {}
        self.also = list(also)

    def __len__(self) -> int:
        return len(self.s_bench)

    def add(self, r: RecordView) -> None:
        """Read one record (a `RecordView`)."""
        ordinal = len(self.s_bench)
        b = self.benchmarks.setdefault(r.benchmark, len(self.benchmarks))
        self._question(r)
        self.s_bench.append(b)
        self.s_idx.append(-1 if r.sample_idx is None else r.sample_idx)
        self.s_correct.append(r.correct)
        self.s_reward.append(r.reward)
        self.s_wall.append(r.wall_s)
        self.s_cost.append(r.cost_usd)
        for t in r.turns:
            self._turn(ordinal, b, t)
        for key in QA_KEYS:
            if key in r.extra:
                col = self.qa.setdefault(key, (array("i"), array("d")))
                col[0].append(ordinal)
                col[1].append(float(r.extra[key]))
        self.timeouts[b] += r.grade == "timeout"
        for f in self.episode_folds:
            f.add(r)
        if self.effects is not None and self.effects_all is not None:
            self.effects_all.add(r)
            by = self.effects_by_bench.get(r.benchmark)
            if by is None:
                by = self.effects_by_bench[r.benchmark] = fold_of(self.effects[1])
            by.add(r)
        for reader in self.also:
            reader.add(r)

    def _question(self, r: RecordView) -> None:
        key = (r.benchmark, r.task_id)
        slot = self.questions.get(key)
        if slot is None:
            slot = self.questions[key] = [0, 0, r.question, set(), 0]
            self.question_codes[key] = len(self.question_codes)
        slot[0] += 1
        slot[1] += r.correct
        if r.sample_idx in slot[3]:
            slot[4] += 1
        slot[3].add(r.sample_idx)
        self.s_question.append(self.question_codes[key])

    def _turn(self, ordinal: int, b: int, t: TurnView) -> None:
        a = self.agent_codes.setdefault(t.agent, len(self.agent_codes))
        tally = self.tallies.get((b, a))
        if tally is None:
            tally = self.tallies[(b, a)] = AgentTally()
        tally.add(t)
        self.c_sample.append(ordinal)
        self.c_agent.append(a)
        self.c_latency.append(t.call.latency_s)
        if self.prices is not None:
            usd = turn_cost(t, self.prices)
            self.c_usd.append(math.nan if usd is None else usd)
        p = self.protocol.get(t.agent)
        if p is None:
            p = self.protocol[t.agent] = AgentProtocol(self.rules.get(t.agent))
        p.add(t)

    # ------------------------------------------------------------------ figures of what was read

    def order(self) -> np.ndarray:
        """Sample ordinals in the summary's record order: (benchmark, task id, sample index, correct,
        reward, wall_s, cost_usd), ties in the order read (`metrics.summarize`'s order)."""
        rank = np.empty(len(self.question_codes), dtype=np.int64)
        for i, key in enumerate(sorted(self.question_codes)):
            rank[self.question_codes[key]] = i
        question = rank[np.asarray(self.s_question, dtype=np.int64)]
        return np.lexsort((np.asarray(self.s_cost), np.asarray(self.s_wall), np.asarray(self.s_reward),
                           np.asarray(self.s_correct), np.asarray(self.s_idx), question))

    def sample_figures(self, order: np.ndarray, benchmark: str | None, n_questions: int) -> dict[str, Any]:
        """A summary block's figures of samples and calls, over one benchmark's samples (None: all):
        latency_s, agents, usage, usd_total / per question / per sample, usd_source, the QA means,
        grading_timeouts (`metrics.summarize` documents them). ``order``: `order()`."""
        code = None if benchmark is None else self.benchmarks[benchmark]
        samples = order if code is None else order[np.asarray(self.s_bench)[order] == code]
        rank = np.empty(len(self), dtype=np.int64)
        rank[samples] = np.arange(len(samples))
        c_sample = np.asarray(self.c_sample, dtype=np.int64)
        in_pop = np.zeros(len(self), dtype=bool)
        in_pop[samples] = True
        calls = np.flatnonzero(in_pop[c_sample])
        calls = calls[np.argsort(rank[c_sample[calls]], kind="stable")]  # record order, each record's turns in order
        usd = np.asarray(self.c_usd)[calls] if self.prices is not None else None
        out: dict[str, Any] = {"latency_s": percentiles(np.asarray(self.s_wall)[samples]),
                               "agents": self._agents(calls, usd, code, len(samples), n_questions)}
        usage: Counter = Counter()
        for (b, _), t in self.tallies.items():
            if code is None or b == code:
                usage.update(t.usage)
        out["usage"] = {"calls": int(len(calls)), **{k: usage[k] for k in USAGE_SOURCES}, "flagged": usage["flagged"]}
        if usd is not None:
            total, source = sequential_sum(usd), "price sheet"
        else:
            total = None if usage["unknown"] else sum(np.asarray(self.s_cost)[samples].tolist())
            source = "recorded cost_usd"
        out.update(usd_total=total, usd_per_question=None if total is None else total / n_questions,
                   usd_per_sample=None if total is None else total / len(samples), usd_source=source)
        for key in QA_KEYS:
            if key in self.qa:
                at, vals = np.asarray(self.qa[key][0], dtype=np.int64), np.asarray(self.qa[key][1])
                mine = in_pop[at]
                if mine.any():
                    out[key] = float(np.mean(vals[mine][np.argsort(rank[at[mine]], kind="stable")]))
        out["grading_timeouts"] = sum(n for b, n in self.timeouts.items() if code is None or b == code)
        return out

    def _agents(self, calls: np.ndarray, usd: np.ndarray | None, code: int | None, n_samples: int,
                n_questions: int) -> dict[str, dict[str, Any]]:
        agent = np.asarray(self.c_agent, dtype=np.int64)[calls]
        latency = np.asarray(self.c_latency)[calls]
        out = {}
        for name, a in sorted(self.agent_codes.items()):
            t = AgentTally()
            for (b, ac), tally in self.tallies.items():
                if ac == a and (code is None or b == code):
                    t.merge(tally)
            if not t.calls:
                continue
            mine = agent == a
            out[name] = {
                "models": sorted(t.models), "calls": t.calls, "calls_per_traj": t.calls / n_samples,
                "prompt_tokens_per_call": t.prompt_tokens / t.known if t.known else None,
                "completion_tokens_per_call": t.completion_tokens / t.known if t.known else None,
                "usage_unknown_calls": t.usage["unknown"], "usage_counted_calls": t.usage["counted"],
                "usage_flagged_calls": t.usage["flagged"], "latency_s": percentiles(latency[mine]),
                "calls_per_question": t.calls / n_questions if n_questions else 0.0,
                "tokens_per_question": (None if t.usage["unknown"] or not n_questions
                                        else (t.prompt_tokens + t.completion_tokens) / n_questions),
            }
            if usd is not None:
                total = sequential_sum(usd[mine])
                out[name]["usd_per_call"] = None if total is None else total / t.calls
                out[name]["usd_per_question"] = None if total is None else (total / n_questions if n_questions else 0.0)
        return out

    def compliance(self) -> dict[str, Any]:
        """`metrics.compliance`'s figures of what was read."""
        agents: dict[str, dict[str, Any]] = {}
        for name, p in sorted(self.protocol.items()):
            rule = p.rule
            agents[name] = {
                "rule": rule.name if rule is not None else None, "calls": p.calls, "valid": p.valid,
                "valid_rate": p.valid / p.calls if p.calls else None,
                "invalid_reasons": ordered_reasons(rule, p.reasons) if rule is not None else {},
                "valid_by_rules": p.by_rules if rule is not None else None,
                "valid_by_rules_rate": p.by_rules / p.calls if rule is not None and p.calls else None,
                "length_cut": p.length_cut, "empty_responses": p.empty_responses,
                **(p.figures.result() if p.figures is not None else {}),
            }
        episodes: dict[str, Any] = {"episodes": len(self)}
        for f in self.episode_folds:
            episodes.update(f.result())
        # the words its rules declare for their reasons and figures, so the summary reads without them
        return {"workflow": self.workflow, "agents": agents, "episodes": episodes,
                "labels": rule_labels(self.rules.values())}

    def effects_blocks(self) -> dict[str, Any]:
        """The workflow's effects block over every record and per benchmark (`metrics.effects`), {} when
        the workflow declares none."""
        if self.effects is None or self.effects_all is None:
            return {}
        key = self.effects[0]
        return {key: self.effects_all.result(),
                "benchmarks": {b: {key: self.effects_by_bench[b].result()} for b in sorted(self.effects_by_bench)},
                "labels": effect_labels(self.workflow)}  # its declared figures' words, in order


def percentiles(xs: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """{p50, p95} of ``xs`` (None when empty)."""
    if not len(xs):
        return {"p50": None, "p95": None}
    a = np.asarray(xs, dtype=float)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95))}


def sequential_sum(values: np.ndarray) -> float | None:
    """``0.0 + v1 + v2 + ...`` in the given order (None when a value is unknown: NaN), as a loop over
    the calls adds them."""
    if np.isnan(values).any():
        return None
    total = 0.0
    for v in values.tolist():
        total += v
    return total
