"""Leaderboards (`build_leaderboard`): one table per (suite, metric); rows are runs (plus the
paper's *reported* rows from ``leaderboards/reference/paper.yaml``), columns are benchmarks, the
micro average (every question weighted equally) and the macro average (mean of benchmarks).

``avg@K`` needs a run with exactly K samples per question, else avg@n is shown and flagged;
``pass@K`` (at least one of K samples succeeds) and ``pass^K`` (all K of K succeed) use the unbiased
estimators for K <= n and are left empty (and flagged) for K > n. Runs
whose n, sampling, grader (name and version), prompts hash, protocol options (prompt limit,
truncation side) or question ids differ from the table's usual ones are flagged in a notes column
(what must match is listed once, in `report.runs.COMPARED`).
Every number comes from `drmas_bench.metrics` (the functions `summarize` uses). The tables as data:
`report.tables`; the paper's rows: `report.paper`. Output: Markdown (`drmas_bench.report.markdown`),
the wide CSV and the long CSV (`report.tables_csv`).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from drmas_bench import compact
from drmas_bench.benchmarks import select_benchmarks
from drmas_bench.figures import Effects, fill, labels_of, lookup, shown_keys
from drmas_bench.metrics import (
    MACRO,
    MICRO,
    Question,
    avg_values,
    bootstrap_mean_ci,
    pass_hat_values,
    pass_values,
    seed_for,
    workflow_effects,
)
from drmas_bench.records import view, views
from drmas_bench.report.compute_matched import matched_line, read_matched
from drmas_bench.report.labels import label, short_value
from drmas_bench.report.paper import PAPER_PROTOCOL, PAPER_STATUS, paper_rows
from drmas_bench.report.runs import (
    COMPARED,
    SAMPLING_KEYS,
    Run,
    expand_run_dirs,
    fmt_num,
    load_run,
    named_apart,
    open_run,
)
from drmas_bench.report.tables import Cell, Metric, Row, Table
from drmas_bench.run_samples import SAMPLES, read_samples, select_records, selection_test
from drmas_bench.workflows.rules import fold_of

logger = logging.getLogger(__name__)


def per_question_values(qs: Sequence[Question], metric: Metric, run_n: int) -> tuple[np.ndarray | None, str, str | None]:
    """The metric's per-question values for one run's questions, the label actually computed, and a
    flag when it differs from what was asked (or None when it cannot be computed: values None)."""
    n_min = min(q.n for q in qs)
    if metric.kind == "avg":
        label = f"avg@{run_n}" if n_min == run_n else f"avg@{n_min}..{run_n}"
        flag = None
        if metric.k is not None and not (metric.k == run_n and n_min == run_n):
            flag = f"{metric.name} asked but n={run_n}" + ("" if n_min == run_n else f" (some questions only {n_min})") + \
                   f": shows avg@n = {label}"
        return avg_values(qs), label, flag
    # pass@: at least one success (metrics.pass_values); pass^: every sample succeeds (metrics.pass_hat_values)
    head, values, rate = ("pass^", pass_hat_values, "all-success") if metric.kind == "pass^" else \
        ("pass@", pass_values, "any-success")
    if metric.k is None:  # pass@n / pass^n over each question's own samples (metrics.pass_at_n, pass_hat_n)
        n_max = max(q.n for q in qs)
        flag = None
        if n_min != n_max or n_min != run_n:
            flag = (f"uneven samples per question ({n_min}..{n_max}, n={run_n}): {head}n = {rate} rate "
                    "over the samples present")
        label = f"{head}{run_n}" if flag is None else f"{head}{n_min}..{n_max}"
        return values(qs), label, flag
    k = metric.k
    if k > n_min:
        return None, metric.name, f"{metric.name} needs at least {k} samples per question; run has n={n_min}"
    return values(qs, k), f"{head}{k}", None


def suite_order(suite: str) -> list[str]:
    """The suite's benchmarks in registry order ([] for a suite the registry does not know)."""
    try:
        return [b.name for b in select_benchmarks(suite, None)]
    except Exception:  # an unknown suite: keep the runs' own order
        return []


def effect_label(records: list[Any], workflow: str) -> str:
    """What the team's other agents did to the score, in one phrase for a leaderboard cell: the phrase
    its workflow declares over its effects block (`effect_phrase`); "–" for a workflow without one."""
    declared = workflow_effects(workflow)
    if declared is None:
        return "–"
    return effect_phrase(declared, declared.fn(views(records)))


