"""`drmas-bench sweep`: flags -> a sweep design (``drmas_bench.sweep_design.design``, checked before anything
loads) -> one eval per assignment (``drmas_bench.sweep.run_sweep``) -> sweep.json, sweep.md,
pareto.png; prints the table."""

from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)

EPILOG = """examples:
  # every combination of two models for the solver and the verifier (4 assignments), through one call cache
  drmas-bench sweep --suite math --benchmarks math500 --limit 30 --n 4 --model tiny-random \\
      --candidates solver=Qwen/Qwen2.5-7B-Instruct,Qwen/Qwen2.5-3B-Instruct \\
      --candidates verifier=Qwen/Qwen2.5-7B-Instruct,Qwen/Qwen2.5-3B-Instruct \\
      --cache studies/cache --prices my-prices.yaml --out studies/math-sweep
  drmas-bench sweep ... --plan                        # print the assignments, run nothing
  drmas-bench sweep ... --max-assignments 5           # a budget: the baseline, its single swaps, then the rest
  drmas-bench sweep --suite search --model M --assignments picks.yaml --out studies/s   # a listed set
  drmas-bench cost --sweep studies/math-sweep --prices my-prices.yaml                  # the cost study of it

Designs:
  every combination (default): the product of each --candidates list (agents not named keep --model);
  --assignments FILE: a YAML/JSON list of {agent: model} mappings, run in the file's order;
  --max-assignments K: the first K of this order: the baseline (every difference is against it),
    then each single-agent swap from it (the workflow's agent order, each agent's candidates in
    order: the cheapest "what does this agent's model do?" questions), then the remaining
    combinations in the default order.
The baseline (--baseline AGENT=M,..., default the first assignment) always runs, first if the
design lacks it. One seed schedule (--seed) for all assignments, so differences are paired per
question. Each assignment is a normal run dir OUT/runs/<assignment> (`view`, `compare`, `report`
read it); re-running the same command continues a stopped sweep: finished assignments are kept,
a half-run one resumes. Writes OUT/sweep.json, OUT/sweep.md and OUT/pareto.png (docs/sweep.md).
"""


def register(sub: argparse._SubParsersAction) -> None:
    from drmas_bench.commands.eval import RUN_DIR_FLAGS, TEAM_FLAGS, add_eval_flags

    p = sub.add_parser("sweep", help="evaluate many agent -> model assignments on one suite (resumable, paired, "
                                     "through the call cache), with a Pareto table and plot",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("sweep")
    g.add_argument("--candidates", action="append", metavar="AGENT=M1,M2", default=None,
                   help="the models one agent is tried with (repeatable, one per agent); every combination runs "
                        "unless --max-assignments bounds it")
    g.add_argument("--assignments", metavar="FILE", help="instead of --candidates: a YAML/JSON list of {agent: model}")
    g.add_argument("--max-assignments", type=int, metavar="K",
                   help="run at most K assignments: the baseline, each single-agent swap from it, then the rest "
                        "of the combinations in order (see below)")
    g.add_argument("--baseline", metavar="AGENT=M,...", help="the assignment every difference is against "
                                                             "(default: the first; agents left out keep --model)")
    g.add_argument("--out", required=True, help="sweep folder: OUT/runs/<assignment>, OUT/sweep.json, sweep.md, pareto.png")
    g.add_argument("--plan", action="store_true", help="print the assignments and exit")
    g.add_argument("--n-boot", type=int, default=2000, help="paired bootstrap resamples of the differences (default 2000)")
    add_eval_flags(p, skip=TEAM_FLAGS + RUN_DIR_FLAGS)
    p.set_defaults(func=cmd_sweep)


def design_from_args(args: argparse.Namespace):
    """The flags' design (``drmas_bench.sweep_design.design``), checked against the suite's workflow."""
    from drmas_bench import sweep_design
    from drmas_bench.suites.registry import get_suite
    from drmas_bench.types import UserError
    from drmas_bench.workflows import get_workflow

    if not args.suite:
        raise UserError("sweep needs --suite (one suite, one seed schedule for every assignment)")
    wf = get_workflow(args.workflow or get_suite(args.suite).workflow)
    if args.candidates and args.assignments:
        raise UserError("pass --candidates or --assignments, not both")
    return sweep_design.design(
        wf.name, wf.agents, args.model,
        candidates=sweep_design.parse_candidates(args.candidates) if args.candidates else None,
        listed=sweep_design.read_assignments(args.assignments) if args.assignments else None,
        max_assignments=args.max_assignments,
        baseline=sweep_design.parse_assignment(args.baseline) if args.baseline else None,
        listed_from=args.assignments or "--assignments",
    )


def plan_text(d, names: list[str]) -> str:
    """`--plan`'s listing: one line per assignment, the baseline marked."""
    from drmas_bench.sweep_design import label

    lines = [f"{len(d.assignments)} assignments ({d.kind}; {d.possible} possible), workflow {d.workflow}:"]
    for i, (a, name) in enumerate(zip(d.assignments, names), 1):
        mark = "  [baseline]" if a == d.baseline else ""
        lines.append(f"{i:3d}. {label(a)}{mark}  -> runs/{name}")
    return "\n".join(lines)


def cmd_sweep(args: argparse.Namespace) -> int:
    from drmas_bench import sweep
    from drmas_bench.commands.eval import config_from_args
    from drmas_bench.report.markdown import sweep_markdown
    from drmas_bench.sweep_design import run_names
    from drmas_bench.types import UserError

    if args.n_boot < 1:
        raise UserError("--n-boot must be at least 1")
    d = design_from_args(args)
    if args.plan:
        print(plan_text(d, run_names(d.assignments)))
        return 0
    base = config_from_args(args)
    doc = sweep.run_sweep(base, d, args.out, n_boot=args.n_boot, boot_seed=0)
    print(sweep_markdown(doc))
    return 0
