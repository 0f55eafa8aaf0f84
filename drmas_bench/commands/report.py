"""`drmas-bench leaderboard | compare | cost`: tables, paired comparisons and cost studies over run dirs.

The numbers are recomputed from each run's samples.jsonl (see drmas_bench/report/,
docs/leaderboards.md and docs/cost.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import yaml

from drmas_bench.engines import DEFAULT_ENGINE, ENGINES
from drmas_bench.schema import EVAL_DEFAULTS
from drmas_bench.suites.registry import suite_names
from drmas_bench.types import UserError

logger = logging.getLogger(__name__)

LEADERBOARD_EPILOG = """examples:
  drmas-bench leaderboard runs/toy-a runs/toy-b runs/toy-c
  drmas-bench leaderboard runs/ --metric avg@16,pass@16 --ci --out leaderboards/math-qwen3-8b
  drmas-bench leaderboard runs/math-* --metric pass@1,pass@8 --no-paper
  drmas-bench leaderboard runs/math-* --metric pass@4,pass^4 --ci   # coverage and reliability at k = 4

Writes (with --out DIR): DIR/leaderboard.md (every table), DIR/leaderboard.html (the same tables as one
page: sortable columns, the flagged rows marked, a Pareto plot per suite), DIR/<suite>.csv (one line per
metric and run, values in %) and DIR/<suite>_long.csv (one line per run, benchmark and metric: run,
benchmark, metric, value, ci_lo, ci_hi).
Rows marked [paper] come from leaderboards/reference/paper.yaml: reported in the paper, not reproduced.
"""

COMPARE_EPILOG = """examples:
  drmas-bench compare runs/math-grpo runs/math-drmas
  drmas-bench compare runs/toy-a runs/toy-b --out reports/a-vs-b.md --n-boot 5000 --seed 1

Differences are B - A on the questions both runs answered (same benchmark and task id).
"""

COST_EPILOG = """examples:
  # existing runs, priced with a sheet
  drmas-bench cost --runs runs/search-7b runs/search-hetero --prices my-prices.yaml --out reports/hetero
  # run each team (eval, resumable) and compare
  drmas-bench cost --team examples/teams/toy-smollm2.yaml --team examples/teams/toy-hetero.yaml \\
      --suite toy --limit 16 --n 4 --max-new-tokens 24 --prices leaderboards/prices.example.yaml --out reports/toy-cost
  # the run dirs of a sweep (drmas-bench sweep), read from its sweep.json instead of running again
  drmas-bench cost --sweep studies/search-sweep --prices my-prices.yaml --out studies/search-sweep/cost
  # every assignment of two models to the search agents: write the team files (add --suite ... to run them too)
  drmas-bench cost --assign verifier,searcher,answerer --models Qwen/Qwen2.5-7B-Instruct,meta-llama/Llama-3.2-3B-Instruct \\
      --out studies/which-agent-gets-7b

Writes (with --out DIR): DIR/cost.md, DIR/cost.csv, DIR/cost.json, DIR/pareto.png; team mode puts the
run dirs in DIR/runs/<team file name>, --assign puts the team files in DIR/teams/.
"""


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `leaderboard`, `compare` and `cost` sub-commands."""
    for add in (_leaderboard_parser, _compare_parser, _cost_parser):
        add(sub, argparse.RawDescriptionHelpFormatter)