def effect_phrase(declared: Effects, e: dict[str, Any]) -> str:
    """A workflow's effects block ``e`` in the one phrase its declaration gives (`figures.Effects.phrase`:
    ``{key}`` is the figure's `labels.short_value`); with no phrase declared, its first three figures
    (or keys), each labelled."""
    words = labels_of(declared.figures)
    write = lambda k, x: short_value(k, x, words)  # noqa: E731
    if declared.phrase:
        return fill(declared.phrase, e, write)
    keys = [k for k in shown_keys([e], words) if k != "episodes"][:3]
    return "; ".join(f"{label(k, words)} {write(k, lookup(e, k)[1])}" for k in keys) or "–"


class BoardFold:
    """What a leaderboard reads of a run's records, one record at a time: per question (n, correct,
    repeated sample indices), the workflow's effects (its phrase, `effect_phrase`), the grading
    timeouts and the calls' tokens. Nothing is kept per sample."""

    def __init__(self, workflow: str) -> None:
        self.acc: dict[tuple[str, str], list[Any]] = {}
        self.timeouts = self.tokens = 0
        self.usage_unknown = False
        self.declared = workflow_effects(workflow)
        self.effects = fold_of(self.declared[1]) if self.declared is not None else None

    def add(self, record: Any) -> None:
        r = view(record)
        slot = self.acc.setdefault((r.benchmark, r.task_id), [0, 0, r.question, set(), 0])
        slot[0] += 1
        slot[1] += r.correct
        if r.sample_idx in slot[3]:
            slot[4] += 1
        slot[3].add(r.sample_idx)
        self.timeouts += r.grade == "timeout"
        for t in r.turns:
            self.usage_unknown |= not t.call.usage_known
            self.tokens += t.call.prompt_tokens + t.call.completion_tokens
        if self.effects is not None:
            self.effects.add(r)

    def result(self) -> Digest:
        qs = {k: Question(k[0], k[1], v[0], v[1], v[2], v[4]) for k, v in sorted(self.acc.items())}
        block = self.effects.result() if self.declared is not None and self.effects is not None else None
        effect = "–" if self.declared is None or block is None else effect_phrase(self.declared, block)
        tokens = None if self.usage_unknown or not qs else self.tokens / len(qs)
        return Digest(qs, effect, self.timeouts, tokens, block)


@dataclass
class Digest:
    """A run as a leaderboard reads it (`BoardFold`): its questions (`metrics.questions`), its effect
    phrase, its grading timeouts, its prompt + completion tokens per question (None when a call's
    usage is unknown), its workflow's effects block (`compare` and `sweep` show it)."""

    questions: dict[tuple[str, str], Question]
    effect: str
    timeouts: int
    tokens_per_question: float | None = None
    effects: dict[str, Any] | None = None  # its workflow's effects block over the run (None: it declares none)


def digest(run: Run) -> Digest:
    """`BoardFold` over the run's records: those it holds, else RUN/records.compact.jsonl read a line
    at a time (`compact.stream_views`; when that file is not in step, its records read whole). Kept
    on the run (its ``__dict__``), so a run is read once whatever asks."""
    kept = run.__dict__.get("_board_digest")
    if isinstance(kept, Digest):
        return kept
    fold = BoardFold(run.workflow)
    records: Iterable[Any] | None = run.views
    if not run.views:
        records = compact.stream_views(run.path, selection_test(run.config))
        if records is None:
            records = select_records(read_samples(run.path / SAMPLES, missing_ok=True), run.config)
    for r in records or ():
        fold.add(r)
    run.__dict__["_board_digest"] = out = fold.result()
    return out


