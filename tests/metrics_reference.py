"""A plain reference of the run summary (tests only): the list-of-records implementation of
`drmas_bench.metrics.summarize`, `compliance` and `effects`, and of the suites' figure functions
(search episodes and actions, verifier verdicts, math rounds, the search / math / math_4agent /
toy_fixer effects), each a loop over every record held in a list. `tests/test_metrics_stream.py`
checks the streaming summary against it on generated runs."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from drmas_bench.figures import rule_labels
from drmas_bench.metrics import (
    AGENT_EFFECT_KEYS,
    MACRO,
    MICRO,
    QA_KEYS,
    Question,
    _macro,
    avg_values,
    bootstrap_means,
    default_ks,
    grading_timeouts,
    infer_workflow,
    invalid_reasons,
    pass_hat_values,
    pass_values,
    questions,
    role_rules,
    seed_for,
    sum_usd,
    usage_counts,
)
from drmas_bench.pricing import PriceSheet, turn_cost
from drmas_bench.records import RecordView, TurnView, mean_or_none, rate, views
from drmas_bench.suites.math.math_refine import FLIPS, round1_correct
from drmas_bench.suites.math.refine_loop import ANSWERING
from drmas_bench.suites.search.rules import ACTION_KINDS, action_kind, search_steps
from drmas_bench.suites.search.search_route import SEARCH_EPISODE_KEYS, evidence_at_answer
from drmas_bench.workflows import get_workflow
from drmas_bench.workflows.rules import ordered_reasons
from protocol_roles import P as proto


def _episode_figures(rules: dict, records: list[RecordView]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    seen: list[Any] = []
    for rule in rules.values():
        fn = EPISODE_FIGURES.get(rule.name)
        if fn is not None and fn not in seen:
            seen.append(fn)
            out.update(fn(records))
    return out


def _record_key(r: RecordView) -> tuple:
    """A stable order of trajectory records: (benchmark, task id, sample index), then a few recorded
    numbers for duplicates. Questions, and so the bootstrap's resamples, follow it, so the same
    records give the same summary (CIs included) whatever order samples.jsonl holds them in."""
    return (r.benchmark, r.task_id, -1 if r.sample_idx is None else r.sample_idx, r.correct, r.reward, r.wall_s,
            r.cost_usd)


def _percentiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p95": None}
    a = np.asarray(xs, dtype=float)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95))}




@dataclass
class _AgentCalls:
    """One agent's recorded calls, summed (what `_agents` turns into its figures)."""

    calls: int = 0
    known: int = 0  # calls whose usage is known
    prompt_tokens: int = 0  # over the known calls
    completion_tokens: int = 0
    usd: float | None = 0.0  # None once a priced call's dollars are unknown
    models: set[str] = field(default_factory=set)
    seen: list[TurnView] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)


def _agents(trajs: list[RecordView], prices: PriceSheet | None, n_questions: int) -> dict[str, dict[str, Any]]:
    acc: dict[str, _AgentCalls] = defaultdict(_AgentCalls)
    for r in trajs:
        for turn in r.turns:
            a = acc[turn.agent]
            c = turn.call
            a.calls += 1
            a.seen.append(turn)
            a.latency.append(c.latency_s)
            a.models.add(turn.wg or "")
            if c.usage_known:  # per-call means over the calls whose counts mean something
                a.known += 1
                a.prompt_tokens += c.prompt_tokens
                a.completion_tokens += c.completion_tokens
            if prices is not None:
                usd = turn_cost(turn, prices)
                a.usd = None if usd is None or a.usd is None else a.usd + usd
    out = {}
    for name, a in sorted(acc.items()):
        usage = usage_counts(a.seen)
        out[name] = {
            "models": sorted(a.models),
            "calls": a.calls,
            "calls_per_traj": a.calls / len(trajs) if trajs else 0.0,
            "prompt_tokens_per_call": a.prompt_tokens / a.known if a.known else None,
            "completion_tokens_per_call": a.completion_tokens / a.known if a.known else None,
            "usage_unknown_calls": usage["unknown"],
            "usage_counted_calls": usage["counted"],
            "usage_flagged_calls": usage["flagged"],
            "latency_s": _percentiles(a.latency),
            "calls_per_question": a.calls / n_questions if n_questions else 0.0,
            "tokens_per_question": (None if usage["unknown"] or not n_questions
                                    else (a.prompt_tokens + a.completion_tokens) / n_questions),
        }
        if prices is not None:
            out[name]["usd_per_call"] = None if a.usd is None else a.usd / a.calls
            out[name]["usd_per_question"] = None if a.usd is None else (a.usd / n_questions if n_questions else 0.0)
    return out