def _leaderboard_parser(sub: argparse._SubParsersAction, fmt: Any) -> None:
    p = sub.add_parser("leaderboard", help="tables of runs per suite (Markdown + CSV), with the paper's reported rows",
                       epilog=LEADERBOARD_EPILOG, formatter_class=fmt)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (or folders holding run directories)")
    p.add_argument("--metric", default="avg@n,pass@n",
                   help="comma-separated avg@K / pass@K / pass^K, K an integer or n (default avg@n,pass@n). avg@K "
                        "needs n == K (else avg@n is shown and flagged); pass@K (at least one of K succeeds) and pass^K "
                        "(all K succeed) need K <= n (unbiased estimators)")
    p.add_argument("--out", help="folder for leaderboard.md, leaderboard.html, <suite>.csv and <suite>_long.csv "
                                 "(default: print only)")
    p.add_argument("--ci", action="store_true", help="add 95%% bootstrap CIs over questions")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for --ci (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--paper", help="reported rows file (default: leaderboards/reference/paper.yaml)")
    p.add_argument("--no-paper", action="store_true", help="leave out the paper's reported rows")
    p.set_defaults(func=cmd_leaderboard)


def _compare_parser(sub: argparse._SubParsersAction, fmt: Any) -> None:
    p = sub.add_parser("compare", help="paired comparison of two runs on their shared questions",
                       epilog=COMPARE_EPILOG, formatter_class=fmt)
    p.add_argument("run_a", metavar="RUN_A", help="the baseline run directory")
    p.add_argument("run_b", metavar="RUN_B", help="the run compared against it")
    p.add_argument("--out", help="also write the Markdown to this file")
    p.add_argument("--n-boot", type=int, default=2000, help="paired bootstrap resamples (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--max-flips", type=int, default=50, help="flipped questions listed at most (default 50)")
    p.set_defaults(func=cmd_compare)


def _cost_parser(sub: argparse._SubParsersAction, fmt: Any) -> None:
    p = sub.add_parser("cost", help="accuracy / latency / tokens / $ per team, per-agent breakdowns, Pareto plot",
                       epilog=COST_EPILOG, formatter_class=fmt)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--runs", nargs="+", metavar="RUN_DIR", help="existing run directories (the first is the baseline)")
    mode.add_argument("--team", action="append", metavar="FILE", help="team YAML to evaluate (repeatable; the first is the baseline)")
    mode.add_argument("--sweep", metavar="SWEEP_DIR", help="the run dirs of a finished `drmas-bench sweep` (its sweep.json; "
                                                           "the baseline first; cached calls at their original $ and latency)")
    mode.add_argument("--assign", metavar="AGENTS", help="comma-separated agents: write a team file for every assignment "
                                                         "of --models to them (and run them with --suite)")
    p.add_argument("--models", help="with --assign: comma-separated models (aliases, dirs or hub ids)")
    p.add_argument("--prices", help="price sheet YAML (docs/pricing.md); required to report costs")
    p.add_argument("--out", help="output folder (required with --team / --assign; else print only)")
    p.add_argument("--labels", help="comma-separated team labels (default: team file stems / run dir names)")
    g = p.add_argument_group("evaluation (with --team, or --assign plus --suite; as `drmas-bench eval`'s flags, "
                             "through drmas_bench.evaluate)")
    g.add_argument("--suite", choices=suite_names(), help="benchmark suite")
    g.add_argument("--benchmarks", help="comma-separated benchmark names (default: the whole suite)")
    g.add_argument("--data-dir", help="local benchmark files (default: $DRMAS_DATA_DIR, else the hub)")
    g.add_argument("--limit", type=int, help="first N questions per benchmark")
    g.add_argument("--n", type=int, default=EVAL_DEFAULTS["n"], help=f"samples per question (default {EVAL_DEFAULTS['n']})")
    g.add_argument("--temperature", type=float, help=f"default: the team file's, else {EVAL_DEFAULTS['temperature']}")
    g.add_argument("--top-p", type=float, help=f"default: the team file's, else {EVAL_DEFAULTS['top_p']}")
    g.add_argument("--max-new-tokens", type=int, help="per call (default: the team file's, else the suite's)")
    g.add_argument("--seed", type=int, default=EVAL_DEFAULTS["seed"], help=f"run seed (default {EVAL_DEFAULTS['seed']})")
    g.add_argument("--retriever", help="search suite retriever (see `drmas-bench eval --help`)")
    g.add_argument("--concurrency", type=int, default=EVAL_DEFAULTS["concurrency"],
                   help=f"episodes in flight (default {EVAL_DEFAULTS['concurrency']})")
    g.add_argument("--workflow", help="--assign: the workflow of the agents (default: the one whose agents match)")
    g.add_argument("--engine", default=DEFAULT_ENGINE, choices=list(ENGINES),
                   help=f"--assign: engine of every worker group (default {DEFAULT_ENGINE})")
    g.add_argument("--base-url", help="--assign: OpenAI-compatible server URL for --engine openai")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_cost)


