"""Paired comparisons (`compare_runs`): two runs on their shared questions (same benchmark + task
id): differences in avg@n and pass@k with a seeded paired bootstrap CI, an exact two-sided sign test
over the questions whose success rate differs, the questions that flipped, and the effects block each
run's workflow declares, side by side (`effects_sides`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from drmas_bench.figures import labels_of
from drmas_bench.metrics import (
    MICRO,
    Question,
    avg_values,
    bootstrap_mean_ci,
    pass_values,
    questions,
    seed_for,
    workflow_effects,
)
from drmas_bench.report.leaderboard import digest, suite_order
from drmas_bench.report.runs import Run, differing
from drmas_bench.types import UserError


@dataclass
class Flip:
    benchmark: str
    id: str
    question: str
    a: tuple[int, int]  # (c, n) in run A
    b: tuple[int, int]

    @property
    def direction(self) -> str:
        return "B only" if self.b[0] > 0 else "A only"


@dataclass
class PairedResult:
    """One benchmark (or all shared questions pooled) in a paired comparison. Differences are B - A."""

    name: str
    shared: int
    only_a: int
    only_b: int
    k_pass: int
    avg_a: float
    avg_b: float
    avg_ci: tuple[float, float]
    pass_a: float
    pass_b: float
    pass_ci: tuple[float, float]
    b_better: int  # questions where B's success rate is higher
    a_better: int
    ties: int
    sign_p: float
    flips: list[Flip] = field(default_factory=list)

    @property
    def avg_diff(self) -> float:
        return self.avg_b - self.avg_a

    @property
    def pass_diff(self) -> float:
        return self.pass_b - self.pass_a


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign test: P(|X - m/2| >= |wins - m/2|) for X ~ Binomial(m = wins + losses, 1/2)."""
    m = wins + losses
    if m == 0:
        return 1.0
    lo = min(wins, losses)
    tail = sum(math.comb(m, i) for i in range(lo + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**m)))


def _paired(name: str, qa: list[Question], qb: list[Question], only_a: int, only_b: int,
            n_boot: int, seed: int) -> PairedResult:
    k = min(min(q.n for q in qa), min(q.n for q in qb))
    ra, rb = avg_values(qa), avg_values(qb)
    pa, pb = pass_values(qa, k), pass_values(qb, k)
    b_better = sum(1 for x, y in zip(qa, qb) if Fraction(y.c, y.n) > Fraction(x.c, x.n))
    a_better = sum(1 for x, y in zip(qa, qb) if Fraction(y.c, y.n) < Fraction(x.c, x.n))
    flips = [Flip(x.benchmark, x.id, x.text, (x.c, x.n), (y.c, y.n)) for x, y in zip(qa, qb) if (x.c > 0) != (y.c > 0)]
    return PairedResult(
        name=name, shared=len(qa), only_a=only_a, only_b=only_b, k_pass=k,
        avg_a=float(ra.mean()), avg_b=float(rb.mean()),
        avg_ci=bootstrap_mean_ci([rb - ra], n_boot, seed_for("avg", seed)),
        pass_a=float(pa.mean()), pass_b=float(pb.mean()),
        pass_ci=bootstrap_mean_ci([pb - pa], n_boot, seed_for("pass", seed)),
        b_better=b_better, a_better=a_better, ties=len(qa) - b_better - a_better,
        sign_p=sign_test_p(b_better, a_better), flips=flips,
    )


@dataclass
class EffectsSide:
    """One workflow's effects block in a comparison: its key, the words of its declared figures, and
    the block over run A's and run B's records (None for a run of another workflow)."""

    key: str
    workflow: str
    words: dict[str, str]
    a: dict[str, Any] | None
    b: dict[str, Any] | None


@dataclass
class Comparison:
    a: Run
    b: Run
    benchmarks: list[PairedResult]
    pooled: PairedResult
    notes: list[str]
    n_boot: int
    seed: int
    effects: list[EffectsSide] = field(default_factory=list)  # what each run's workflow declares, side by side


def effects_sides(a: Run, b: Run) -> list[EffectsSide]:
    """The effects blocks the two runs' workflows declare (`figures.Effects`), over all of each run's
    records (`leaderboard.digest`), one side per block key: A and B together when their workflows
    declare the same key."""
    out: dict[str, EffectsSide] = {}
    for side, run in (("a", a), ("b", b)):
        declared = workflow_effects(run.workflow)
        block = digest(run).effects
        if declared is None or block is None:
            continue
        s = out.setdefault(declared.key, EffectsSide(declared.key, run.workflow, labels_of(declared.figures), None, None))
        setattr(s, side, block)
    return list(out.values())


def compare_runs(a: Run, b: Run, n_boot: int = 2000, seed: int = 0) -> Comparison:
    """Paired comparison of run B against run A on their shared questions (see the module docstring)."""
    qa, qb = questions(a.views), questions(b.views)
    shared = [k for k in qa if k in qb]
    if not shared:
        raise UserError(f"{a.name} and {b.name} share no questions (same benchmark and task id)")
    order = {bn: i for i, bn in enumerate(suite_order(a.suite) or a.benchmarks)}
    benches = sorted({k[0] for k in shared}, key=lambda bn: (order.get(bn, 99), bn))
    results = []
    for bn in benches:
        keys = [k for k in shared if k[0] == bn]
        only_a = sum(1 for k in qa if k[0] == bn and k not in qb)
        only_b = sum(1 for k in qb if k[0] == bn and k not in qa)
        results.append(_paired(bn, [qa[k] for k in keys], [qb[k] for k in keys], only_a, only_b, n_boot, seed))
    pooled = _paired(MICRO, [qa[k] for k in shared], [qb[k] for k in shared],
                     sum(1 for k in qa if k not in qb), sum(1 for k in qb if k not in qa), n_boot, seed)
    notes = []
    if a.n != b.n:
        notes.append(f"n differs (A {a.n}, B {b.n}): avg@n compares success rates; pass uses k = min n "
                     "(unbiased estimator)")
    if a.sampling_signature != b.sampling_signature:
        notes.append(f"sampling differs: A {a.sampling_label}; B {b.sampling_label}")
    if a.suite != b.suite:
        notes.append(f"suites differ (A {a.suite}, B {b.suite})")
    for name, (va, vb) in differing(a, b, ("grader", "prompts", "protocol")).items():  # report.runs: one home
        notes.append(f"{name} differs (A {va}, B {vb}): the runs do not measure the same thing")
    for r in results:
        if r.only_a or r.only_b:
            notes.append(f"{r.name}: {r.only_a} questions only in A, {r.only_b} only in B (left out)")
    only_a_b = [bn for bn in {k[0] for k in qa} ^ {k[0] for k in qb} if bn not in benches]
    if only_a_b:
        notes.append(f"benchmarks in one run only (left out): {', '.join(sorted(only_a_b))}")
    return Comparison(a, b, results, pooled, notes, n_boot, seed, effects_sides(a, b))
