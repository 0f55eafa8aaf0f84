"""Assignment sweeps (``drmas-bench sweep``, docs/sweep.md): one suite, one seed schedule, a set of
assignments of models to a workflow's agents, each evaluated as a normal run directory under
``OUT/runs/`` (through the call cache when one is given), then one ``sweep.json``, one table
(``sweep.md``, written by ``report.markdown.sweep_markdown``) and one Pareto plot over them.

Planning (pure: the candidates, the three designs, the run directory names) is
``sweep_design.py``; here, two parts, in this order in the file:

- **figures** (pure over recorded records): per-assignment accuracy, calls, cache hits, tokens,
  latency and dollars as if each assignment had run alone (a cached call counts its original latency
  and cost), the Pareto flags (``report.cost.pareto_front``) and the paired difference against the
  baseline (``report.compare.compare_runs``: one home for the paired bootstrap);
- **running**: each assignment planned (``plan.plan``), skipped when its run directory already holds
  every sample of this exact configuration, else evaluated (``api.evaluate``, which resumes a
  half-finished run); ``sweep.json`` rewritten after every assignment, so a killed sweep leaves a
  readable file and the next invocation continues where it stopped.

Why pairing matters: assignments that keep an upstream agent's model share that agent's cached
samples (same call, same seed), so their scores are positively correlated and the variance of their
difference, Var A + Var B - 2 Cov(A, B), is smaller than for independent runs; the comparison must
be paired per question, and it is conditional on the shared upstream samples.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import yaml

from drmas_bench import metrics
from drmas_bench.api import evaluate, prepare
from drmas_bench.engines import DEFAULT_ENGINE, traits
from drmas_bench.files import atomic_write, fingerprint
from drmas_bench.models import resolve_model
from drmas_bench.plan import check_team_models, plan, resolve, resolve_local_models, validate_config
from drmas_bench.pricing import load_prices, team_prices
from drmas_bench.report.compare import compare_runs
from drmas_bench.report.cost import alone_latency, pareto_front, plot_pareto, run_turn_cost
from drmas_bench.report.leaderboard import digest
from drmas_bench.report.markdown import sweep_markdown
from drmas_bench.report.runs import load_run
from drmas_bench.run_samples import read_samples, sample_key, select_records, selection_of
from drmas_bench.sweep_design import Design, label, run_names
from drmas_bench.types import UserError

logger = logging.getLogger(__name__)

SWEEP_JSON = "sweep.json"
SWEEP_MD = "sweep.md"
PARETO_PNG = "pareto.png"

# =================================================================================== figures


def assignment_figures(run: Any, prices: Any = None) -> dict[str, Any]:
    """One assignment's figures from its run (``report.runs.Run``): avg@n, pass@k, pass^k, calls, cache hits,
    tokens, latency (mean per question of its calls' summed latency) and dollars as if alone, the
    dollars the sweep paid (cached calls cost nothing), and the agents' effect: the phrase the
    workflow declares over its effects block (``report.leaderboard.digest``; "–" without one)."""

    qs = list(metrics.questions(run.views).values())
    n_min = min(q.n for q in qs)
    calls = hits = tokens = 0
    tokens_known = True
    usd: float | None = 0.0 if prices is not None else None
    paid: float | None = usd
    latencies = []
    for r in run.views:
        lat = 0.0
        for t in r.turns:
            calls += 1
            hit = t.call.cache_hit
            hits += hit
            lat += alone_latency(t)
            if t.call.usage_known:
                tokens += t.call.tokens
            else:
                tokens_known = False
            if prices is not None:
                cost = run_turn_cost(run, t, prices, as_alone=True)
                usd = None if cost is None or usd is None else usd + cost
                paid = None if cost is None or paid is None else paid + (0.0 if hit else cost)
        latencies.append(lat)
    return {
        "questions": len(qs),
        "trajectories": len(run.records),
        "n": n_min,
        "avg@n": float(metrics.avg_values(qs).mean()),
        "pass@k": {str(k): float(metrics.pass_values(qs, k).mean()) for k in metrics.default_ks(n_min)},
        "pass^k": {str(k): float(metrics.pass_hat_values(qs, k).mean()) for k in metrics.default_ks(n_min)},
        "latency_s": float(sum(latencies) / len(latencies)) if latencies else 0.0,
        "tokens": tokens if tokens_known else None,
        "usd": usd,
        "usd_paid": paid,
        "model_calls": calls,
        "cache_hits": hits,
        "effect": digest(run).effect,
    }


def pareto_flags(points: Sequence[tuple[float | None, float]]) -> list[bool]:
    """Which points (cost, accuracy) are on the Pareto front (``report.cost.pareto_front``: no
    other point is as cheap and as accurate, one of them strictly); a point whose cost is unknown
    (None) is off the front and not compared."""

    known = [(i, c, acc) for i, (c, acc) in enumerate(points) if c is not None and c == c]
    front = {known[j][0] for j in pareto_front([(float(c), float(acc)) for _, c, acc in known])}
    return [i in front for i in range(len(points))]


def paired_difference(base_run: Any, run: Any, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """avg@n of ``run`` minus the baseline's, paired per question (same benchmark and task id, same
    seed schedule), with the paired bootstrap CI of ``report.compare.compare_runs`` (pooled)."""

    p = compare_runs(base_run, run, n_boot=n_boot, seed=seed).pooled
    return {"diff": p.avg_diff, "ci_low": p.avg_ci[0], "ci_high": p.avg_ci[1], "n_pairs": p.shared,
            "pass_diff": p.pass_diff, "pass_ci_low": p.pass_ci[0], "pass_ci_high": p.pass_ci[1], "sign_p": p.sign_p}


def sweep_document(d: Design, rows: list[dict[str, Any]], runs: list[Any], *, suite: str, prices: str | None,
                   cache: str | None, n_boot: int = 2000, seed: int = 0, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``sweep.json``: the design, one entry per finished assignment (``rows``: ``assignment``, ``run``
    and :func:`assignment_figures`, with ``runs`` their ``Run``), the Pareto flags over them, the
    paired difference against the baseline (when it has finished), and the sweep's call counts:
    ``model_calls`` (sent to engines: calls not served by the cache), ``calls_without_cache``
    (what independent evals would send: every recorded call)."""
    base_i = next((i for i, r in enumerate(rows) if r["assignment"] == d.baseline), None)
    usd_front = pareto_flags([(r["usd"], r["avg@n"]) for r in rows])
    lat_front = pareto_flags([(r["latency_s"], r["avg@n"]) for r in rows])
    entries = []
    for i, (r, run) in enumerate(zip(rows, runs)):
        vs = paired_difference(runs[base_i], run, n_boot, seed) if base_i is not None else None
        entries.append({**r, "label": label(r["assignment"]), "baseline": i == base_i,
                        "pareto_usd": usd_front[i], "pareto_latency": lat_front[i], "vs_baseline": vs})
    sent = sum(r["model_calls"] - r["cache_hits"] for r in rows)
    every = sum(r["model_calls"] for r in rows)
    paid = [r["usd_paid"] for r in rows]
    alone = [r["usd"] for r in rows]
    return {
        "suite": suite,
        "workflow": d.workflow,
        "agents": list(d.agents),
        "default_model": d.default_model,
        "candidates": d.candidates,
        "design": {"kind": d.kind, "planned": len(d.assignments), "possible": d.possible},
        "baseline": d.baseline,
        "assignments": entries,
        "finished": len(rows),
        "complete": len(rows) == len(d.assignments),
        "model_calls": sent,
        "calls_without_cache": every,
        "cache_hits": every - sent,
        "calls_ratio": (sent / every) if every else None,
        "usd": None if any(x is None for x in alone) or not rows else sum(alone),
        "usd_paid": None if any(x is None for x in paid) or not rows else sum(paid),
        "prices": prices,
        "cache": cache,
        "bootstrap": {"n_boot": n_boot, "seed": seed},
        **(extra or {}),
    }