def _block(qs: list[Question], trajs: list[RecordView], ks: list[int] | None, prices: PriceSheet | None,
           n_boot: int, seed: int) -> dict[str, Any]:
    """Every per-population number (one benchmark, or all questions pooled)."""
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
    out: dict[str, Any] = {
        "questions": len(qs),
        "samples": len(trajs),
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
        "latency_s": _percentiles([r.wall_s for r in trajs]),
        "agents": _agents(trajs, prices, len(qs)),
    }
    usage = usage_counts(t for r in trajs for t in r.turns)
    out["usage"] = usage
    if prices is not None:
        total = sum_usd(turn_cost(t, prices) for r in trajs for t in r.turns)
        source = "price sheet"
    else:
        total = None if usage["unknown"] else sum(r.cost_usd for r in trajs)
        source = "recorded cost_usd"
    out.update(usd_total=total, usd_per_question=None if total is None else total / len(qs),
               usd_per_sample=None if total is None else total / len(trajs), usd_source=source)
    for key in QA_KEYS:
        vals = [float(r.extra[key]) for r in trajs if key in r.extra]
        if vals:
            out[key] = float(np.mean(vals))
    out["grading_timeouts"] = grading_timeouts(trajs)
    return out




def summarize(records: Iterable[Any], prices: PriceSheet | None = None, ks: Sequence[int] | None = None,
              n_boot: int = 1000, seed: int = 0, workflow: str | None = None) -> dict[str, Any]:
    """Summary of trajectory records (dicts from `Trajectory.to_dict()`, or Trajectory objects).

    prices: a PriceSheet to price every call by its turn's `wg`; None sums the recorded `cost_usd`.
    ks: the k of pass@k (default 1, 2, 4, ... up to n, plus n); k above a population's n is skipped.
    n_boot, seed: bootstrap resamples and seed for the 95% CIs (resampling questions).
    workflow: the workflow that wrote the records, for `compliance` (None: inferred from the agents).

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
    recs = sorted(views(records), key=_record_key)  # the summary must not depend on line order
    if not recs:
        raise ValueError("summarize needs at least one record")
    qs = questions(recs)
    by_bench: dict[str, list[Question]] = defaultdict(list)
    for q in qs.values():
        by_bench[q.benchmark].append(q)
    trajs_by_bench: dict[str, list[RecordView]] = defaultdict(list)
    for r in recs:
        trajs_by_bench[r.benchmark].append(r)
    ks_list = list(ks) if ks is not None else None
    blocks = {b: _block(by_bench[b], trajs_by_bench[b], ks_list, prices, n_boot, seed_for(b, seed)) for b in sorted(by_bench)}
    micro = _block(list(qs.values()), recs, ks_list, prices, n_boot, seed_for(MICRO, seed))
    return {
        "benchmarks": blocks,
        "micro": micro,
        "macro": _macro(blocks, {b: by_bench[b] for b in blocks}, n_boot, seed_for(MACRO, seed)),
        "labels": {"micro": MICRO, "macro": MACRO},
        "compliance": compliance(recs, workflow),
        "effects": effects(recs, workflow, agents=micro["agents"]),
        "unpriced_models": sorted(prices.unpriced) if prices is not None else [],
        "n_boot": n_boot,
        "seed": seed,
    }




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

    Turns without a text (hand-made or old records) count as blank responses."""

    recs = views(records)
    wf = workflow or infer_workflow(recs)
    rules = role_rules(wf)
    acc: dict[str, dict[str, Any]] = {}
    for r in recs:
        for t in r.turns:
            a = acc.setdefault(t.agent, {"calls": 0, "valid": 0, "by_rules": 0, "reasons": Counter(),
                                         "length_cut": 0, "empty_responses": 0, "texts": []})
            a["calls"] += 1
            a["valid"] += t.valid
            a["length_cut"] += t.call.finish == "length"
            a["empty_responses"] += not t.text.strip()
            a["texts"].append(t.text)
            if t.agent in rules:
                why = invalid_reasons(rules[t.agent], t.text)
                a["reasons"].update(why)
                a["by_rules"] += not why
    agents: dict[str, dict[str, Any]] = {}
    for name, a in sorted(acc.items()):
        rule = rules.get(name)
        agents[name] = {
            "rule": rule.name if rule is not None else None, "calls": a["calls"], "valid": a["valid"],
            "valid_rate": a["valid"] / a["calls"] if a["calls"] else None,
            "invalid_reasons": ordered_reasons(rule, a["reasons"]) if rule is not None else {},
            "valid_by_rules": a["by_rules"] if rule is not None else None,
            "valid_by_rules_rate": a["by_rules"] / a["calls"] if rule is not None and a["calls"] else None,
            "length_cut": a["length_cut"], "empty_responses": a["empty_responses"],
            **(AGENT_FIGURES[rule.name](a["texts"]) if rule is not None and rule.name in AGENT_FIGURES else {}),
        }
    return {"workflow": wf, "agents": agents,
            "episodes": {"episodes": len(recs), **_episode_figures(rules, recs)},
            "labels": rule_labels(rules.values())}  # the declaration's words, not a figure: read as declared




