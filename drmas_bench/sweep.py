"""Assignment sweeps (``drmas-bench sweep``, docs/sweep.md): one suite, one seed schedule, a set of
assignments of models to a workflow's agents, each evaluated as a normal run directory under
``OUT/runs/`` (through the call cache when one is given), then one ``sweep.json``, one table
(``sweep.md``, written by ``report.markdown.sweep_markdown``) and one Pareto plot over them.

Three parts, in this order in the file:

- **planning** (pure: nothing is read or loaded): the candidates and listed assignments parsed and
  checked against the workflow's agents, the three designs (every combination, a listed set, a
  budget-bounded design), the run directory names;
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

import hashlib
import itertools
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import yaml

from drmas_bench import metrics
from drmas_bench.agents.assign import assignment_name, short_model_name
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
from drmas_bench.run_dir import read_samples, sample_key, select_records, selection_of
from drmas_bench.types import UserError
from drmas_bench.yamlfile import read_yaml

logger = logging.getLogger(__name__)

SWEEP_JSON = "sweep.json"
SWEEP_MD = "sweep.md"
PARETO_PNG = "pareto.png"
DESIGNS = ("combinations", "listed", "budget")

# ================================================================================== planning


@dataclass(frozen=True)
class Design:
    """The assignments of one sweep, planned before anything runs.

    ``assignments`` are complete (every agent of the workflow named), in the order they run; the
    baseline is among them (the first unless the user chose another that the design already held)."""

    workflow: str
    agents: tuple[str, ...]
    default_model: str | None  # the eval's --model: every agent a candidate or listed entry leaves out
    candidates: dict[str, list[str]]  # agent -> models, as given (or gathered from the listed set)
    kind: str  # one of DESIGNS
    assignments: list[dict[str, str]]
    baseline: dict[str, str]
    possible: int  # assignments the candidates allow (len(assignments) for a listed set)


def parse_candidates(items: Sequence[str]) -> dict[str, list[str]]:
    """``["solver=M1,M2", "verifier=M3"]`` -> ``{"solver": ["M1", "M2"], "verifier": ["M3"]}``; an
    agent given twice, a model listed twice for one agent or an empty list is one UserError."""
    out: dict[str, list[str]] = {}
    for item in items:
        agent, sep, models = str(item).partition("=")
        agent = agent.strip()
        names = [m.strip() for m in models.split(",") if m.strip()]
        if not sep or not agent or not names:
            raise UserError(f"--candidates expects AGENT=MODEL[,MODEL...], got {item!r}")
        if agent in out:
            raise UserError(f"--candidates: agent {agent!r} given twice (list all its models in one --candidates)")
        dup = sorted({m for m in names if names.count(m) > 1})
        if dup:
            raise UserError(f"--candidates {agent}: model(s) listed twice: {', '.join(dup)}")
        out[agent] = names
    return out


def parse_assignment(text: str, what: str = "--baseline") -> dict[str, str]:
    """``"verifier=M1,searcher=M2"`` -> ``{"verifier": "M1", "searcher": "M2"}`` (one model per agent)."""
    out: dict[str, str] = {}
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        agent, sep, model = item.partition("=")
        if not sep or not agent.strip() or not model.strip():
            raise UserError(f"{what} expects AGENT=MODEL[,AGENT=MODEL...], got {text!r}")
        if agent.strip() in out:
            raise UserError(f"{what}: agent {agent.strip()!r} given twice")
        out[agent.strip()] = model.strip()
    if not out:
        raise UserError(f"{what} expects AGENT=MODEL[,AGENT=MODEL...], got {text!r}")
    return out


def read_assignments(path: str | Path) -> list[dict[str, str]]:
    """``--assignments FILE``: a YAML or JSON list of mappings agent -> model (one line per mistake)."""

    data = read_yaml(path, "assignments file")
    if not isinstance(data, list) or not data:
        raise UserError(f"{path}: an assignments file is a non-empty list of {{agent: model}} mappings")
    out = []
    for i, entry in enumerate(data, 1):
        if not isinstance(entry, dict) or not entry:
            raise UserError(f"{path}: entry {i} is not a mapping of agent -> model")
        for a, m in entry.items():
            if not isinstance(a, str) or not isinstance(m, str) or not m.strip():
                raise UserError(f"{path}: entry {i}: {a!r}: the model must be a non-empty string")
        out.append({a: m.strip() for a, m in entry.items()})
    return out


def check_agents(names: Sequence[str], agents: Sequence[str], where: str, workflow: str) -> None:
    """Every name must be one of the workflow's agents."""
    for a in names:
        if a not in agents:
            raise UserError(f"{where}: unknown agent {a!r}; the {workflow} workflow's agents: {', '.join(agents)}")


def complete(partial: dict[str, str], agents: Sequence[str], default_model: str | None, where: str) -> dict[str, str]:
    """An assignment with every agent named, in the workflow's order: agents left out get
    ``default_model`` (the eval's --model); without one, a left-out agent is an error."""
    missing = [a for a in agents if a not in partial]
    if missing and not default_model:
        raise UserError(f"{where}: no model for agent(s) {', '.join(missing)}: name them, or pass --model M for "
                        "the agents a sweep does not vary")
    return {a: partial.get(a, default_model) for a in agents}  # type: ignore[misc]