def run_row(run: Run, metric: Metric, ci: bool, n_boot: int, seed: int, dig: Digest | None = None) -> Row:
    """One leaderboard row for a run: per-benchmark, micro and macro values of `metric` (``dig``: the
    run's `digest`, read here when not given)."""
    dig = dig if dig is not None else digest(run)
    qs = dig.questions
    by_bench: dict[str, list[Question]] = defaultdict(list)
    for q in qs.values():
        by_bench[q.benchmark].append(q)
    single = len(run.agents) == 1  # a single-agent baseline (math_single, search_single): marked beside the teams
    row = Row(label=run.name, source="reproduced", model=run.model_label,
              team=f"single-agent ({run.workflow})" if single else run.team_label,
              estimator=run.estimator or "–", step="–" if run.step is None else str(run.step), n=str(run.n),
              sampling=run.sampling_label, path=str(run.path), effect=dig.effect)
    flags: list[str] = []
    values: dict[str, np.ndarray] = {}
    for b in sorted(by_bench, key=lambda b: (run.benchmarks.index(b) if b in run.benchmarks else 99, b)):
        vals, _label, flag = per_question_values(by_bench[b], metric, run.n)
        if flag and flag not in flags:
            flags.append(flag)
        if vals is None:
            row.cells[b] = Cell(None)
            continue
        values[b] = vals
        cell = Cell(float(vals.mean()))
        if ci:
            cell.ci = bootstrap_mean_ci([vals], n_boot, seed_for(metric.name, seed))
        row.cells[b] = cell
    if values and len(values) == len(by_bench):
        pooled = np.concatenate(list(values.values()))
        micro = Cell(float(pooled.mean()))
        macro = Cell(float(np.mean([v.mean() for v in values.values()])))
        if ci:
            micro.ci = bootstrap_mean_ci([pooled], n_boot, seed_for(metric.name, seed))
            macro.ci = bootstrap_mean_ci(list(values.values()), n_boot, seed_for(metric.name, seed))
        row.cells[MICRO], row.cells[MACRO] = micro, macro
    else:
        row.cells[MICRO] = row.cells[MACRO] = Cell(None)
    missing = [b for b in run.benchmarks if b not in by_bench]
    if missing:
        flags.append(f"no samples for {', '.join(missing)}")
    incomplete = sum(1 for q in qs.values() if q.n < run.n)
    if incomplete:
        flags.append(f"{incomplete} questions have fewer than n={run.n} samples (run unfinished?)")
    if dig.timeouts:
        flags.append(f"{dig.timeouts} grading timeouts (graded wrong)")
    row.notes = flags
    return row


def open_runs(paths: Iterable[str | Path]) -> list[Run]:
    """The run directories of ``paths`` (`runs.expand_run_dirs`) as `leaderboard` reads them: each opened
    without its records (`runs.open_run`) and read once into its `digest`, a compact line at a time.
    As `runs.load_runs`: a run without finished samples is skipped with a warning, none left is a
    UserError, runs with the same folder name get distinct names."""
    out: list[Run] = []
    dirs = expand_run_dirs(paths)
    for p in dirs:
        run = open_run(p)
        qs = digest(run).questions
        if not qs:
            logger.warning(f"warning: skipping {p}: the run has no finished samples yet")
            continue
        if not run.n:  # a configuration without n: the records' (as `runs.load_run` reads it)
            run = load_run(p, compact=True)
        run.benchmarks = run.benchmarks or sorted({b for b, _ in qs})
        out.append(run)
    return named_apart(out, len(dirs))


def matched_row(run: Run, base: Row) -> Row | None:
    """The compute-matched row of a single-agent run (`report.compute_matched`: majority vote over
    groups of k samples, k = the team's tokens / the single agent's), under the run's own row; None
    when the run dir holds no ``compute_matched.json``."""

    doc = read_matched(run.path)
    if not doc or not doc.get("per_question"):
        return None
    by_bench: dict[str, list[float]] = defaultdict(list)
    for key, v in doc["per_question"].items():
        by_bench[key.split("/", 1)[0]].append(float(v))
    row = Row(label=f"{run.name} [maj@{doc['k']}, compute-matched]", source="reproduced", model=base.model,
              team=base.team, n=f"{doc['team_n']}x{doc['k']}", sampling=base.sampling, path=base.path,
              notes=[matched_line(doc)])
    for b, vals in by_bench.items():
        row.cells[b] = Cell(float(np.mean(vals)))
    pooled = [v for vals in by_bench.values() for v in vals]
    row.cells[MICRO] = Cell(float(np.mean(pooled)))
    row.cells[MACRO] = Cell(float(np.mean([np.mean(v) for v in by_bench.values()])))
    return row


