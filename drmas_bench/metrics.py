"""Metrics over recorded trajectories (REFERENCE.md §3), the one place they are computed: avg@k,
unbiased pass@k and pass^k, bootstrap CIs, macro and micro pooling, per-agent tokens, latency and dollars.
`summarize` (run summaries) and `drmas_bench.report` (leaderboards, comparisons, cost studies) both
call the functions below; nothing here formats text (Markdown lives in `drmas_bench.report.markdown`).

- `pass_at_k(n, c, k)`: the unbiased estimator of Chen et al. (2021),
  `1 - prod_{i=n-c+1..n} (1 - k/i)`; at k = n it is the any-success indicator.
- `pass_at_n(n, c)`: pass@n at a question's own sample count, the any-success indicator (the
  reference's pass@n); with uneven counts (a partial run) each question uses the samples it has,
  and the summary flags it, rather than falling to pass@min(n).
- `pass_hat_k(n, c, k)`: pass^k, the chance that all k of k samples (drawn without replacement
  from n, c of them correct) succeed, `C(c, k) / C(n, k)`, unbiased like pass@k; 0 when c < k. It
  reads reliability (does the team solve it every time) where pass@k reads coverage (at least once).
  `pass_hat_n(n, c)`: its k = n form, the all-success indicator (c == n).
- `avg_at_k(n, c)`: the mean success rate c/n (unbiased for avg@k at every k <= n).
- `questions(records)`: per-question success counts (`Question`: benchmark, id, n, c, text,
  duplicates), sorted by (benchmark, task id) whatever the records' order.
- `avg_values(qs)`, `pass_values(qs, k=None)`, `pass_hat_values(qs, k=None)`: the per-question
  values whose mean is avg@n / pass@k / pass^k (k None: pass@n / pass^n at each question's own n).
- `bootstrap_means(columns, n_boot, seed, level=0.95, strata=None)`: seeded percentile bootstrap
  CIs of column means, resampled jointly (paired); with `strata`, the macro mean of stratum means.
  `bootstrap_ci(values)` and `bootstrap_mean_ci(strata)` are its one-column forms.
- `seed_for(name, seed)`: the bootstrap seed of one named population (benchmark, metric, ...).
- a call's dollars are `pricing.call_cost` / `pricing.turn_cost` (their one home); None when the
  call's usage is unknown (`usage_known`: the server sent none and no tokenizer could count it).
- `usage_counts(turns)`: how many calls had server / counted / unknown usage and how many were
  flagged (`Completion.notes`): the one definition summaries and cost tables share.
- `compliance(records, workflow=None)`: how each agent kept the protocol (valid rate, each reason a
  response failed its format check, cut-off and blank responses, the environment's reading of each
  action, verdicts) and per-episode searches, empty steps and answer-tag rate: why a run scored what
  it scored. `invalid_reasons(rule, text)` is its per-response test.
- `effects(records, workflow=None)`: what each agent contributes: per agent latency p50/p95, tokens
  and dollars per call and per question; and the block of the workflow's own effects, which its
  module declares (`WorkflowSpec.effects`).
- `summarize(records, prices=None, ks=None, n_boot=1000, seed=0, workflow=None)`: the summary dict
  described in `summarize`'s docstring (rendered by `drmas_bench.report.markdown.format_summary_markdown`),
  read in one pass by a `summary_stream.SummaryStream` (it keeps numbers, not records: a run of any
  size is summarized from an iterator of its records); `summary_of(stream)` is the summary of what
  a stream has read. `compliance` and `effects` read their records through the same stream.
"""

from __future__ import annotations

import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from drmas_bench.pricing import PriceSheet
from drmas_bench.records import USAGE_SOURCES, TurnView, view, views
from drmas_bench.summary_stream import QA_KEYS as QA_KEYS  # re-exported: defined beside the stream that reads them
from drmas_bench.summary_stream import Reader, SummaryStream
from drmas_bench.summary_stream import role_rules as role_rules
from drmas_bench.summary_stream import workflow_effects as workflow_effects
from drmas_bench.workflows import registered_workflows
from drmas_bench.workflows.rules import Rule, as_rule

MICRO = "all (micro)"
MACRO = "mean of benchmarks (macro)"