def combinations(candidates: dict[str, list[str]], agents: Sequence[str], default_model: str | None) -> list[dict[str, str]]:
    """Every combination of the candidates (the product over the candidate agents in the
    workflow's order, the first candidate of each agent varying slowest); other agents keep
    ``default_model``. The first is each agent's first candidate."""
    varied = [a for a in agents if a in candidates]
    out = []
    for combo in itertools.product(*(candidates[a] for a in varied)):
        out.append(complete(dict(zip(varied, combo)), agents, default_model, "--candidates"))
    return out


def budget_order(candidates: dict[str, list[str]], agents: Sequence[str], default_model: str | None,
                 baseline: dict[str, str]) -> list[dict[str, str]]:
    """The order a budget keeps assignments in: the baseline, then every single-agent swap from it
    (the workflow's agent order, each agent's candidates in their order), then the remaining
    combinations in :func:`combinations`' order. The first K of it are what ``--max-assignments K``
    runs: the baseline is the reference of every difference, and a single swap is the cheapest
    question a sweep answers ("what does giving this one agent that model do?")."""
    singles = [{**baseline, a: m} for a in agents if a in candidates for m in candidates[a] if m != baseline[a]]
    return dedupe([baseline, *singles, *combinations(candidates, agents, default_model)])


def dedupe(assignments: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """The assignments in order, each once."""
    seen, out = set(), []
    for a in assignments:
        key = tuple(sorted(a.items()))
        if key not in seen:
            seen.add(key)
            out.append(a)
    return out


def design(workflow: str, agents: Sequence[str], default_model: str | None, *,
           candidates: dict[str, list[str]] | None = None, listed: list[dict[str, str]] | None = None,
           max_assignments: int | None = None, baseline: dict[str, str] | None = None,
           listed_from: str = "--assignments") -> Design:
    """The sweep's assignments (see :class:`Design`); every check is here, before anything loads.

    Exactly one of ``candidates`` (every combination, or with ``max_assignments`` the first K of
    :func:`budget_order`) and ``listed`` (the listed set, in its order). ``baseline`` (partial:
    completed with ``default_model``) defaults to the first assignment; one the design lacks is
    run first."""
    agents = tuple(agents)
    if (candidates is None) == (listed is None):
        raise UserError("a sweep needs --candidates AGENT=M1,M2 (repeatable) or --assignments FILE, not both")
    if max_assignments is not None and max_assignments < 1:
        raise UserError(f"--max-assignments must be at least 1, got {max_assignments}")
    if candidates is not None:
        if not candidates:
            raise UserError("--candidates: no agent given")
        check_agents(list(candidates), agents, "--candidates", workflow)
        full = combinations(candidates, agents, default_model)
        base = complete(baseline, agents, default_model, "--baseline") if baseline else full[0]
        if baseline:
            check_agents(list(baseline), agents, "--baseline", workflow)
        if max_assignments is not None:
            kind, chosen = "budget", budget_order(candidates, agents, default_model, base)[:max_assignments]
        else:
            kind, chosen = "combinations", full
        possible = len(full)
    else:
        assert listed is not None
        if max_assignments is not None:
            raise UserError("--max-assignments bounds the combinations of --candidates; an --assignments file is "
                            "the design itself (list fewer entries)")
        chosen = []
        for i, entry in enumerate(listed, 1):
            where = f"{listed_from} entry {i}"
            check_agents(list(entry), agents, where, workflow)
            chosen.append(complete(entry, agents, default_model, where))
        repeated = len(chosen) - len(dedupe(chosen))
        if repeated:
            raise UserError(f"{listed_from}: {repeated} entr{'y repeats' if repeated == 1 else 'ies repeat'} an "
                            "earlier one (once each)")
        if baseline:
            check_agents(list(baseline), agents, "--baseline", workflow)
        base = complete(baseline, agents, default_model, "--baseline") if baseline else chosen[0]
        kind, possible = "listed", len(chosen)
        named = {a for entry in listed for a in entry}  # the agents the file varies: their models, in order
        candidates = {a: list(dict.fromkeys(x[a] for x in chosen)) for a in agents if a in named}
    if base not in chosen:
        chosen = [base, *chosen]
    return Design(workflow, agents, default_model, dict(candidates), kind, chosen, base, possible)


def run_names(assignments: Sequence[dict[str, str]]) -> list[str]:
    """One run directory name per assignment (``agents.assign.assignment_name``, e.g.
    ``solver=tiny-random_verifier=tiny-b``), stable across invocations; names that collide (two
    models with the same folder name) get a short hash of the assignment."""

    base = [assignment_name(a) for a in assignments]
    counts = Counter(base)
    out = []
    for name, a in zip(base, assignments):
        if counts[name] > 1:
            name += "-" + hashlib.sha256(json.dumps(a, sort_keys=True).encode()).hexdigest()[:8]
        out.append(name)
    return out


def label(assignment: dict[str, str]) -> str:
    """A short readable label: ``solver=tiny-random, verifier=tiny-b``."""

    return ", ".join(f"{a}={short_model_name(m)}" for a, m in assignment.items())


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