# ================================================================================ leaderboard


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from drmas_bench import report
    from drmas_bench.report.leaderboard import open_runs

    metrics = report.parse_metrics(args.metric)
    if args.n_boot < 1:
        raise UserError("--n-boot must be at least 1")
    # each run read once into its per-question digest, a compact line at a time: no record is held
    runs = open_runs(args.runs)
    paper = None if args.no_paper else report.load_paper(args.paper, required=bool(args.paper))
    tables = report.build_leaderboard(runs, metrics, ci=args.ci, paper=paper, n_boot=args.n_boot, seed=args.seed)
    md = report.leaderboard_markdown(tables, ci=args.ci)
    if not args.no_paper and paper is None:
        md += "\n- paper rows left out: leaderboards/reference/paper.yaml not found (pass --paper FILE)\n"
    # a suite names a CSV file but comes from a run's config.yaml (data): checked before any output
    csv_paths = report.suite_csv_paths(args.out, tables, runs) if args.out else {}
    print(md)
    if args.out:
        from drmas_bench.files import atomic_write

        out = Path(args.out)
        atomic_write(out / "leaderboard.md", md)
        from drmas_bench.report.pages import write_leaderboard_html

        notes = [] if args.no_paper or paper is not None else ["paper rows left out: leaderboards/reference/paper.yaml "
                                                               "not found (pass --paper FILE)"]
        written = [out / "leaderboard.md", write_leaderboard_html(out / "leaderboard.html", tables, runs, args.ci, notes)]
        for suite, path in csv_paths.items():
            suite_tables = [t for t in tables if t.suite == suite]
            atomic_write(path, report.tables_csv(suite_tables, ci=args.ci))
            atomic_write(report.long_csv_path(path), report.tables_long_csv(suite_tables))
            written += [path, report.long_csv_path(path)]
        logger.info(f"[leaderboard] wrote {', '.join(map(str, written))}")
    return 0


# ==================================================================================== compare


def cmd_compare(args: argparse.Namespace) -> int:
    from drmas_bench import report

    if args.n_boot < 1:
        raise UserError("--n-boot must be at least 1")
    a, b = report.load_run(args.run_a), report.load_run(args.run_b)
    if a.name == b.name:
        a.name, b.name = str(a.path), str(b.path)
    md = report.compare_markdown(report.compare_runs(a, b, n_boot=args.n_boot, seed=args.seed), max_flips=args.max_flips)
    print(md)
    if args.out:
        from drmas_bench.files import atomic_write

        atomic_write(Path(args.out), md)
        logger.info(f"[compare] wrote {args.out}")
    return 0


# ======================================================================================= cost


def _split(text: str | None, what: str) -> list[str]:
    items = [x.strip() for x in (text or "").split(",") if x.strip()]
    if not items:
        raise UserError(f"{what}: expected a comma-separated list")
    return items


def eval_config(team_file: Path, out: Path, args: argparse.Namespace):
    """The EvalConfig of one team of a study: the study's evaluation flags, the team file, its run dir."""
    from drmas_bench.api import EvalConfig

    return EvalConfig(team=str(team_file), suite=args.suite, benchmarks=args.benchmarks, data_dir=args.data_dir,
                      limit=args.limit, n=args.n, temperature=args.temperature, top_p=args.top_p,
                      max_new_tokens=args.max_new_tokens, seed=args.seed, retriever=args.retriever,
                      concurrency=args.concurrency, out=str(out), progress=not args.no_progress,
                      argv=list(getattr(args, "argv", None) or sys.argv))


def _check_team_prices(team_file: Path, prices) -> None:
    """Fail before any evaluation on a team file whose models the price sheet lacks."""
    try:
        d = yaml.safe_load(team_file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"team file {team_file}: {str(e).splitlines()[0]}") from None
    groups = (d or {}).get("worker_groups") if isinstance(d, dict) else None
    if not isinstance(groups, dict) or not groups:
        raise UserError(f"team file {team_file}: no `worker_groups`")
    for name, g in groups.items():
        g = {"model": g} if isinstance(g, str) else (g or {})
        key = g.get("price") or Path(str(g.get("model", name)).rstrip("/")).name
        prices.cost(str(key), 0, 0)