def effects(records: Iterable[Any], workflow: str | None = None,
            agents: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """What each agent contributes, from the recorded turns: {"workflow", "agents": {agent: figures},
    and for a workflow that declares effects (`WorkflowSpec.effects`: its key and a function over
    the records, defined in the workflow's module) that block over every record,
    "benchmarks": {benchmark: {key: the same block over its records}}}.

    agents: the per-agent figures `summarize` computed (`_agents` over every record; computed here
    when None): calls, calls_per_question, latency_s {p50, p95} of the calls' ``latency_s``, prompt /
    completion tokens per call (calls with known usage), tokens_per_question = (prompt + completion
    tokens) / questions (None when a call's usage is unknown), and with a price sheet usd_per_call,
    usd_per_question. workflow: as in `compliance` (None: `infer_workflow`)."""
    recs = views(records)
    wf = workflow or infer_workflow(recs)
    if agents is None:
        agents = _agents(recs, None, len(questions(recs)))
    out: dict[str, Any] = {"workflow": wf,
                           "agents": {name: {k: a[k] for k in AGENT_EFFECT_KEYS if k in a} for name, a in agents.items()}}
    declared = EFFECTS.get(wf)
    if declared is not None:
        key, fn = declared
        out[key] = fn(recs)
        by_bench: dict[str, list[RecordView]] = defaultdict(list)
        for r in recs:
            by_bench[r.benchmark].append(r)
        out["benchmarks"] = {b: {key: fn(by_bench[b])} for b in sorted(by_bench)}
        out["labels"] = get_workflow(wf).effect_labels()  # the declaration's words, not a figure
    return out


def search_episode_figures(recs: list[RecordView]) -> dict[str, Any]:
    """The per-episode figures of a search_route run (compliance's ``episodes`` block): env steps,
    searches, empty steps per episode, the share that ended on a tagged answer and its complement,
    and episodes by number of searches."""
    steps, searches, empty, answered = [], [], [], []
    for r in recs:
        kinds = search_steps(r)
        steps.append(len(r.env_steps) if r.env_steps is not None else len(r.agent_turns("verifier")))
        searches.append(kinds.count("search"))
        empty.append(kinds.count("empty"))
        answered.append(float(r.final_answer is not None))
    answer_rate = mean_or_none(answered)
    return {"steps_per_episode": mean_or_none(steps), "searches_per_episode": mean_or_none(searches),
            "empty_steps_per_episode": mean_or_none(empty), "answer_tag_rate": answer_rate,
            "no_answer_rate": None if answer_rate is None else 1.0 - answer_rate,
            "searches_distribution": {str(k): v for k, v in sorted(Counter(searches).items())}}


def actor_figures(role: str) -> Any:
    """The per-agent figures of a searcher's / answerer's replies: the env action each would be
    (``actions``: search / answer / empty) and the share that ended the episode on a tagged answer."""

    def figures(texts: list[str]) -> dict[str, Any]:
        kinds = Counter(action_kind(role, t) for t in texts)
        return {"actions": {k: kinds[k] for k in ACTION_KINDS},
                "answer_tag_rate": kinds["answer"] / len(texts) if texts else None}

    return figures


def search_verifier_figures(texts: list[str]) -> dict[str, Any]:
    """The search verifier's verdicts over its replies (answer / search)."""
    return {"verdicts": dict(sorted(Counter(proto.search_verdict(t) for t in texts).items()))}




def rounds_figures(recs: list[RecordView]) -> dict[str, Any]:
    """math_refine's per-episode figures: solver rounds per episode and the share of verifier turns
    that approved."""
    rounds = [len(r.agent_turns("solver")) for r in recs]
    verdicts = [proto.math_verdict(t.text) for r in recs for t in r.agent_turns("verifier")]
    return {"rounds_per_episode": mean_or_none(rounds),
            "approve_rate": verdicts.count("approve") / len(verdicts) if verdicts else None}




def math_verifier_figures(texts: list[str]) -> dict[str, Any]:
    """The math verifier's verdicts over its replies."""
    return {"verdicts": dict(sorted(Counter(proto.math_verdict(t) for t in texts).items()))}




def search_effects(records: Iterable[Any]) -> dict[str, Any]:
    """What retrieval gave a search_route run's answerer, over E episodes (`evidence_at_answer`):

    - env_recorded = episodes with the env's record (older runs have none: evidence figures None);
    - answerer_episodes = of those, episodes where the answerer acted; evidence_recall = share of
      them with a gold answer in the passages retrieved before its last call;
    - accuracy_with_evidence / accuracy_without_evidence = mean correctness (EM) of the answerer
      episodes with / without that evidence (with_evidence / without_evidence: their counts);
    - evidence_retrieved_rate = share of env_recorded episodes whose retrieved passages (all steps)
      contain a gold answer: what the searcher found, whether or not the answerer used it;
    - steps_per_episode, searches_per_episode, searches_distribution, no_answer_rate: `compliance`'s
      per-episode figures (the same definitions)."""
    recs = views(records)
    at_answer: list[tuple[bool, bool]] = []  # (evidence present, correct)
    anywhere: list[bool] = []
    for r in recs:
        ev, ev_any = evidence_at_answer(r)
        if ev_any is None:
            continue
        anywhere.append(ev_any)
        if ev is not None:
            at_answer.append((ev, r.correct))
    with_ev = [ok for ev, ok in at_answer if ev]
    without = [ok for ev, ok in at_answer if not ev]
    ep = search_episode_figures(recs)
    return {
        "episodes": len(recs), "env_recorded": len(anywhere), "answerer_episodes": len(at_answer),
        "evidence_recall": rate(len(with_ev), len(at_answer)),
        "with_evidence": len(with_ev), "without_evidence": len(without),
        "accuracy_with_evidence": rate(sum(with_ev), len(with_ev)),
        "accuracy_without_evidence": rate(sum(without), len(without)),
        "evidence_retrieved_rate": rate(sum(anywhere), len(anywhere)),
        **{k: ep[k] for k in SEARCH_EPISODE_KEYS},
    }





def math_effects(records: Iterable[Any]) -> dict[str, Any]:
    """The verifier's effect in a math_refine run (solver -> verifier -> solver ...), over E episodes.

    - round2_ran = episodes with more than one solver turn; round2_rate = round2_ran / E;
    - flips {wrong_to_right, right_to_wrong, wrong_to_wrong, right_to_right}: over the round2_ran
      episodes whose round-1 grade is known, (round-1 answer graded correct?) -> (final answer graded
      correct?); round1_ungraded = round2_ran episodes without a recorded round-1 grade (older runs);
    - the verifier as a judge of the round-1 answer (its first verdict, `protocol.math_verdict`;
      anything but a reject approves), over the `judged` episodes with a verdict and a known round-1
      grade: approve_rate_on_right = P(approve | right), approve_rate_on_wrong = P(approve | wrong),
      judge_precision = P(right | approve), judge_recall = approve_rate_on_right, judge_accuracy =
      (right approved + wrong rejected) / judged;
    - graded_episodes = episodes with a known round-1 grade; over them round1_accuracy = mean
      round-1 correctness, final_accuracy = mean final correctness, accuracy_change = final - round 1
      (= (wrong_to_right - right_to_wrong) / graded_episodes).

    right / wrong = graded correct or not by the run's grader. Rates are None when their
    denominator is 0."""
    recs = views(records)
    flips: Counter = Counter()
    ran = ungraded = 0
    graded: list[tuple[bool, bool]] = []
    judged: list[tuple[bool, bool]] = []  # (round-1 right, approved)
    for r in recs:
        r1, final = round1_correct(r), r.correct
        if r1 is not None:
            graded.append((r1, final))
        if len(r.agent_turns("solver")) > 1:
            ran += 1
            if r1 is None:
                ungraded += 1
            else:
                flips[f"{'right' if r1 else 'wrong'}_to_{'right' if final else 'wrong'}"] += 1
        verdicts = [proto.math_verdict(t.text) for t in r.agent_turns("verifier")]
        if verdicts and r1 is not None:
            judged.append((r1, verdicts[0] == "approve"))
    right = [ok for r1, ok in judged if r1]
    wrong = [ok for r1, ok in judged if not r1]
    approved = [r1 for r1, ok in judged if ok]
    r1_acc = mean_or_none([float(a) for a, _ in graded])
    fin_acc = mean_or_none([float(b) for _, b in graded])
    return {
        "episodes": len(recs), "round2_ran": ran, "round2_rate": rate(ran, len(recs)),
        "flips": {k: flips[k] for k in FLIPS}, "round1_ungraded": ungraded,
        "judged": len(judged), "approve_rate_on_right": rate(sum(right), len(right)),
        "approve_rate_on_wrong": rate(sum(wrong), len(wrong)),
        "judge_precision": rate(sum(approved), len(approved)), "judge_recall": rate(sum(right), len(right)),
        "judge_accuracy": rate(sum(right) + len(wrong) - sum(wrong), len(judged)),
        "graded_episodes": len(graded), "round1_accuracy": r1_acc, "final_accuracy": fin_acc,
        "accuracy_change": None if r1_acc is None or fin_acc is None else fin_acc - r1_acc,
    }





def math4_effects(records: Iterable[Any]) -> dict[str, Any]:
    """What the critic / refiner / verifier did to the score, over E episodes.

    - refined = episodes in which the refiner acted (refined_rate = refined / E); replaced = episodes
      whose first solver answer was replaced (by the refiner or a second solver turn);
    - flips {wrong_to_right, right_to_wrong, wrong_to_wrong, right_to_right}: over the replaced
      episodes with a recorded round-1 grade, (first answer right?) -> (final answer right?);
    - approve_rate = the verifier's first verdicts that approve / episodes with a verdict;
    - graded_episodes, round1_accuracy, final_accuracy, accuracy_change (final - round 1), over the
      episodes whose first answer's grade is known (the final grade when it was never replaced)."""
    recs = views(records)
    flips = dict.fromkeys(("wrong_to_right", "right_to_wrong", "wrong_to_wrong", "right_to_right"), 0)
    refined = replaced = approved = judged = 0
    graded: list[tuple[bool, bool]] = []
    for r in recs:
        answers = sum(len(r.agent_turns(a)) for a in ANSWERING)
        refined += bool(r.agent_turns("refiner"))
        r1 = r.correct if answers == 1 else r.round1_correct if answers > 1 else None
        if answers > 1:
            replaced += 1
            if r1 is not None:
                flips[f"{'right' if r1 else 'wrong'}_to_{'right' if r.correct else 'wrong'}"] += 1
        if r1 is not None:
            graded.append((r1, r.correct))
        verdicts = r.agent_turns("verifier")
        if verdicts:
            judged += 1
            approved += proto.math_verdict(verdicts[0].text) == "approve"
    r1_acc = mean_or_none([float(a) for a, _ in graded])
    fin_acc = mean_or_none([float(b) for _, b in graded])
    return {"episodes": len(recs), "refined": refined, "refined_rate": rate(refined, len(recs)),
            "replaced": replaced, "flips": flips, "judged": judged, "approve_rate": rate(approved, judged),
            "graded_episodes": len(graded), "round1_accuracy": r1_acc, "final_accuracy": fin_acc,
            "accuracy_change": None if r1_acc is None or fin_acc is None else fin_acc - r1_acc}




def fixer_effects(records: list[RecordView]) -> dict[str, Any]:
    """How often the fixer was called, how often it fixed the episode, and the solver's own accuracy."""
    called = fixed = solver_right = 0
    for r in records:
        n_fix = sum(t.agent == "fixer" for t in r.turns)
        solver_right += n_fix == 0 and r.correct
        called += n_fix > 0
        fixed += n_fix > 0 and r.correct
    n = len(records)
    return {"episodes": n, "solver_accuracy": solver_right / n if n else None,
            "fixer_called_rate": called / n if n else None, "fix_rate": fixed / called if called else None}


AGENT_FIGURES = {"searcher": actor_figures("searcher"), "answerer": actor_figures("answerer"),
                 "search_verifier": search_verifier_figures, "math_verifier": math_verifier_figures}
EPISODE_FIGURES = {"searcher": search_episode_figures, "answerer": search_episode_figures,
                   "math_verifier": rounds_figures}
EFFECTS = {"search_route": ("search", search_effects), "math_refine": ("math", math_effects),
           "math_4agent": ("math_4agent", math4_effects), "toy_fixer": ("fixer", fixer_effects)}
