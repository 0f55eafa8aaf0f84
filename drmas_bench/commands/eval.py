"""`drmas-bench eval`: flags -> ``EvalConfig`` -> ``drmas_bench.api.evaluate`` (the library entry
point, which holds every check and the run itself); prints the summary's Markdown."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from drmas_bench.engines import ENGINES
from drmas_bench.grading.graders import DEFAULT_GRADER, GRADERS
from drmas_bench.schema import EVAL_DEFAULTS
from drmas_bench.suites.registry import get_suite, suite_names
from drmas_bench.workflows import workflow_names

EPILOG = """examples:
  drmas-bench eval --model smollm2-135m-instruct --suite toy --n 4
  drmas-bench eval --model smollm2-135m-instruct --suite math --benchmarks aime24 --n 2 --limit 5 --max-new-tokens 256
  drmas-bench eval --model smollm2-135m-instruct --suite search --benchmarks hotpotqa --n 2 --limit 5
  drmas-bench eval --model-for verifier=Qwen/Qwen2.5-7B-Instruct --model-for searcher=meta-llama/Llama-3.2-3B-Instruct \\
      --model-for answerer=meta-llama/Llama-3.2-3B-Instruct --suite search --engine openai --base-url http://127.0.0.1:30000/v1
  drmas-bench eval --model runs/tiny/ckpt/latest --suite toy      # a trained team (its team.yaml)
  drmas-bench eval --model M --suite search --prompts my_prompts.yaml --max-prompt-tokens 8192
  drmas-bench eval --model /shared/ckpt/run1/latest --suite math --pool ray --ray-address HEAD:6379   # a Ray cluster (docs/scaling.md)
  drmas-bench eval --model s3://bucket/run1/latest --suite math   # a checkpoint under an fsspec URL root (fetched first)
  drmas-bench eval --model s3://bucket/run1/latest --suite math --dry-run   # what would be fetched, merged, built; no run
  drmas-bench eval --model M --suite search --workers 4           # the episodes over 4 processes (--pool ray: Ray actors)
  drmas-bench eval --team team.yaml --suite search --prices prices.yaml --max-usd 5 --max-tokens 2000000
      # stops cleanly at $5 or 2M tokens (exit 3, finished samples kept); the same command with a higher limit resumes

Re-running the same command resumes: finished (benchmark, task, sample) keys are skipped.