def run_teams(team_files: list[Path], args: argparse.Namespace, out: Path) -> list[Path]:
    """Evaluate each team into out/runs/<stem> (resumable) with ``evaluate()``; returns the run dirs."""
    from drmas_bench.api import evaluate

    run_dirs, used = [], set()
    for f in team_files:
        name = f.stem
        while name in used:
            name += "_"
        used.add(name)
        run_dir = out / "runs" / name
        logger.info(f"[cost] evaluating team {f} -> {run_dir}")
        summary = evaluate(eval_config(f, run_dir, args))
        logger.info(summary.markdown)  # stdout is the study
        run_dirs.append(run_dir)
    return run_dirs


def _cost_team_files(args: argparse.Namespace, out: Path | None) -> list[Path] | None:
    """The team files `cost` evaluates: written for every assignment (``--assign``; None when no
    ``--suite`` asks to run them), given (``--team``, checked), or none (``--runs``, ``--sweep``)."""
    from drmas_bench import report

    if args.assign:
        if not out:
            raise UserError("--assign needs --out DIR (the team files go to DIR/teams)")
        agents, models = _split(args.assign, "--assign"), _split(args.models, "--models")
        files = report.write_assignment_teams(agents, models, out / "teams", workflow=args.workflow,
                                              engine=args.engine, base_url=args.base_url)
        logger.info(f"[cost] wrote {len(files)} team files ({len(models)} models ^ {len(agents)} agents) to {out / 'teams'}")
        for f in files:
            print(f)
        if not args.suite:
            logger.info(f"[cost] run the study with: drmas-bench cost --team {out / 'teams'}/*.yaml --suite SUITE "
                        f"--prices PRICES --out {out}  (or add --suite to this command)")
            return None
        return files
    if not args.team:
        return []
    team_files = [Path(t) for t in args.team]
    for f in team_files:
        if not f.is_file():
            raise UserError(f"team file {f} not found")
    if not args.suite:
        raise UserError("--team needs --suite (the teams are evaluated first)")
    if not out:
        raise UserError("--team needs --out DIR (the run dirs go to DIR/runs)")
    return team_files


def cmd_cost(args: argparse.Namespace) -> int:
    from drmas_bench import report

    out = Path(args.out) if args.out else None
    team_files = _cost_team_files(args, out)
    if team_files is None:  # --assign without --suite: the team files are written, nothing runs
        return 0
    if args.models and not args.assign:
        raise UserError("--models goes with --assign")
    if not args.prices:
        raise UserError("pass --prices FILE (a price sheet, see docs/pricing.md); leaderboards/prices.example.yaml "
                        "is an illustrative one")
    from drmas_bench.pricing import load_prices

    prices = load_prices(args.prices)
    if team_files:
        if args.n < 1:
            raise UserError("--n must be at least 1")
        for f in team_files:
            _check_team_prices(f, prices)
        run_dirs = run_teams(team_files, args, out)
        default_labels = [d.name for d in run_dirs]
    elif args.sweep:
        run_dirs, default_labels = sweep_runs(args.sweep)
    else:
        run_dirs = given_run_dirs(args.runs)
        default_labels = None
    labels = _split(args.labels, "--labels") if args.labels else default_labels
    runs, labels = load_finished_runs(run_dirs, labels)
    costs = report.cost_study(runs, prices, labels, as_alone=bool(args.sweep))
    md = report.cost_markdown(costs, prices_source=f"the price sheet {args.prices}", unpriced=prices.unpriced)
    print(md)
    if out:
        from drmas_bench.files import atomic_write

        atomic_write(out / "cost.md", md)
        atomic_write(out / "cost.csv", report.cost_csv(costs))
        atomic_write(out / "cost.json", json.dumps(cost_json(costs, args.prices), indent=2))
        suite = ", ".join(dict.fromkeys(c.run.suite for c in costs))
        png = report.plot_pareto(costs, out / "pareto.png", prices_source=Path(args.prices).name,
                                 title=f"Cost study ({suite} suite): accuracy vs cost and latency; up and left is better")
        logger.info(f"[cost] wrote {out / 'cost.md'}, cost.csv, cost.json and {png}")
    return 0