# -------------------------------------------------------------------------------- estimators


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples (drawn without replacement from n, c of them
    correct) is correct: `1 - C(n-c, k) / C(n, k)`, computed as a stable product."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_n(n: int, c: int) -> float:
    """pass@k at k = n for a question with n samples, c correct: 1.0 when any succeeded, else 0.0.

    With uneven counts across questions this is the any-success rate over the samples present,
    as the reference reports it (flagged `n_varies` in a summary)."""
    if not (0 <= c <= n) or n < 1:
        raise ValueError(f"pass_at_n needs 0 <= c <= n and n >= 1, got n={n}, c={c}")
    return 1.0 if c > 0 else 0.0


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Probability that all k samples (drawn without replacement from n, c of them correct) are
    correct: `C(c, k) / C(n, k)`, computed as the product of (c - i) / (n - i) for i < k; 0 when c < k."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_hat_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if c < k:
        return 0.0
    i = np.arange(k)
    return float(np.prod((c - i) / (n - i)))


def pass_hat_n(n: int, c: int) -> float:
    """pass^k at k = n for a question with n samples, c correct: 1.0 when every sample succeeded.

    With uneven counts across questions this is the all-success rate over the samples present
    (the twin of `pass_at_n`, flagged `n_varies` in a summary)."""
    if not (0 <= c <= n) or n < 1:
        raise ValueError(f"pass_hat_n needs 0 <= c <= n and n >= 1, got n={n}, c={c}")
    return 1.0 if c == n else 0.0


def avg_at_k(n: int, c: int, k: int | None = None) -> float:
    """Mean success rate over k samples, estimated from n samples with c correct: c / n."""
    if not (0 <= c <= n) or n < 1 or (k is not None and not 1 <= k <= n):
        raise ValueError(f"avg_at_k needs 0 <= c <= n, n >= 1 and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return c / n


def default_ks(n: int) -> list[int]:
    """1, 2, 4, 8, ... up to n, plus n itself."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if n >= 1 and ks[-1] != n:
        ks.append(n)
    return ks


def bootstrap_ci(values: Sequence[float] | np.ndarray, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values` (resampling the values with replacement)."""
    return bootstrap_means([np.asarray(values, dtype=float)], n_boot, seed, level)[0]


def bootstrap_mean_ci(strata: Sequence[Sequence[float] | np.ndarray], n_boot: int = 1000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the unweighted mean of stratum means (one stratum: a plain mean),
    resampling each stratum's values with replacement (`bootstrap_means` with strata)."""
    arrays = [np.asarray(s, dtype=float) for s in strata if len(s)]
    if not arrays:
        return float("nan"), float("nan")
    bounds = np.cumsum([0] + [len(a) for a in arrays])
    index = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(arrays))]
    return bootstrap_means([np.concatenate(arrays)], n_boot, seed, level, strata=index)[0]


