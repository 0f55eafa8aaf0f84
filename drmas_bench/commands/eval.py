"""`drmas-bench eval`: run a team of agents over benchmarks, resumably, and summarise."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import math
import re
import sys
from pathlib import Path

from drmas_bench.grading.registry import DEFAULT_GRADER, GRADERS, get_grader
from drmas_bench.types import UserError

EPILOG = """examples:
  drmas-bench eval --model smollm2-135m-instruct --suite toy --n 4
  drmas-bench eval --model smollm2-135m-instruct --suite math --benchmarks aime24 --n 2 --limit 5 --max-new-tokens 256
  drmas-bench eval --model smollm2-135m-instruct --suite search --benchmarks hotpotqa --n 2 --limit 5
  drmas-bench eval --model-for verifier=Qwen/Qwen2.5-7B-Instruct --model-for searcher=meta-llama/Llama-3.2-3B-Instruct \\
      --model-for answerer=meta-llama/Llama-3.2-3B-Instruct --suite search --engine openai --base-url http://127.0.0.1:30000/v1
  drmas-bench eval --model runs/tiny/ckpt/latest --suite toy      # a trained team (its team.yaml)
  drmas-bench eval --model M --suite search --prompts my_prompts.yaml --max-prompt-tokens 8192

Re-running the same command resumes: finished (benchmark, task, sample) keys are skipped.
"""

# REFERENCE.md §3: max new tokens per call
DEFAULT_MAX_NEW = {"math": 4096, "search": 800, "toy": 32}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a team of agents on benchmarks (resumable)", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("team")
    g.add_argument("--model", help="model for every agent: alias (smollm2-135m-instruct, tiny-random), local dir, "
                                   "hub id, or a checkpoint dir holding team.yaml")
    g.add_argument("--model-for", action="append", metavar="AGENT=MODEL", help="give one agent its own model (repeatable)")
    g.add_argument("--team", help="team YAML file (see docs/teams.md)")
    g.add_argument("--engine", default="hf", choices=["hf", "openai", "sglang"], help="engine for --model/--model-for (default hf)")
    g.add_argument("--base-url", help="OpenAI-compatible server URL for --engine openai")
    g.add_argument("--tokenizer", help="--engine openai with --model/--model-for: a local tokenizer (folder, alias, cached hub id) to template "
                                       "and cut prompts here (default: the model's own when it is on this machine)")
    g.add_argument("--workflow", help="workflow name (default: the suite's: math_refine, search_route, toy)")
    g.add_argument("--prompts", metavar="FILE", help="prompt templates YAML replacing the packaged ones (all or some "
                                                     "roles; see docs/protocol.md); overrides a team file's prompts")
    g.add_argument("--max-prompt-tokens", type=int, metavar="N",
                   help="prompt-length limit in tokens, 0 = none (default: math 8192 cut in the middle, "
                        "search 4096 cut from the left, as the reference)")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run Python files shipped inside the model folders (hf, sglang); "
                        "off by default, and a checkpoint's team.yaml cannot turn it on (docs/security.md)")
    g = p.add_argument_group("benchmarks")
    g.add_argument("--suite", choices=["math", "search", "toy"], help="benchmark suite")
    g.add_argument("--benchmarks", help="comma-separated benchmark names (default: the whole suite)")
    g.add_argument("--data-dir", help="local benchmark files (default: $DRMAS_DATA_DIR, else the hub)")
    g.add_argument("--limit", type=int, help="first N questions per benchmark (quick sets: 30)")
    g.add_argument("--n", type=int, default=16, help="samples per question (default 16)")
    g.add_argument("--grader", metavar="{" + ",".join(GRADERS) + "}",
                   help=f"math grader (default {DEFAULT_GRADER}; reference_compat: the reference's rules, "
                        "flaws included; see docs/grading.md). Its name and version enter the run identity")
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.6, help="default 0.6")
    g.add_argument("--top-p", type=float, default=0.95, help="default 0.95")
    g.add_argument("--max-new-tokens", type=int, help="per call (default: math 4096, search 800, toy 32)")
    g.add_argument("--seed", type=int, default=0, help="run seed; each call's seed derives from it (default 0)")
    g.add_argument("--enable-thinking", action="store_true",
                   help="chat template with thinking on (Qwen3 enable_thinking=True); default off, as the reference")
    g = p.add_argument_group("search")
    g.add_argument("--retriever", help="bm25:DIR | dense:DIR | http://HOST:PORT (default: an in-process BM25 "
                                       "index of <data dir>/corpus/mini_corpus.jsonl, built once and cached)")
    g = p.add_argument_group("run")
    g.add_argument("--out", help="run directory (default: runs/<suite>-<model>-<config hash>)")
    g.add_argument("--fresh", action="store_true", help="discard an existing run in --out instead of resuming")
    g.add_argument("--prices", help="price sheet YAML for $ columns (see docs/pricing.md)")
    g.add_argument("--concurrency", type=int, default=256, help="episodes in flight (default 256)")
    g.add_argument("--max-batch", type=int, default=32, help="engine micro-batch size (default 32)")
    g.add_argument("--pool", default="local", choices=["local", "ray"],
                   help="where worker groups live: in-process (default) or Ray actors on a GPU pool")
    g.add_argument("--pool-budget", type=float, metavar="N_MODELS",
                   help="memory budget in models (e.g. 1: only one worker group awake at a time); default unlimited")
    g.add_argument("--flush-every", type=int, default=16, help="append finished trajectories to disk in batches of N (default 16)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)


def _default_retriever_spec(data_dir) -> str:
    """The embedded default: BM25 over the mini corpus, cached under the user cache dir."""
    from drmas_bench.models import cache_dir

    if data_dir is None or not (Path(data_dir) / "corpus" / "mini_corpus.jsonl").is_file():
        raise UserError("the search suite needs a retriever: pass --retriever bm25:DIR|dense:DIR|URL, "
                        "or a --data-dir holding corpus/mini_corpus.jsonl for the default BM25 index")
    out = cache_dir() / "indexes" / "mini_corpus-bm25"
    if not (out / "drmas_index.json").is_file():
        from drmas_retrieval import build_index

        print(f"[eval] building the default BM25 index of the mini corpus in {out}", file=sys.stderr)
        build_index("bm25", Path(data_dir) / "corpus" / "mini_corpus.jsonl", out)
    return f"bm25:{out}"


def resolve_config(args: argparse.Namespace):
    """Flags -> (benchmarks, workflow spec, team spec, sampling, identity config)."""
    from drmas_bench.agents.team import build_team
    from drmas_bench.pool.hosting import fit_options
    from drmas_bench.tasks import select_benchmarks
    from drmas_bench.types import Sampling
    from drmas_bench.workflows import SUITE_WORKFLOW, get_workflow

    benches = select_benchmarks(args.suite, args.benchmarks)
    suites = {b.suite for b in benches}
    if len(suites) > 1:
        raise UserError(f"one suite per run; the selection mixes {', '.join(sorted(suites))}")
    suite = suites.pop()
    wf_name = args.workflow or SUITE_WORKFLOW[suite]
    wf = get_workflow(wf_name)
    if args.tokenizer and args.engine != "openai":
        raise UserError("--tokenizer is for --engine openai (the other engines load the model's own tokenizer)")
    if not (args.model or args.model_for or args.team):
        raise UserError("choose a team: --model M, --model-for AGENT=M, or --team FILE")
    team = build_team(wf_name, wf.agents, model=args.model, team_file=args.team, model_for=args.model_for,
                      engine=args.engine, base_url=args.base_url,
                      engine_options=fit_options(args.engine, {"max_batch": args.max_batch},
                                                 {"tokenizer": args.tokenizer} if args.tokenizer else None),
                      trust_remote_code=getattr(args, "trust_remote_code", False))
    if team.workflow != wf_name:
        wf = get_workflow(team.workflow)
    check_workflow_options(team.workflow_options, wf)
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p,
                        max_new_tokens=args.max_new_tokens or DEFAULT_MAX_NEW[suite],
                        enable_thinking=args.enable_thinking)
    return suite, benches, wf, team, sampling


def resolve_protocol(args: argparse.Namespace, team, wf):
    """(templates or None, protocol options) for the run, checked before any model loads.
    Order: packaged templates < the team file's ``prompts:`` < ``--prompts``; the same for the
    prompt limit (team ``protocol:`` < ``--max-prompt-tokens``). Says so when a flag overrides
    what a team file (e.g. a trained checkpoint's team.yaml) recorded."""
    from drmas_bench.workflows import protocol as P

    prompts_flag = getattr(args, "prompts", None)
    limit_flag = getattr(args, "max_prompt_tokens", None)
    if not P.has_templates(wf.name):
        if prompts_flag or team.prompts:
            raise UserError(f"workflow {wf.name} has no prompt templates to replace (--prompts / prompts:)")
        return None, P.ProtocolOptions()
    if prompts_flag and team.prompts:
        print(f"[eval] --prompts {prompts_flag} overrides the prompts recorded in {team.prompts_source}", file=sys.stderr)
    tpl = P.load_templates(wf.name, (None if prompts_flag else team.prompts, team.prompts_source or "team file"),
                           (prompts_flag, prompts_flag or ""))
    opts = P.ProtocolOptions.from_dict(team.protocol, "team file")
    if limit_flag is not None:
        if limit_flag < 0:
            raise UserError("--max-prompt-tokens must be >= 0 (0 = no limit)")
        if opts.max_prompt_tokens is not None and opts.max_prompt_tokens != limit_flag:
            print(f"[eval] --max-prompt-tokens {limit_flag} overrides the team file's {opts.max_prompt_tokens}", file=sys.stderr)
        opts = P.ProtocolOptions(limit_flag, opts.truncate)
    return tpl, opts


def protocol_summary(records: list[dict], info: dict | None) -> dict:
    """summary.json's ``protocol``: the prompts hash / source and prompt limit of the run, the number
    of recorded calls and how many of them had their prompt truncated by the engine."""
    calls = [t for r in records for t in r["turns"]]
    truncated = sum(bool(t["completion"].get("prompt_truncated")) for t in calls)
    return {**(info or {}), "calls": len(calls), "prompt_truncated_calls": truncated}


def _note_retriever(team, retriever_spec: str | None) -> None:
    """A trained team records the retriever it learned with; say so when eval uses another one."""
    from drmas_bench.workflows.protocol import retriever_record

    if not team.retriever or not retriever_spec:
        return
    try:
        now = retriever_record(retriever_spec)
    except Exception:  # an unreadable index fails later with its own message
        return
    if now != {k: team.retriever.get(k) for k in ("kind", "identity")}:
        print(f"[eval] note: the team was trained with retriever {team.retriever.get('kind')} "
              f"({team.retriever.get('identity')}); this run uses {now['kind']} ({now['identity']})", file=sys.stderr)


def grader_record(family: str, math_grader: str | None) -> dict:
    """What grades this run: {"family": "math" | "qa" | "toy", and for math "name", "version"}.
    `--grader` on a workflow that is not graded as math is a UserError."""
    if family != "math":
        if math_grader is not None:
            raise UserError(f"--grader picks a math grader; this workflow is graded by {family!r}")
        return {"family": family}
    return {"family": family, **get_grader(math_grader or DEFAULT_GRADER).identity()}


# flag -> (check, what it must be); None values (unset optional flags) are not checked
FLAG_RULES = {
    "n": (lambda v: v >= 1, "an integer >= 1"),
    "limit": (lambda v: v >= 1, "an integer >= 1"),
    "max_new_tokens": (lambda v: v >= 1, "an integer >= 1"),
    "temperature": (lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"),
    "top_p": (lambda v: math.isfinite(v) and 0 < v <= 1, "a number in (0, 1]"),
    "concurrency": (lambda v: v >= 1, "an integer >= 1"),
    "max_batch": (lambda v: v >= 1, "an integer >= 1"),
    "flush_every": (lambda v: v >= 1, "an integer >= 1"),
    "pool_budget": (lambda v: math.isfinite(v) and v > 0, "a number > 0"),
}


def validate_flags(args: argparse.Namespace) -> None:
    """Check numeric flags before anything is read or loaded (``FLAG_RULES``); one line per mistake."""
    for name, (ok, what) in FLAG_RULES.items():
        v = getattr(args, name, None)
        if v is not None and not ok(v):
            raise UserError(f"--{name.replace('_', '-')} must be {what}, got {v}")


def check_workflow_options(options: dict, wf) -> None:
    """Team ``workflow_options`` must be keyword parameters of the workflow function."""
    params = list(inspect.signature(wf.fn).parameters.values())[1:]  # the first is the Episode
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    known = sorted(p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        raise UserError(f"workflow_options: unknown option(s) {', '.join(unknown)} for workflow {wf.name!r}; "
                        f"its options: {', '.join(known) or 'none'}")
    for k, v in options.items():
        default = wf.defaults.get(k)
        if default is not None and not isinstance(v, type(default)) and not (
                isinstance(default, float) and isinstance(v, int) and not isinstance(v, bool)):
            raise UserError(f"workflow_options.{k}: expected {type(default).__name__} (like the default {default!r}), got {v!r}")


def models_identity(team) -> dict[str, dict[str, str]]:
    """What each local worker group's ``model`` resolves to: real path + content hash (store.model_identity).
    Hub ids not downloaded and remote (openai) models are identified by name only."""
    from drmas_bench.models import resolve_model
    from drmas_bench.store import model_identity

    out = {}
    for name, g in team.worker_groups.items():
        if g.engine == "openai":
            continue
        resolved = resolve_model(g.model)
        out[name] = model_identity(resolved) if Path(resolved).is_dir() else {"name": str(resolved)}
    return out


def data_identity(benches, data_dir) -> dict[str, str]:
    """sha256 of every benchmark file read (generated / hub benchmarks: where they come from)."""
    from drmas_bench.store import load_hash_cache, save_hash_cache, file_sha256
    from drmas_bench.tasks.registry import local_file, source_of

    cache = load_hash_cache()
    out = {}
    for b in benches:
        path = local_file(b, Path(data_dir)) if data_dir and b.generate is None else None
        out[b.name] = f"sha256:{file_sha256(path, cache)}" if path else source_of(b, Path(data_dir) if data_dir else None)[0]
    save_hash_cache(cache)
    return out


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


async def _run(args, team, wf, tasks, store, sampling, retriever, cost_fn, protocol_opts=None):
    """Serve the team's worker groups from a pool (engines asleep until needed when the budget is
    smaller than the team), run the episodes, always release the engines. -> (RunStats, pool stats)"""
    from drmas_bench.pool import make_pool, specs_from_team
    from drmas_bench.runner import TeamRuntime, run_episodes

    pool = make_pool(args.pool, specs_from_team(team), budget_models=args.pool_budget)
    try:
        await pool.__aenter__()  # loads the engines that fit the budget
    except UserError:
        raise
    except Exception as e:
        models = ", ".join(f"{n}={g.model}" for n, g in team.worker_groups.items())
        log = store.log_error(e)
        raise UserError(f"cannot load the team's models ({models}): {_one_line(e)} (traceback in {log})") from None
    try:
        runtime = TeamRuntime(team, pool.views(), sampling)
        print(f"[eval] {len(tasks)} questions x {args.n} samples, workflow {wf.name}, run dir {store.path}", file=sys.stderr)
        try:
            stats = await run_episodes(
                tasks, args.n, runtime, wf, store, seed=args.seed, retriever=retriever,
                workflow_options={**team.workflow_options, **(protocol_opts or {})}, concurrency=args.concurrency,
                cost_fn=cost_fn, progress=not args.no_progress, flush_every=args.flush_every,
                math_grader=args.grader,
            )
        except UserError as e:
            raise UserError(f"{e} (finished samples are saved in {store.samples_path}; re-run to resume)") from None
        except Exception as e:
            log = store.log_error(e)
            raise UserError(f"run stopped ({_one_line(e)}); traceback in {log}; finished samples are saved in "
                            f"{store.samples_path}; re-run to resume") from None
        return stats, pool.stats()
    finally:
        await pool.__aexit__(None, None, None)


def cmd_eval(args: argparse.Namespace) -> int:
    from drmas_bench.store import RunDir, fingerprint
    from drmas_bench.tasks import load_tasks, resolve_data_dir

    # everything is checked before the run directory is touched: a mistake leaves no config behind
    validate_flags(args)
    suite, benches, wf, team, sampling = resolve_config(args)
    templates, proto = resolve_protocol(args, team, wf)
    data_dir = resolve_data_dir(args.data_dir)
    tasks = []
    for b in benches:
        tasks.extend(load_tasks(b, data_dir, limit=args.limit))
    if not tasks:
        raise UserError("the benchmark selection has no tasks")

    retriever_spec = None
    if wf.needs_retriever:
        retriever_spec = args.retriever or _default_retriever_spec(data_dir)
        _note_retriever(team, retriever_spec)

    runtime_sampling = {a: team.sampling_for(a, sampling).__dict__ for a in team.agents}
    identity = {
        "team": team.to_dict(),
        "models": models_identity(team),
        "sampling": runtime_sampling,
        "seed": args.seed,
        "retriever": retriever_spec,
    }
    protocol_opts, protocol_info = {}, None
    if templates is not None:
        limit, side = proto.resolve(wf.name)
        protocol_info = {"prompts_sha256": templates.sha256, "prompts_source": templates.source,
                         "max_prompt_tokens": limit, "truncate": side}
        identity["protocol"] = {k: protocol_info[k] for k in ("prompts_sha256", "max_prompt_tokens", "truncate")}
        protocol_opts = {"prompts": templates, "protocol": proto}
    grader = grader_record(wf.grader, args.grader)
    if wf.grader == "math":  # a resume with another math grader (or version) is refused
        identity["grader"] = {k: grader[k] for k in ("name", "version")}
    model_label = team.worker_groups[next(iter(team.worker_groups))].model if len(team.worker_groups) == 1 else "team"
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(model_label.rstrip("/")).name).strip(".") or "model"
    named = {k: v for k, v in identity.items() if k != "models"}  # default names stay those of earlier versions
    out = Path(args.out or Path("runs") / f"{suite}-{label}-{fingerprint(named)[:8]}")
    config = {
        "identity": identity,
        "data": data_identity(benches, data_dir),
        "suite": suite,
        "workflow": wf.name,
        "benchmarks": [b.name for b in benches],
        "n": args.n,
        "limit": args.limit,
        "data_dir": str(data_dir) if data_dir else None,
        "argv": sys.argv[1:],
    }
    prices = _load_prices(args.prices, team) if args.prices else None

    def cost_fn(traj) -> float:
        return sum(prices.cost(t.wg, t.completion.prompt_tokens, t.completion.completion_tokens, t.completion.latency_s)
                   for t in traj.turns)

    retriever = None
    if retriever_spec:
        from drmas_retrieval import load_retriever

        try:
            retriever = load_retriever(retriever_spec)
            retriever.search(["probe"], 1)  # a server that is down fails here, before any episode runs
        except Exception as e:  # a down server, a missing index dir
            raise UserError(f"retriever {retriever_spec}: {e}") from None

    store = RunDir(out, config, fresh=args.fresh)  # takes RUN/.lock, then writes the identity
    try:
        return _run_and_summarize(args, team, wf, tasks, store, sampling, retriever, cost_fn if prices else None, prices,
                                  protocol_opts, protocol_info, grader)
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as e:  # a bug, not a user mistake: keep the traceback, say so in one line
        log = store.log_error(e)
        raise UserError(f"unexpected error ({_one_line(e)}); traceback in {log}; finished samples are kept "
                        f"in {store.samples_path}") from None
    finally:
        store.close()


def _load_prices(path: str, team):
    """The price sheet, checked against the team's worker groups before the run starts."""
    from drmas_bench.pricing import load_prices

    # turns record their worker group; price each as its model
    prices = load_prices(path).with_aliases({n: g.price_key for n, g in team.worker_groups.items()})
    for name in team.worker_groups:
        prices.cost(name, 0, 0)  # fail now, not after the run, on a model the sheet lacks
    return prices


def _run_and_summarize(args, team, wf, tasks, store, sampling, retriever, cost_fn, prices, protocol_opts,
                       protocol_info, grader) -> int:
    from drmas_bench import metrics

    out = store.path
    stats, pool_stats = asyncio.run(_run(args, team, wf, tasks, store, sampling, retriever, cost_fn, protocol_opts))

    keys = {(t.benchmark, t.id) for t in tasks}
    records = [r for r in store.records() if (r["task"]["benchmark"], r["task"]["id"]) in keys and r["sample_idx"] < args.n]
    summary = metrics.summarize(records, prices=prices)
    summary["run"] = {"dir": str(out), "workflow": wf.name, "episodes_run": stats.episodes,
                      "episodes_resumed": stats.skipped, "wall_s": round(stats.wall_s, 2)}
    summary["pool"] = pool_stats
    summary["protocol"] = protocol_summary(records, protocol_info)
    summary["grader"] = grader
    md = metrics.format_summary_markdown(summary)
    if protocol_info:
        p = summary["protocol"]
        md += (f"\n- prompts: {p['prompts_source']} (sha256 {p['prompts_sha256'][:12]}); prompt limit "
               f"{p['max_prompt_tokens'] or 'none'} tokens ({p['truncate']}); truncated prompts: "
               f"{p['prompt_truncated_calls']} of {p['calls']} calls\n")
    store.write_summary(summary, md)
    print(md)
    print(f"\n[eval] {stats.episodes} episodes run, {stats.skipped} resumed from disk, {stats.wall_s:.1f} s; "
          f"summary in {out}/summary.md", file=sys.stderr)
    return 0