Explicit flags win over a team file (or a checkpoint's team.yaml), which wins over the defaults.
Python: `from drmas_bench import evaluate, EvalConfig` (docs/eval.md).
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a team of agents on benchmarks (resumable)", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_eval_flags(p)
    p.add_argument("--dry-run", action="store_true",
                   help="plan only: print what the run would fetch, merge or build first (source, destination, "
                        "size) and where it would write, then exit; nothing is downloaded or written")
    p.set_defaults(func=cmd_eval)


# the flags a command built on eval (sweep) may leave out: it sets them itself per run
TEAM_FLAGS = ("model_for", "team", "compute_matched")
RUN_DIR_FLAGS = ("out", "fresh")


def add_eval_flags(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Every `eval` flag on parser ``p`` (one definition for `eval` and the commands that run evals
    the same way), but the flags whose dest is in ``skip`` (``TEAM_FLAGS``, ``RUN_DIR_FLAGS``)."""
    for add in (_team_flags, _benchmark_flags, _sampling_flags, _search_flags, _run_flags, _limit_flags):
        add(p, skip)


def _team_flags(p: argparse.ArgumentParser, skip: tuple[str, ...]) -> None:
    """The `eval` flags of the team: models, engines, workflow, prompts."""
    g = p.add_argument_group("team")
    g.add_argument("--model", help="model for every agent: alias (smollm2-135m-instruct, tiny-random), local dir, "
                                   "hub id, a checkpoint dir holding team.yaml, or a checkpoint URL (s3://bucket/run1/latest: "
                                   "downloaded to the cache first; docs/scaling.md)")
    if "model_for" not in skip:
        g.add_argument("--model-for", action="append", metavar="AGENT=MODEL", help="give one agent its own model (repeatable)")
    if "team" not in skip:
        g.add_argument("--team", help="team YAML file (keys: `drmas-bench config-schema team`, docs/teams.md)")
    g.add_argument("--engine", choices=list(ENGINES), help="engine of every worker group (default hf; with a team file: its own)")
    g.add_argument("--base-url", help="OpenAI-compatible server URL for --engine openai")
    g.add_argument("--tokenizer", help="--engine openai with --model/--model-for: a local tokenizer (folder, alias, cached hub id) to template "
                                       "and cut prompts here (default: the model's own when it is on this machine)")
    g.add_argument("--engine-args", "--model-args", dest="engine_args", metavar="K=V,...", type=_engine_args,
                   help="engine options for every worker group whose engine has them, e.g. dtype=bfloat16,device=cuda:1 "
                        "or mem_fraction_static=0.7 (values read as YAML; see docs/engines.md); win over a team file's options")
    g.add_argument("--workflow", help="workflow name, one of " + ", ".join(workflow_names()) + " (default: the team "
                   "file's, else the suite's: " + ", ".join(f"{s} {get_suite(s).workflow}" for s in suite_names()) + ")")
    if "compute_matched" not in skip:
        g.add_argument("--compute-matched", metavar="TEAM_RUN",
                       help="single-agent workflows: give the agent the team run's measured tokens per question "
                            "(n_team x k samples, k = team tokens / single tokens; scored by majority vote; docs/eval.md)")
    g.add_argument("--prompts", metavar="FILE", help="prompt templates YAML replacing the packaged ones (all or some "
                                                     "roles; keys: `drmas-bench config-schema prompts`, docs/protocol.md); "
                                                     "overrides a team file's prompts")
    g.add_argument("--max-prompt-tokens", type=int, metavar="N",
                   help="prompt-length limit in tokens, 0 = none (default: math 8192 cut in the middle, "
                        "search 4096 cut from the left, as the reference)")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run Python files shipped inside the model folders (hf, sglang); "
                        "off by default, and a checkpoint's team.yaml cannot turn it on (docs/security.md)")


def _benchmark_flags(p: argparse.ArgumentParser, skip: tuple[str, ...]) -> None:
    """The `eval` flags of the benchmarks and the grader."""
    g = p.add_argument_group("benchmarks")
    g.add_argument("--suite", choices=suite_names(), help="benchmark suite")
    g.add_argument("--benchmarks", help="comma-separated benchmark names (default: the whole suite)")
    g.add_argument("--data-dir", help="local benchmark files (default: $DRMAS_DATA_DIR, else the hub)")
    g.add_argument("--limit", type=int, help="first N questions per benchmark (quick sets: 30)")
    g.add_argument("--n", type=int, default=EVAL_DEFAULTS["n"], help=f"samples per question (default {EVAL_DEFAULTS['n']})")
    g.add_argument("--grader", metavar="{" + ",".join(GRADERS) + "}",
                   help=f"math grader (default {DEFAULT_GRADER}; reference_compat: the reference's rules, "
                        "flaws included; see docs/grading.md). Its name and version enter the run identity")


def _sampling_flags(p: argparse.ArgumentParser, skip: tuple[str, ...]) -> None:
    """The `eval` flags of sampling."""
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, help=f"default: the team file's, else {EVAL_DEFAULTS['temperature']}")
    g.add_argument("--top-p", type=float, help=f"default: the team file's, else {EVAL_DEFAULTS['top_p']}")
    g.add_argument("--max-new-tokens", type=int, help="per call (default: the team file's, else the suite's: " + ", ".join(
        f"{s} {get_suite(s).max_new_tokens}" for s in suite_names()) + ")")
    g.add_argument("--seed", type=int, default=EVAL_DEFAULTS["seed"], help=f"run seed; each call's seed derives from it (default {EVAL_DEFAULTS['seed']})")
    g.add_argument("--enable-thinking", action="store_true", default=None,
                   help="chat template with thinking on (Qwen3 enable_thinking=True); default off, as the reference")


def _search_flags(p: argparse.ArgumentParser, skip: tuple[str, ...]) -> None:
    """The `eval` flags of the retriever."""
    g = p.add_argument_group("search")
    g.add_argument("--retriever", help="bm25:DIR | lucene:DIR | dense:DIR | http://HOST:PORT (default: an in-process BM25 "
                                       "index of <data dir>/corpus/mini_corpus.jsonl, built once and cached)")


def _run_flags(p: argparse.ArgumentParser, skip: tuple[str, ...]) -> None:
    """The `eval` flags of the run: where, pool, cache, progress."""
    g = p.add_argument_group("run")
    if "out" not in skip:
        g.add_argument("--out", "--output-dir", dest="out", help="run directory (default: runs/<suite>-<model>-<config hash>)")
    if "fresh" not in skip:
        g.add_argument("--fresh", action="store_true", help="discard an existing run in --out instead of resuming")
    g.add_argument("--prices", help="price sheet YAML for $ columns (keys: `drmas-bench config-schema prices`, docs/pricing.md)")
    g.add_argument("--concurrency", type=int, default=EVAL_DEFAULTS["concurrency"], help=f"episodes in flight (default {EVAL_DEFAULTS['concurrency']})")
    g.add_argument("--max-batch", type=int, help=f"engine micro-batch size (default {EVAL_DEFAULTS['max_batch']}; a team file's own)")
    g.add_argument("--pool", default=EVAL_DEFAULTS["pool"], choices=["local", "ray"],
                   help="where worker groups live: in-process (default) or Ray actors on a GPU pool")
    g.add_argument("--pool-budget", type=float, metavar="N_MODELS",
                   help="memory budget in models (e.g. 1: only one worker group awake at a time); default unlimited")
    g.add_argument("--ray-address", metavar="ADDR",
                   help="--pool ray: attach to this Ray cluster (auto, host:port, ray://host:port); default "
                        "$RAY_ADDRESS, else a local Ray is started. The code is shipped (docs/scaling.md)")
    g.add_argument("--workers", type=int, default=EVAL_DEFAULTS["workers"], metavar="N",
                   help="split the episodes over N worker processes, each with its own engines and retriever (a model "
                        "per worker, as one process per GPU); with --pool ray, N Ray actors (one GPU each where the "
                        "cluster has GPUs; --ray-address for a cluster). One run directory, written here; results "
                        "as with one process; --concurrency is per worker. Not part of the run's identity: a run "
                        f"resumes with any N (default {EVAL_DEFAULTS['workers']}; docs/eval.md)")
    g.add_argument("--cache", metavar="DIR",
                   help="call cache: reuse a completion when the call is the same (model content, engine options, prompt, "
                        "sampling, seed, sample index); DIR/calls.sqlite3 is shared safely by concurrent evals. Off by "
                        "default (a team file's cache:); not part of the run's identity (docs/sweep.md)")
    g.add_argument("--flush-every", type=int, default=EVAL_DEFAULTS["flush_every"],
                   help=f"append finished trajectories to disk in batches of N (default {EVAL_DEFAULTS['flush_every']})")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _limit_flags(p: argparse.ArgumentParser, skip: tuple[str, ...]) -> None:
    """The `eval` flags of the spending limits."""
    g = p.add_argument_group("limits", "the run stops cleanly at the first limit reached: finished samples and the summary "
                             "are written, exit code 3. Not part of the run's identity: the same command with a higher "
                             "limit resumes. Per agent: agents.NAME.limits in a team file (docs/eval.md)")
    g.add_argument("--max-usd", type=float, metavar="USD",
                   help="stop once the run's calls cost this many dollars under --prices (needs it); "
                        "a resumed run counts what its kept samples cost")
    g.add_argument("--max-tokens", type=int, metavar="N",
                   help="stop once the run's calls used N prompt + completion tokens in all (per call: "
                        "--max-new-tokens); calls served by --cache are free")


def _engine_args(text: str) -> dict:
    """argparse type of --engine-args: ``K=V,...`` -> dict (a mistake is argparse's one-line error)."""
    from drmas_bench.api import parse_engine_args
    from drmas_bench.types import UserError

    try:
        return parse_engine_args(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def config_from_args(args: argparse.Namespace):
    """Parsed flags -> EvalConfig: each field from the flag of the same name (None = not given);
    ``--no-progress`` -> ``progress``, the command line -> ``argv``."""
    from drmas_bench.api import EvalConfig

    given = {f.name: getattr(args, f.name) for f in fields(EvalConfig) if hasattr(args, f.name)}
    given["progress"] = not getattr(args, "no_progress", False)
    given["argv"] = list(getattr(args, "argv", None) or sys.argv)  # cli.main sets args.argv
    return EvalConfig(**given)


def resolve_config(args: argparse.Namespace):
    """Flags -> (suite, benchmarks, workflow, team, sampling), as ``evaluate`` resolves them."""
    from drmas_bench.api import resolve

    r = resolve(config_from_args(args))
    return r.suite, r.benches, r.wf, r.team, r.sampling


def dry_run(config) -> str:
    """``eval --dry-run``'s text: the steps the run would perform first, else what it would run."""
    from drmas_bench.api import Pending, plan

    p = plan(config)
    if isinstance(p, Pending):
        return "\n".join(["the run would first:", *(f"  {s.describe()}" for s in p.todo),
                          "then plan again (the checkpoint's team file names the rest)"])
    done = [f"  {s.describe()}" for s in p.resolved.prepared]
    return "\n".join([*(["prepared already:", *done] if done else []), "nothing to fetch, merge or build",
                      f"would run {len(p.tasks)} questions x {p.cfg.n} samples, workflow {p.wf.name}, into {p.out}"])


def cmd_eval(args: argparse.Namespace) -> int:
    from drmas_bench.api import evaluate

    if getattr(args, "dry_run", False):
        print(dry_run(config_from_args(args)))
        return 0

    if getattr(args, "compute_matched", None):
        from drmas_bench.api import evaluate_compute_matched
        from drmas_bench.report.compute_matched import matched_line

        summary, doc = evaluate_compute_matched(config_from_args(args), args.compute_matched)
        print(summary.markdown)
        print(f"\n- {matched_line(doc)}")
        return 0
    from drmas_bench.limits import LimitReached

    try:
        print(evaluate(config_from_args(args)).markdown)
    except LimitReached as e:  # the finished samples' summary, then the CLI's one line and exit code
        if e.summary is not None:
            print(e.summary.markdown)
        raise
    return 0