def bootstrap_means(columns: list[np.ndarray], n_boot: int, seed: int, level: float = 0.95,
                    strata: list[np.ndarray] | None = None) -> list[tuple[float, float]]:
    """CIs of the means of several same-length columns, resampled jointly (paired); seeded, chunked
    to bound memory.

    With `strata` (index arrays), rows are resampled within each stratum and the statistic is the
    unweighted mean of the stratum means (the macro average)."""
    m = len(columns[0])
    if m == 0:
        return [(float("nan"), float("nan"))] * len(columns)
    rng = np.random.default_rng(seed)
    groups = strata if strata is not None else [np.arange(m)]
    stats = np.empty((len(columns), n_boot))
    block = max(1, 2_000_000 // m)
    for start in range(0, n_boot, block):
        b = min(block, n_boot - start)
        per_group = []
        for g in groups:
            pick = g[rng.integers(0, len(g), size=(b, len(g)))]
            per_group.append([col[pick].mean(axis=1) for col in columns])
        for j in range(len(columns)):
            stats[j, start:start + b] = np.mean([pg[j] for pg in per_group], axis=0)
    alpha = (1 - level) / 2
    return [(float(np.quantile(s, alpha)), float(np.quantile(s, 1 - alpha))) for s in stats]


def seed_for(name: str, seed: int) -> int:
    """The bootstrap seed of one named population (a benchmark, MICRO, a metric name, ...)."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**32)


# ---------------------------------------------------------------------------------- grouping


@dataclass(frozen=True)
class Question:
    """Per-question success counts: c successes among n samples (duplicates: repeated sample_idx)."""

    benchmark: str
    id: str
    n: int
    c: int
    text: str = ""
    duplicates: int = 0


def questions(records: Iterable[Any]) -> dict[tuple[str, str], Question]:
    """(benchmark, task id) -> Question, from trajectory records (stored dicts or `records.RecordView`);
    sorted by (benchmark, task id), so what is computed from them (bootstrap CIs included) does not
    depend on the order of the records."""
    acc: dict[tuple[str, str], list] = {}
    for r in map(view, records):
        key = (r.benchmark, r.task_id)
        slot = acc.setdefault(key, [0, 0, r.question, set(), 0])
        slot[0] += 1
        slot[1] += r.correct
        idx = r.sample_idx
        if idx in slot[3]:
            slot[4] += 1
        slot[3].add(idx)
    return {k: Question(k[0], k[1], v[0], v[1], v[2], v[4]) for k, v in sorted(acc.items())}


def avg_values(qs: Sequence[Question]) -> np.ndarray:
    """Each question's success rate c / n (their mean is avg@n)."""
    return np.array([avg_at_k(q.n, q.c) for q in qs], dtype=float)


def pass_values(qs: Sequence[Question], k: int | None = None) -> np.ndarray:
    """Each question's pass@k (unbiased estimator); k None: pass@n at the question's own n."""
    if k is None:
        return np.array([pass_at_n(q.n, q.c) for q in qs], dtype=float)
    return np.array([pass_at_k(q.n, q.c, k) for q in qs], dtype=float)


def pass_hat_values(qs: Sequence[Question], k: int | None = None) -> np.ndarray:
    """Each question's pass^k (unbiased estimator); k None: pass^n at the question's own n."""
    if k is None:
        return np.array([pass_hat_n(q.n, q.c) for q in qs], dtype=float)
    return np.array([pass_hat_k(q.n, q.c, k) for q in qs], dtype=float)


def usage_known(turn: Any) -> bool:
    """Whether a recorded call's token counts mean something (records from before the field: yes)."""
    return TurnView.of(turn).call.usage_known


def usage_counts(turns: Iterable[Any]) -> dict[str, int]:
    """{calls, server, counted, unknown, flagged} over recorded calls (`records.TurnView`, or stored
    turn dicts): where their token counts come from (`Completion.usage`) and how many carry an engine
    note (a reply cut, a count over the limit)."""
    out = {"calls": 0, **{k: 0 for k in USAGE_SOURCES}, "flagged": 0}
    for t in map(TurnView.of, turns):
        out["calls"] += 1
        src = t.call.usage
        out[src if src in USAGE_SOURCES else "unknown"] += 1
        out["flagged"] += bool(t.call.notes)
    return out


def sum_usd(costs: Iterable[float | None]) -> float | None:
    """The sum of per-call dollars, None (unknown) when any of them is unknown."""
    total = 0.0
    for c in costs:
        if c is None:
            return None
        total += c
    return total


def _block(qs: list[Question], stream: SummaryStream, order: np.ndarray, benchmark: str | None, ks: list[int] | None,
           n_boot: int, seed: int) -> dict[str, Any]:
    """Every per-population number (one benchmark, or all questions pooled: ``benchmark`` None)."""
    ns = Counter(q.n for q in qs)
    n_mode = ns.most_common(1)[0][0]
    n_min = min(ns)
    wanted = ks if ks is not None else default_ks(n_min)
    use_ks = sorted({k for k in wanted if 1 <= k <= n_min})
    avg = avg_values(qs)
    pass_cols = {k: pass_values(qs, k) for k in use_ks}
    top = pass_values(qs)  # each question's own n (flagged when uneven)
    hat_cols = {k: pass_hat_values(qs, k) for k in use_ks}
    hat_top = pass_hat_values(qs)
    # one paired bootstrap: the resamples depend on the question count only, so the pass^ columns
    # leave avg@n's and pass@n's CIs as they are without them
    (avg_lo, avg_hi), (pass_lo, pass_hi), hat_top_ci, *hat_cis = bootstrap_means(
        [avg, top, hat_top, *hat_cols.values()], n_boot, seed)
    uneven = [q.id for q in qs if q.n != n_mode]
    return {
        "questions": len(qs),
        "samples": sum(q.n for q in qs),
        "n": n_min,
        "n_min": n_min,
        "n_max": max(ns),
        "n_varies": len(ns) > 1,
        "questions_with_other_n": len(uneven),
        "questions_with_other_n_ids": [f"{q.benchmark}/{q.id}" for q in qs if q.n != n_mode][:20],
        "duplicate_samples": sum(q.duplicates for q in qs),
        "avg@n": float(avg.mean()),
        "pass@k": {str(k): float(v.mean()) for k, v in pass_cols.items()},
        "pass@n": float(top.mean()),
        "pass^k": {str(k): float(v.mean()) for k, v in hat_cols.items()},
        "pass^n": float(hat_top.mean()),
        "ci95": {"avg@n": [avg_lo, avg_hi], "pass@n": [pass_lo, pass_hi], "pass^n": list(hat_top_ci),
                 "pass^k": {str(k): list(ci) for k, ci in zip(hat_cols, hat_cis)}},
        "ks_skipped": sorted({k for k in wanted if k > n_min}),
        **stream.sample_figures(order, benchmark, len(qs)),
    }


def grading_timeouts(records: Iterable[Any]) -> int:
    """Samples whose grading hit its CPU limit twice (`GradeResult.status == "timeout"`, the grade
    recorded as `extra.grade`): graded wrong, so a non-zero count is shown beside the scores."""
    return sum(1 for r in map(view, records) if r.grade == "timeout")


def _macro(blocks: dict[str, dict[str, Any]], qs_by_bench: dict[str, list[Question]], n_boot: int, seed: int) -> dict[str, Any]:
    """Unweighted means over benchmarks; CIs by resampling questions within each benchmark."""
    names = list(blocks)
    common_ks = set.intersection(*(set(blocks[b]["pass@k"]) for b in names))
    out: dict[str, Any] = {
        "benchmarks": len(names),
        "questions": sum(blocks[b]["questions"] for b in names),
        "avg@n": float(np.mean([blocks[b]["avg@n"] for b in names])),
        "pass@k": {k: float(np.mean([blocks[b]["pass@k"][k] for b in names])) for k in sorted(common_ks, key=int)},
        "pass@n": float(np.mean([blocks[b]["pass@n"] for b in names])),
        "pass^k": {k: float(np.mean([blocks[b]["pass^k"][k] for b in names])) for k in sorted(common_ks, key=int)},
        "pass^n": float(np.mean([blocks[b]["pass^n"] for b in names])),
        "usd_per_question": (None if any(blocks[b]["usd_per_question"] is None for b in names)
                             else float(np.mean([blocks[b]["usd_per_question"] for b in names]))),
        "usage": {k: sum(blocks[b]["usage"][k] for b in names) for k in blocks[names[0]]["usage"]},
    }
    flat = [q for b in names for q in qs_by_bench[b]]
    strata, start = [], 0
    for b in names:
        strata.append(np.arange(start, start + len(qs_by_bench[b])))
        start += len(qs_by_bench[b])
    avg = avg_values(flat)
    top = pass_values(flat)
    hat_ks = list(out["pass^k"])
    (a_lo, a_hi), (p_lo, p_hi), hat_top_ci, *hat_cis = bootstrap_means(
        [avg, top, pass_hat_values(flat), *(pass_hat_values(flat, int(k)) for k in hat_ks)], n_boot, seed, strata=strata)
    out["ci95"] = {"avg@n": [a_lo, a_hi], "pass@n": [p_lo, p_hi], "pass^n": list(hat_top_ci),
                   "pass^k": {k: list(ci) for k, ci in zip(hat_ks, hat_cis)}}
    for key in QA_KEYS:
        if all(key in blocks[b] for b in names):
            out[key] = float(np.mean([blocks[b][key] for b in names]))
    return out


def summarize(records: Iterable[Any], prices: PriceSheet | None = None, ks: Sequence[int] | None = None,
              n_boot: int = 1000, seed: int = 0, workflow: str | None = None, also: Sequence[Reader] = ()) -> dict[str, Any]:
    """Summary of trajectory records (dicts from `Trajectory.to_dict()`, Trajectory objects or views),
    read once, one at a time (`summary_stream.SummaryStream`: an iterator of a run's records is never
    held whole; with ``workflow`` None the records are read first to infer it).

    prices: a PriceSheet to price every call by its turn's `wg`; None sums the recorded `cost_usd`.
    ks: the k of pass@k (default 1, 2, 4, ... up to n, plus n); k above a population's n is skipped.
    n_boot, seed: bootstrap resamples and seed for the 95% CIs (resampling questions).
    workflow: the workflow that wrote the records, for `compliance` (None: inferred from the agents).
    also: other readers fed every record as it is read (a run's protocol and call-cache sections).

    Returns {"benchmarks": {name: block}, "micro": block, "macro": {...}, "labels": {...},
    "compliance": `compliance` over every record, "effects": `effects` over every record,
    "unpriced_models": [...], "n_boot", "seed"}.
    A block holds: questions, samples, n (samples per question; the smallest when they differ),
    n_min, n_max, n_varies, questions_with_other_n (+ ids), duplicate_samples, avg@n, pass@k {"1": ..} (k <= n_min), pass@n (any success among each
    question's samples: with uneven counts, over the samples present), pass^k {"1": ..} (all k of k
    samples succeed; the same k as pass@k), pass^n (every one of each question's samples succeeded),
    ci95 {avg@n, pass@n, pass^n: [lo, hi], pass^k: {"1": [lo, hi], ..}},
    ks_skipped, latency_s {p50, p95} (trajectory wall_s), agents {name: models, calls,
    calls_per_traj, prompt_tokens_per_call, completion_tokens_per_call (over calls with known usage;
    None when none), usage_unknown_calls, usage_counted_calls, usage_flagged_calls,
    latency_s {p50, p95} (per call), calls_per_question, tokens_per_question (None if some call's
    usage is unknown), usd_per_call and usd_per_question (with a price sheet)},
    usage (`usage_counts`), usd_total, usd_per_question, usd_per_sample (None = unknown: some call
    had no usage), usd_source, and the mean em / f1 / cover_em of
    `extra` when present. "micro" pools every question; "macro" is the unweighted mean over
    benchmarks (CIs from resampling within each benchmark)."""
    if workflow is None:  # inferred from every record's agents: the records are read first
        recs = views(records)
        workflow = workflow or infer_workflow(recs)
        records = recs
    stream = SummaryStream(workflow, prices, also)
    for r in records:
        stream.add(view(r))
    return summary_of(stream, ks, n_boot, seed)


def summary_of(stream: SummaryStream, ks: Sequence[int] | None = None, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """`summarize`'s summary of the records a `SummaryStream` has read (its workflow and prices)."""
    if not len(stream):
        raise ValueError("summarize needs at least one record")
    qs = {k: Question(k[0], k[1], v[0], v[1], v[2], v[4]) for k, v in sorted(stream.questions.items())}
    by_bench: dict[str, list[Question]] = defaultdict(list)
    for q in qs.values():
        by_bench[q.benchmark].append(q)
    order = stream.order()  # the summary must not depend on line order
    ks_list = list(ks) if ks is not None else None
    blocks = {b: _block(by_bench[b], stream, order, b, ks_list, n_boot, seed_for(b, seed)) for b in sorted(by_bench)}
    micro = _block(list(qs.values()), stream, order, None, ks_list, n_boot, seed_for(MICRO, seed))
    prices = stream.prices
    return {
        "benchmarks": blocks,
        "micro": micro,
        "macro": _macro(blocks, {b: by_bench[b] for b in blocks}, n_boot, seed_for(MACRO, seed)),
        "labels": {"micro": MICRO, "macro": MACRO},
        "compliance": stream.compliance(),
        "effects": _effects_of(stream, micro["agents"]),
        "unpriced_models": sorted(prices.unpriced) if prices is not None else [],
        "n_boot": n_boot,
        "seed": seed,
    }


# ------------------------------------------------------------------------------ protocol compliance

def infer_workflow(records: Iterable[Any]) -> str | None:
    """The workflow that wrote `records`, from the agents its turns name (samples record no
    workflow): of the workflows whose agents include every agent named, the one with the fewest agents
    (a team of exactly those agents first: solver + verifier is math_refine, not the 4-agent team that
    also has them), ties by name; None when no turn names an agent or no workflow has them all."""
    agents = {t.agent for r in map(view, records) for t in r.turns}
    if not agents:
        return None
    workflows = registered_workflows()
    fits = [name for name in workflows if agents <= set(workflows[name].agents)]
    return min(fits, key=lambda name: (len(set(workflows[name].agents)), name), default=None)


def invalid_reasons(rule: Rule, text: str) -> list[str]:
    """Every reason `text` fails format rule `rule` (a `FormatRule` or a registered rule's name;
    empty: it passes): the rule's own ``reasons``, the one the workflow's recorded validity comes from."""

    return list(as_rule(rule).reasons(text))


def compliance(records: Iterable[Any], workflow: str | None = None) -> dict[str, Any]:
    """Why a run scored what it scored: how each agent kept the protocol, from the recorded turns.

    workflow: the workflow that wrote the records (None: `infer_workflow`). Per agent (``agents``):

    - rule (the name of the workflow's `WorkflowSpec.rules` entry); calls; valid = turns recorded
      valid (``Turn.valid``, what the run applied); valid_rate = valid / calls;
    - invalid_reasons {reason: turns}: `invalid_reasons` of each response under the agent's rule,
      every failing reason counted (a turn can have several; recomputed from the text with the
      current rules, so an old run is read with today's), in the rule's order; valid_by_rules =
      turns with no reason, valid_by_rules_rate = that / calls (differs from valid_rate only for
      records written under other rules, or by hand; None for an agent without a rule);
    - length_cut = turns whose generation stopped at max_new_tokens (``finish == "length"``);
      empty_responses = turns whose text is blank;
    - the figures the agent's rule reads off its replies (``FormatRule.agent_figures``; e.g. the
      search actors' actions and answer_tag_rate, the verifiers' verdicts).

    Per episode (``episodes``): the number of episodes and the figures the workflow's rules declare
    (``FormatRule.episode_figures``; e.g. search_route's steps and searches per episode, math_refine's
    rounds and approvals).

    ``labels``: {key: words} the workflow's rules declare for their reasons and figures
    (`figures.rule_labels`), so a report of the summary shows each under its own words.

    Turns without a text (hand-made or old records) count as blank responses."""

    recs = views(records)
    stream = SummaryStream(workflow or infer_workflow(recs))
    for r in recs:
        stream.add(r)
    return stream.compliance()


# ------------------------------------------------------------------------------ per-agent effects

# the per-agent figures `effects` shows (computed by `_agents`, the one definition of them)
AGENT_EFFECT_KEYS = ("calls", "calls_per_question", "latency_s", "prompt_tokens_per_call", "completion_tokens_per_call",
                     "tokens_per_question", "usd_per_call", "usd_per_question")


def effects(records: Iterable[Any], workflow: str | None = None,
            agents: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """What each agent contributes, from the recorded turns: {"workflow", "agents": {agent: figures},
    and for a workflow that declares effects (`WorkflowSpec.effects`: its key and a function over
    the records, defined in the workflow's module) that block over every record,
    "benchmarks": {benchmark: {key: the same block over its records}}, "labels": {figure key: words}
    of its declared figures in order (`WorkflowSpec.effect_labels`)}.

    agents: the per-agent figures `summarize` computed (`_agents` over every record; computed here
    when None): calls, calls_per_question, latency_s {p50, p95} of the calls' ``latency_s``, prompt /
    completion tokens per call (calls with known usage), tokens_per_question = (prompt + completion
    tokens) / questions (None when a call's usage is unknown), and with a price sheet usd_per_call,
    usd_per_question. workflow: as in `compliance` (None: `infer_workflow`)."""
    recs = views(records)
    stream = SummaryStream(workflow or infer_workflow(recs))
    for r in recs:
        stream.add(r)
    if agents is None:
        agents = stream.sample_figures(stream.order(), None, len(stream.questions))["agents"]
    return _effects_of(stream, agents)


def _effects_of(stream: SummaryStream, agents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"workflow": stream.workflow,
            "agents": {name: {k: a[k] for k in AGENT_EFFECT_KEYS if k in a} for name, a in agents.items()},
            **stream.effects_blocks()}
