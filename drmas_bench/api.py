"""The library entry point for evaluation: ``evaluate(EvalConfig) -> Summary``.

    from drmas_bench import evaluate, EvalConfig
    s = evaluate(EvalConfig(model="tiny-random", suite="toy", n=2, limit=3, out="runs/toy-nb"))
    s["micro"]["avg@n"], s.run_dir, print(s.markdown)       # avg@n is a fraction (0.25 = 25 %)

``drmas-bench eval`` only maps its flags to an :class:`EvalConfig` and calls :func:`evaluate`; so do
``drmas-bench cost --team`` and notebooks. A field left ``None`` is "not set", which is how the one
precedence rule tells an explicit value from a default:

    built-in defaults  <  team file / a checkpoint's team.yaml  <  explicit EvalConfig values (flags)

- sampling (``temperature``, ``top_p``, ``max_new_tokens``, ``enable_thinking``): REFERENCE.md §3
  defaults (``SAMPLING_DEFAULTS``, the suite's ``max_new_tokens``) < the team file's ``sampling:``
  (team-wide, then per agent) < the explicit values, which hold for every agent;
- workflow: the suite's (``Suite.workflow``) < the team file's ``workflow:`` < ``workflow``; it is
  chosen first and the team is validated against *its* agents;
- prompts / prompt limit: packaged < team file's ``prompts:`` / ``protocol:`` < ``prompts`` /
  ``max_prompt_tokens``;
- engines: the team file's ``engine:`` per worker group < ``engine`` (every group; options the new
  engine lacks are dropped with a note);
- engine options: each engine's defaults < the team file's ``options:`` < ``max_batch`` /
  ``engine_args`` (set on every worker group whose engine has that option; an option no group's
  engine has is an error).

``evaluate`` is two steps: :func:`drmas_bench.plan.plan` (pure: everything is checked and resolved,
nothing is opened, loaded, fetched or built and the run directory is not touched: a mistake leaves no
config behind; what must be fetched, merged or built first comes back as a ``needs.Pending`` of
steps) and :func:`run`, which first performs those steps (:func:`prepare`: a checkpoint URL
downloaded, a reference checkpoint merged, an alias built, each into the cache, resumable) and plans
again, then owns every resource of the run and closes it, also on an error or a stop
signal: the call cache and the retriever (opened first), the run directory (its lock is taken, its
identity checked: resume or refuse), the pool of engines (behind the call chain, ``calls.py``), then
:func:`write_summary` writes the summary. :func:`run_on_engines` is :func:`run` on engines the
caller already holds and keeps (a trainer validating on its rollout engines: nothing is loaded, copied
or closed; drmas_trainer.validation). Every run records its provenance
(``drmas_bench.provenance``, plus data hashes, model identity, grader, prompts hash and workflow
code hash) under ``provenance:`` in ``config.yaml`` (outside the identity: it never blocks a resume)
and in ``summary.json`` with start / end time and duration.

Progress lines (``[eval] ...``) go to the ``drmas_bench`` logger at INFO; a library caller sees them
after ``logging.basicConfig(level=logging.INFO)`` or ``drmas_bench.log.setup()`` (the CLI's handler).
An unexpected error is raised as ``drmas_bench.log.UnexpectedError`` (a UserError whose
``.original`` is the exception itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from drmas_bench import compact, metrics, runner
from drmas_bench.benchmarks.catalog import get_benchmark
from drmas_bench.call_cache import CacheTally, CallCache
from drmas_bench.calls import CallChain
from drmas_bench.limits import LimitReached, start_meter
from drmas_bench.log import UnexpectedError, one_line, traceback_note, unexpected
from drmas_bench.needs import Pending

# the config and its resolution live in drmas_bench.plan; re-exported here for callers of drmas_bench.api
from drmas_bench.plan import (  # noqa: F401
    DEFAULT_MAX_BATCH,
    SAMPLING_DEFAULTS,
    EvalConfig,
    Plan,
    parse_engine_args,
    plan,
    resolve,
    validate_config,
)
from drmas_bench.pool import make_pool, specs_from_team
from drmas_bench.preparation import perform
from drmas_bench.provenance import hardware, utc_now
from drmas_bench.records import view
from drmas_bench.report.runs import load_run
from drmas_bench.reproducibility import (
    FingerprintTally,
    batching_of,
    live_determinism,
    note_batching,
    read_batching,
    reproducibility_block,
    warn_changed_batching,
)
from drmas_bench.retrievers import open_retriever
from drmas_bench.run_dir import RunDir
from drmas_bench.run_samples import selection_test
from drmas_bench.split import run_split
from drmas_bench.types import UserError

logger = logging.getLogger(__name__)


@dataclass
class Summary:
    """What :func:`evaluate` returns: ``summary.json``'s content (also reachable as ``s[key]``), the
    Markdown the CLI prints, and the run directory."""

    data: dict[str, Any]
    markdown: str
    run_dir: Path

    def to_dict(self) -> dict[str, Any]:
        return self.data

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


def protocol_summary(records: Iterable[Any], info: dict | None) -> dict:
    """summary.json's ``protocol``: the prompts hash / source and prompt limit of the run, the number
    of recorded calls, how many had their prompt truncated by the engine, and how many carried a
    limit the engine could not apply (an HTTP model without a tokenizer here or on its server:
    ``prompt_limit_unenforced_calls``)."""
    tally = ProtocolCalls()
    for r in records:
        tally.add(r)
    return tally.result(info)


class ProtocolCalls:
    """`protocol_summary`'s counts, one record at a time (a reader the run's summary feeds)."""

    def __init__(self) -> None:
        self.calls = self.truncated = self.unenforced = 0

    def add(self, record: Any) -> None:
        for t in view(record).turns:
            self.calls += 1
            self.truncated += t.call.prompt_truncated
            self.unenforced += t.call.prompt_limit_unenforced

    def result(self, info: dict | None) -> dict:
        return {**(info or {}), "calls": self.calls, "prompt_truncated_calls": self.truncated,
                "prompt_limit_unenforced_calls": self.unenforced}


def evaluate(config: EvalConfig) -> Summary:
    """Run (or resume) one evaluation and return its summary (see the module docstring).

    Raises UserError (one line) on bad input, before anything loads; after the run directory is
    opened, an unexpected error keeps its traceback in RUN/error.log and finished samples stay."""
    if not isinstance(config, EvalConfig):
        raise UserError(f"evaluate() takes an EvalConfig, got {type(config).__name__}")
    return run(plan(config))  # everything is checked in plan(), before anything opens


def prepare(p: Plan | Pending) -> Plan:
    """A complete plan: ``p`` itself, or, for a :class:`needs.Pending`, its steps performed (fetched,
    merged, built into the cache; ``drmas_bench.preparation``) and the configuration planned again,
    until nothing is left (a checkpoint's team may name models of its own to prepare). A step whose
    source changed while it ran, so that the same step is pending again, is one line."""
    before: set = set()
    while isinstance(p, Pending):
        todo = {(s.action, s.dest) for s in p.todo}
        if todo & before:
            s = next(s for s in p.todo if (s.action, s.dest) in before)
            raise UserError(f"{s.source}: still not in the cache after it was prepared ({s.action}); "
                            "it may have changed meanwhile: run again")
        before |= todo
        perform(p.todo, show_progress=p.cfg.progress)
        p = plan(p.cfg, clock=(p.started, p.t0))
    return p


def run(p: Plan | Pending) -> Summary:
    """Run plan ``p``: perform what it still needs fetched, merged or built (:func:`prepare`), open
    what it names (the call cache, checked; the retriever, probed; both before the run directory is
    touched), take the run directory (its lock, its identity: resume or refuse), run the episodes on
    a pool of the team's engines, write the summary. Everything it opened is closed on the way out,
    also on an error or a stop signal (SIGTERM arrives as KeyboardInterrupt)."""
    p = prepare(p)
    with contextlib.ExitStack() as opened:
        call_cache = None
        if p.call_cache_dir:  # a damaged file is refused here, before any model loads
            call_cache = opened.enter_context(CallCache.open(p.call_cache_dir))
        retriever = None
        if p.retriever_spec:  # a server that is down, an index that is missing: fails here
            retriever = open_retriever(p.retriever_spec)
            if p.cfg.workers > 1:  # probed (an index built and cached) here; each worker opens its own
                close_retriever(retriever)
                retriever = None
            else:
                opened.callback(close_retriever, retriever)
        store = RunDir(p.out, p.config_doc, fresh=p.cfg.fresh)  # takes RUN/.lock, then writes the identity
        opened.callback(store.close)
        warn_changed_batching(note_batching(store.path, batching_of(p.cfg, p.team), kept=len(store.index) > 0), p.team)
        try:
            if p.cfg.workers > 1:  # the episodes over worker processes / Ray actors, each with its own engines
                stats, pool_stats = asyncio.run(run_split(p, store, lambda ctx: run_kept(p, store, ctx)))
            else:
                stats, pool_stats = asyncio.run(run_on_pool(p, store, call_cache, retriever))
            if stats.stopped and not store.selected():  # a limit below one episode's spending: nothing to summarize
                raise LimitReached(stats.stopped)
            summary = write_summary(p, store, stats, pool_stats)
            if stats.stopped:  # a run limit: the summary of the finished samples is written, the caller told
                raise LimitReached(stats.stopped, summary)
            return summary
        except (UserError, KeyboardInterrupt, LimitReached):
            raise
        except Exception as e:  # a bug, not a user mistake: keep the traceback, say so in one line
            raise unexpected(e, log=store.log_error(e),
                             hint=f"finished samples are kept in {store.samples_path}") from None


async def run_on_engines(p: Plan, engines: dict[str, Any], *, models: dict[str, Any] | None = None,
                         retriever: Any = None, pool_stats: dict[str, Any] | None = None) -> Summary:
    """Run plan ``p`` on engines the caller already holds (``{worker group: engine}``, each with
    ``async generate(requests)``), in the caller's event loop: the same episodes, records, grading
    and summary as :func:`run`, but nothing is loaded, copied or closed. This is how a trainer
    validates its policy on its own rollout engines after a weight sync.

    ``models``: what the run's identity records as each worker group's model (the engines' weights
    are not the plan's model folders; ``None``: the plan's); ``retriever``: an open retriever to use
    (``None``: the plan's spec is opened here and closed after); ``pool_stats``: summary.json's
    ``pool`` section. The call cache and spending limits of the plan are not applied (the engines are
    the caller's)."""
    if models is not None:
        p = with_models(p, models)
    missing = sorted(set(p.team.worker_groups) - set(engines))
    if missing:
        raise UserError(f"no engine for worker group(s) {', '.join(missing)}; given: {', '.join(engines) or 'none'}")
    with contextlib.ExitStack() as opened:
        if retriever is None and p.retriever_spec:
            retriever = open_retriever(p.retriever_spec)
            opened.callback(close_retriever, retriever)
        store = RunDir(p.out, p.config_doc, fresh=p.cfg.fresh)  # takes RUN/.lock, then writes the identity
        opened.callback(store.close)
        note_batching(store.path, batching_of(p.cfg, p.team), kept=len(store.index) > 0)
        live = {wg: d for wg in p.team.worker_groups if (d := live_determinism(engines[wg])) is not None}
        try:
            chain = CallChain(prices=p.prices)
            runtime = runner.TeamRuntime(p.team, {wg: engines[wg] for wg in p.team.worker_groups}, p.sampling)
            stats = await run_kept(p, store, runner.eval_run(p, runtime, store, retriever, chain))
            return write_summary(p, store, stats, {**(pool_stats or {"pool": "engines held by the caller"}),
                                                   "engine_determinism": live})
        except (UserError, KeyboardInterrupt):
            raise
        except Exception as e:
            raise unexpected(e, log=store.log_error(e), hint=f"finished samples are kept in {store.samples_path}") from None


def with_models(p: Plan, models: dict[str, Any]) -> Plan:
    """Plan ``p`` with ``models`` as its identity's and provenance's models (what each worker group runs)."""
    doc = {**p.config_doc, "identity": {**p.config_doc["identity"], "models": models},
           "provenance": {**p.provenance, "models": models}}
    return replace(p, record=replace(p.record, config_doc=doc, provenance=doc["provenance"]))


def close_retriever(retriever: Any) -> None:
    """Close an open retriever (an HTTP client's connections, an index's files) if it can be closed."""
    close = getattr(retriever, "close", None)
    if callable(close):
        close()


async def run_on_pool(p: Plan, store: RunDir, call_cache: CallCache | None, retriever: Any) -> tuple[runner.RunStats, dict]:
    """Serve the team's worker groups from a pool (engines asleep until needed when the budget is
    smaller than the team), each engine behind the run's call chain (``calls.CallChain``: cache,
    limits, cost), run the episodes, always release the engines. -> (RunStats, pool stats)"""
    cfg, team, wf = p.cfg, p.team, p.wf
    meter = None
    if p.limits is not None:  # what the kept samples (and earlier stops) spent counts; one reached: no model loads
        meter, stopped = start_meter(p, store)
        if stopped is not None:
            return runner.RunStats(**stopped), {}
    chain = CallChain(prices=p.prices, call_cache=call_cache, meter=meter)
    ray_opts = {"address": cfg.ray_address} if cfg.pool == "ray" else {}
    if call_cache is not None:  # an engine loads when a call misses the cache: a fully cached run loads no model
        ray_opts["preload"] = False
    pool = make_pool(cfg.pool, specs_from_team(team), budget_models=cfg.pool_budget, **ray_opts)
    try:
        await pool.__aenter__()  # loads the engines that fit the budget
    except UserError:
        raise
    except Exception as e:
        models = ", ".join(f"{n}={g.model}" for n, g in team.worker_groups.items())
        log = store.log_error(e)
        raise UnexpectedError(f"cannot load the team's models ({models}): {one_line(e)} ({traceback_note(log)})",
                              e, log) from None
    try:
        engines = chain.wrap(pool.views(), team, p.config_doc["identity"]["models"], here=cfg.pool != "ray")
        ctx = runner.eval_run(p, runner.TeamRuntime(team, engines, p.sampling), store, retriever, chain)
        logger.info(f"[eval] {len(p.tasks)} questions x {cfg.n} samples, workflow {wf.name}, run dir {store.path}")
        stats = await run_kept(p, store, ctx)
        if meter is not None:
            stats.limits = meter.record(store.selected())
        held = getattr(pool, "engine", None)  # LocalPool: the engines themselves (a Ray pool's are actors)
        live = {wg: d for wg in team.worker_groups
                if held is not None and (d := live_determinism(held(wg))) is not None}
        return stats, {**pool.stats(), "engine_determinism": live}
    finally:
        await pool.__aexit__(None, None, None)


async def run_kept(p: Plan, store: RunDir, ctx: runner.EpisodeRun) -> runner.RunStats:
    """``runner.run_episodes`` over the plan's tasks; an error says where the finished samples are and
    that the same command resumes (a bug's traceback goes to RUN/error.log)."""
    try:
        return await runner.run_episodes(p.tasks, p.cfg.n, ctx)
    except UserError as e:
        raise UserError(f"{e} (finished samples are saved in {store.samples_path}; re-run to resume)") from None
    except Exception as e:
        raise unexpected(e, "run stopped", log=store.log_error(e),
                         hint=f"finished samples are saved in {store.samples_path}; re-run to resume") from None


def summary_inputs(p: Plan) -> dict[str, Any]:
    """What summary.json depends on besides the selected records and the run's own clock and counters
    (the part a re-opened run with nothing to do may reuse: ``RunDir.kept_summary``)."""
    prices = dataclasses.asdict(p.prices) if p.prices is not None else None
    if prices is not None:
        prices.pop("unpriced")  # filled while summarizing
    return {"prices": prices, "workflow": p.wf.name, "protocol": p.protocol_info, "grader": p.grader,
            "cache_dir": p.call_cache_dir}


def write_summary(p: Plan, store, stats, pool_stats: dict) -> Summary:
    """summary.json / summary.md of the run directory's selected records (metrics.summarize), with the
    run, pool, protocol, grader and provenance sections. A re-opened run that ran nothing, whose
    samples, selection and summary inputs are those its summary.json was computed from
    (``RunDir.kept_summary``), keeps that summary's figures and only renews its run, pool and
    provenance sections: samples.jsonl is not read."""
    from drmas_bench.report.run_markdown import run_summary_markdown

    cfg, team, wf, tasks = p.cfg, p.team, p.wf, p.tasks
    out = store.path

    key = store.summary_key(summary_inputs(p))
    kept = store.kept_summary(key) if stats.episodes == 0 and not stats.stopped and not stats.limits else None
    # the selection (leaderboard and cost read it too) as views of the compact records, read one line at
    # a time: the metrics, protocol and cache sections are summed as they come
    calls, cache, prints = ProtocolCalls(), CacheTally(), FingerprintTally()
    if kept is None:
        records = compact.stream_views(out, selection_test(store.config))
        summary = metrics.summarize(store.compact_views() if records is None else records, prices=p.prices,
                                    workflow=wf.name, also=(calls, cache, prints))
        fingerprints = prints.result()
    else:
        summary = kept
        fingerprints = {wg: g.get("fingerprints") or [] for wg, g in
                        ((kept.get("reproducibility") or {}).get("groups") or {}).items()}
    summary["run"] = {"dir": str(out), "workflow": wf.name, "episodes_run": stats.episodes,
                      # a run limit stopped it: which, and how many of the planned samples are finished
                      **({"stopped": {**stats.stopped, "samples_finished": summary["micro"]["samples"],
                                      "samples_planned": len(tasks) * cfg.n}} if stats.stopped else {}),
                      **({"limits": stats.limits} if stats.limits else {}),
                      "episodes_resumed": stats.skipped, "wall_s": round(stats.wall_s, 2),
                      # what summary.md's header and agents table name: every agent of the team (also one
                      # never called), with its worker group and that group's model
                      "suite": cfg.suite or ", ".join(sorted({get_benchmark(t.benchmark).suite for t in tasks})),
                      "benchmarks": list(dict.fromkeys(t.benchmark for t in tasks)),
                      "team": {a: {"worker_group": wg, "model": team.worker_groups[wg].model}
                               for a, wg in team.agents.items()}}
    pool_stats = dict(pool_stats)
    summary["reproducibility"] = reproducibility_block(team, cfg.seed, pool_stats.pop("engine_determinism", None),
                                                       fingerprints, read_batching(out) or [batching_of(cfg, team)])
    summary["pool"] = pool_stats
    if kept is None:
        summary["protocol"] = calls.result(p.protocol_info)
        summary["grader"] = p.grader
        summary["cache"] = cache.result(p.call_cache_dir)  # None when off (and no kept call came from a cache)
    # the engines have imported torch by now: the GPUs are known without a probe of their own
    summary["provenance"] = {**p.provenance, "hardware": hardware(), "finished_at": utc_now(),
                             "duration_s": round(time.monotonic() - p.t0, 2)}
    md = run_summary_markdown(summary)
    store.write_summary(summary, md, key)
    logger.info(f"\n[eval] {stats.episodes} episodes run, {stats.skipped} resumed from disk, {stats.wall_s:.1f} s; "
                f"summary in {out}/summary.md")
    return Summary(summary, md, out)


def evaluate_compute_matched(cfg: EvalConfig, team_dir: str | Path):
    """``drmas-bench eval --compute-matched TEAM_RUN``: evaluate `cfg` (a single-agent workflow) with
    the team run's n, measure, then resume the same run dir with n_team * k samples; returns
    (the final Summary, the comparison)."""
    from drmas_bench.report.compute_matched import compute_matched, matched_k, tokens_per_trajectory

    team = load_run(team_dir)
    if cfg.suite and cfg.suite != team.suite:  # before anything runs (the question sets are checked after the first pass)
        raise UserError(f"--compute-matched: {team.path} is a {team.suite} run; this one is --suite {cfg.suite}")
    first = evaluate(replace(cfg, n=team.n))
    single = load_run(first.run_dir)
    k = matched_k(tokens_per_trajectory(team.views), tokens_per_trajectory(single.views))
    logger.info(f"[eval] compute-matched: team {team.path} spends {k}x the single agent's tokens per trajectory; "
                f"running {team.n * k} samples per question")
    final = evaluate(replace(cfg, n=team.n * k, out=str(first.run_dir))) if k > 1 else first
    return final, compute_matched(team_dir, final.run_dir)


__all__ = ["EvalConfig", "LimitReached", "Pending", "Plan", "Summary", "prepare", "evaluate", "evaluate_compute_matched",
           "parse_engine_args", "plan", "run", "run_on_engines", "write_summary"]