@dataclass
class _Point:
    """What ``report.cost.plot_pareto`` reads of a team, for one assignment."""

    label: str
    avg: float
    usd_per_1k: float | None
    latency_p50: float


def plot_sweep(doc: dict[str, Any], path: str | Path) -> Path:
    """``pareto.png``: accuracy vs $ per 1,000 questions and vs latency per question (as if alone),
    the fronts drawn (``report.cost.plot_pareto``)."""

    pts = [_Point(r["label"], r["avg@n"], None if r["usd"] is None else r["usd"] * 1000 / r["trajectories"],
                  r["latency_s"]) for r in doc["assignments"]]
    return plot_pareto(pts, path, prices_source=Path(doc["prices"]).name if doc.get("prices") else "no price sheet",
                       title=f"Sweep ({doc['suite']} suite, {doc['workflow']}): accuracy vs cost and latency; "
                             "up and left is better",
                       latency_label="latency per question: summed call time, as if alone (s)")


# =================================================================================== running


def assignment_config(base: Any, assignment: dict[str, str], run_dir: Path) -> Any:
    """The EvalConfig of one assignment: the sweep's eval flags, every agent's model named
    (``model_for``), its run directory."""
    return replace(base, model=None, model_for=dict(assignment), team=None, out=str(run_dir))