def _flag_settings(rows_runs: list[tuple[Row, Run]], digests: dict[int, Digest]) -> None:
    """Add notes to rows whose n or sampling differ from the table's setting: the most common one
    among its runs (a tie goes to the earliest run)."""
    if len(rows_runs) < 2:
        return
    ns = Counter(run.n for _, run in rows_runs)
    sig = Counter(run.sampling_signature for _, run in rows_runs)
    usual_n = max(ns, key=lambda v: (ns[v], -[r.n for _, r in rows_runs].index(v)))
    sigs = [r.sampling_signature for _, r in rows_runs]
    usual_sig = max(sig, key=lambda v: (sig[v], -sigs.index(v)))
    for row, run in rows_runs:
        if run.n != usual_n:
            row.notes.insert(0, f"n={run.n} differs (table: n={usual_n})")
        if run.sampling_signature != usual_sig:
            diffs = []
            for i, key in enumerate(SAMPLING_KEYS):
                mine = sorted({s[i] for s in run.sampling_signature}, key=str)
                usual = sorted({s[i] for s in usual_sig}, key=str)
                if mine != usual:
                    diffs.append(f"{key} {'/'.join(map(fmt_num, mine))} (table: {'/'.join(map(fmt_num, usual))})")
            row.notes.insert(0, "sampling differs: " + ", ".join(diffs))
    for name in ("grader", "prompts", "protocol"):  # the other settings of report.runs.COMPARED
        vals = [COMPARED[name](run) for _, run in rows_runs]
        counts = Counter(vals)
        usual = max(counts, key=lambda v: (counts[v], -vals.index(v)))
        for (row, _), v in zip(rows_runs, vals):
            if v != usual:
                row.notes.append(f"{name} {v} differs (table: {usual})")
    keys = [frozenset(digests[id(run)].questions) for _, run in rows_runs]
    kc = Counter(keys)
    usual_keys = max(kc, key=lambda v: (kc[v], -keys.index(v)))
    for (row, _), own in zip(rows_runs, keys):  # question ids, on the benchmarks a row shares with the usual set
        shared = {b for b, _ in own} & {b for b, _ in usual_keys}
        a, b = {q for q in own if q[0] in shared}, {q for q in usual_keys if q[0] in shared}
        if a != b:
            row.notes.append(f"question set differs ({len(a & b)} of the table's {len(b)} questions on "
                             f"{', '.join(sorted(shared))}; {len(a - b)} others)")


def build_leaderboard(runs: Sequence[Run], metrics: Sequence[Metric], ci: bool = False,
                      paper: dict[str, Any] | None = None, n_boot: int = 1000, seed: int = 0) -> list[Table]:
    """One Table per (suite, metric), suites in order of first appearance, runs in the given order,
    the paper's reported rows (when `paper` is given) last."""
    suites: dict[str, list[Run]] = {}
    for r in runs:
        suites.setdefault(r.suite, []).append(r)
    digests = {id(r): digest(r) for r in runs}  # each run's records read once
    tables = []
    for suite, srs in suites.items():
        order = suite_order(suite)
        seen = {b for r in srs for b in r.benchmarks} | {b for r in srs for b, _ in digests[id(r)].questions}
        cols = [b for b in order if b in seen] + sorted(seen - set(order))
        for metric in metrics:
            rows_runs = [(run_row(r, metric, ci, n_boot, seed, digests[id(r)]), r) for r in srs]
            _flag_settings(rows_runs, digests)
            for row, r in rows_runs:
                if len(srs) > 1 and [b for b in cols if b in r.benchmarks] != cols:
                    row.notes.append(f"covers {len(r.benchmarks)} of {len(cols)} benchmarks: micro/macro over its own")
            rows = []
            for row, r in rows_runs:
                rows.append(row)
                rows += [m for m in [matched_row(r, row)] if m is not None]
            reported = [r for r in (paper_rows(paper, suite, metric) if paper else [])
                        if any(c in cols or c == MACRO for c in r.cells)]  # a number to show here
            p = {**PAPER_PROTOCOL, **((paper or {}).get("protocol") or {})}
            if reported:
                for row, r in rows_runs:
                    diff = [f"n={r.n}"] if r.n != p["n"] else []
                    for key in ("temperature", "top_p"):
                        mine = sorted({s.get(key) for s in r.sampling.values()}, key=str)
                        if mine != [p[key]]:
                            diff.append(f"{key} {'/'.join(map(fmt_num, mine))}")
                    if diff:
                        row.notes.append(f"not the paper's protocol ({', '.join(diff)})")
            rows += reported
            caption = (f"{suite} suite, {metric.name}; values in %, {MICRO} = every question weighted equally, "
                       f"{MACRO} = unweighted mean over the row's benchmarks"
                       + ("; notes flag runs whose n, sampling, grader, prompts, protocol options or question set "
                          "differ from the table's setting (the most common among its runs, ties: the first run)"
                          if len(srs) > 1 else "")
                       + (f"; [lo, hi] = 95% bootstrap CI over questions ({n_boot} resamples, seed {seed})" if ci else "")
                       + (f". Rows marked [paper] are {PAPER_STATUS}; the paper's protocol: n={p['n']}, "
                          f"temperature {p['temperature']}, top_p {p['top_p']}" if reported else ""))
            tables.append(Table(suite=suite, metric=metric.name, columns=cols + [MICRO, MACRO], rows=rows, caption=caption))
    return tables