def given_run_dirs(paths: list[str]) -> list[Path]:
    """The run dirs of ``--runs``: each argument a run dir or a folder of them; an empty folder (a
    study's runs/ before anything ran) is skipped with a warning."""
    from drmas_bench import report

    out = []
    for a in paths:
        p = Path(a)
        if p.is_dir() and not any(p.iterdir()):
            logger.warning(f"[cost] warning: skipping {p}: an empty folder (no run directory in it yet)")
            continue
        out.extend(report.expand_run_dirs([p]))
    return out


def load_finished_runs(run_dirs: list[Path], labels: list[str] | None) -> tuple[list, list[str] | None]:
    """The runs of ``run_dirs`` that hold finished samples, and their labels; a run dir started but
    stopped before its first sample is skipped with a warning (as `leaderboard` does). None left is
    a UserError."""
    from drmas_bench import report
    from drmas_bench.report.runs import NoSamples

    if labels is not None and len(labels) != len(run_dirs):
        raise UserError(f"--labels: {len(labels)} labels for {len(run_dirs)} runs")
    runs, kept = [], []
    for i, d in enumerate(run_dirs):
        try:
            runs.append(report.load_run(d))
        except NoSamples:
            logger.warning(f"[cost] warning: skipping {d}: the run has no finished samples yet")
            continue
        kept.append(i)
    if not runs:
        raise UserError(f"cost: none of the {len(run_dirs)} run directories holds finished samples yet"
                        if run_dirs else "cost: no run directory to read (every folder given is empty)")
    return runs, None if labels is None else [labels[i] for i in kept]


def sweep_runs(sweep_dir: str) -> tuple[list[Path], list[str]]:
    """A sweep's run dirs (the baseline first, then the sweep's order) and labels, from its sweep.json;
    a run dir recorded relative to another working directory is found under SWEEP_DIR/runs/."""
    from drmas_bench.sweep import read_sweep

    doc = read_sweep(sweep_dir)
    entries = sorted(doc["assignments"], key=lambda a: not a.get("baseline"))
    if not entries:
        raise UserError(f"{sweep_dir}: the sweep has no finished assignment yet")
    dirs = []
    for a in entries:
        d = Path(a["run"])
        dirs.append(d if d.is_dir() else Path(sweep_dir) / "runs" / d.name)
    return dirs, [str(a.get("label") or Path(a["run"]).name) for a in entries]


def cost_json(costs, prices_path: str) -> dict:
    """The study's raw numbers (floats; dollars are the exact per-agent sums rounded once)."""
    return {
        "prices": str(prices_path),
        "teams": [{
            "label": c.label, "run": str(c.run.path), "model": c.run.model_label, "team": c.run.team_label,
            "questions": c.questions, "n": c.run.n, "trajectories": c.trajectories, "avg_at_n": c.avg,
            "pass_at_n": c.pass_n, "latency_p50_s": c.latency_p50, "latency_p95_s": c.latency_p95,
            "call_latency_mean_s": c.call_latency_mean, "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens, "usd": None if c.unknown_calls else float(c.usd),
            "usd_per_1k_questions": c.usd_per_1k, "usage_unknown_calls": c.unknown_calls,  # null dollars = unknown
            "agents": {a: {"priced_as": ac.price_keys, "calls": ac.calls, "prompt_tokens": ac.prompt_tokens,
                           "completion_tokens": ac.completion_tokens, "usd": float(ac.usd) if ac.known else None,
                           "usd_per_1k_questions": c.agent_usd_per_1k(a), "usage_unknown_calls": ac.unknown_calls}
                       for a, ac in c.agents.items()},
        } for c in costs],
    }