def finished(p: Any) -> bool:
    """Whether plan ``p``'s run directory already holds a summary and every sample of exactly this
    configuration (same identity and selection as ``config.yaml``): then nothing is loaded for it."""

    cfg_path, samples = p.out / "config.yaml", p.out / "samples.jsonl"
    if not ((p.out / "summary.json").is_file() and cfg_path.is_file() and samples.is_file()):
        return False
    try:
        old = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return False
    if fingerprint(old.get("identity") or {}) != fingerprint(p.config_doc["identity"]):
        return False
    if selection_of(old) != selection_of(p.config_doc):
        return False
    done = {sample_key(r) for r in select_records(read_samples(samples, missing_ok=True), p.config_doc)}
    return all((str(t.benchmark), str(t.id), i) in done for t in p.tasks for i in range(p.cfg.n))


def check_assignment(cfg: Any) -> None:
    """What ``plan.plan`` checks of one assignment's team, without its data or retriever (the same
    for every assignment, checked once): the team built, each local model resolved and checked,
    the price sheet holding every model."""

    validate_config(cfg)
    team = resolve(cfg).team
    check_team_models(team, resolve_local_models(team, on_nodes=cfg.pool == "ray"))
    if cfg.prices:
        team_prices(cfg.prices, team)


def check_models(d: Design, engine: str | None) -> None:
    """Each distinct model of the design resolved once (an unknown model is one line naming it)
    before the first assignment runs; models served over HTTP are left to their servers."""

    if traits(engine or DEFAULT_ENGINE).remote:
        return
    for m in dict.fromkeys(m for a in d.assignments for m in a.values()):
        try:
            resolve_model(m)
        except UserError as e:
            raise UserError(f"sweep: model {m!r}: {e}") from None


def run_sweep(base: Any, d: Design, out: str | Path, *, n_boot: int = 2000, boot_seed: int = 0) -> dict[str, Any]:
    """Evaluate every assignment of ``d`` with the eval flags of ``base`` (an EvalConfig) into
    ``OUT/runs/<name>``, resumably; write ``sweep.json`` after each, then ``sweep.md`` and
    ``pareto.png``. Returns the sweep document."""

    out = Path(out)
    check_models(d, base.engine)
    prices = load_prices(base.prices) if base.prices else None
    names = run_names(d.assignments)
    cache = getattr(base, "cache", None)
    t0 = time.monotonic()
    rows, runs, ran, skipped = [], [], 0, 0
    doc: dict[str, Any] = {}
    cfgs = [assignment_config(base, asg, out / "runs" / name) for asg, name in zip(d.assignments, names)]
    # every assignment checked before the first one runs: the first planned in full (data, team,
    # prompts: plan() opens nothing; check_models prepared the models), the others in what differs
    # between them (team, models, prices)
    first = prepare(plan(cfgs[0]))
    for cfg in cfgs[1:]:
        check_assignment(cfg)
    for i, (asg, cfg) in enumerate(zip(d.assignments, cfgs), 1):
        run_dir = Path(cfg.out)
        # a run dir with a summary may be finished: its plan (pure) says whether it is this configuration
        if (run_dir / "summary.json").is_file() and finished(first if i == 1 else prepare(plan(cfg))):
            skipped += 1
            logger.info(f"[sweep] {i}/{len(names)} {label(asg)}: finished earlier, kept ({run_dir})")
        else:
            logger.info(f"[sweep] {i}/{len(names)} {label(asg)} -> {run_dir}")
            evaluate(cfg)
            ran += 1
        run = load_run(run_dir)
        rows.append({"assignment": dict(asg), "run": str(run_dir), **assignment_figures(run, prices)})
        runs.append(run)
        doc = sweep_document(d, rows, runs, suite=first.suite, prices=base.prices, cache=cache, n_boot=n_boot,
                             seed=boot_seed, extra={"seed": base.seed, "n": base.n, "limit": base.limit,
                                                    "wall_s": round(time.monotonic() - t0, 2),
                                                    "assignments_run": ran, "assignments_kept": skipped})
        atomic_write(out / SWEEP_JSON, json.dumps(doc, indent=2, ensure_ascii=False))
    atomic_write(out / SWEEP_MD, sweep_markdown(doc))
    plot_sweep(doc, out / PARETO_PNG)
    logger.info(f"[sweep] {ran} assignments run, {skipped} kept; wrote {out / SWEEP_JSON}, {SWEEP_MD}, {PARETO_PNG}")
    return doc


def read_sweep(path: str | Path) -> dict[str, Any]:
    """A sweep folder's ``sweep.json`` (or the file itself), for ``cost --sweep`` and notebooks."""
    p = Path(path)
    f = p / SWEEP_JSON if p.is_dir() else p
    if not f.is_file():
        raise UserError(f"{p}: no {SWEEP_JSON} (run `drmas-bench sweep ... --out {p}` first)")
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{f}: unreadable sweep file ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("assignments"), list):
        raise UserError(f"{f}: not a sweep file (no `assignments` list)")
    return doc
