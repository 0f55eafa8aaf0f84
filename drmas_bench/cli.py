"""`drmas-bench`: one console script, one sub-command per module in drmas_bench/commands/.

Adding a command = one module with ``register(subparsers)`` (which calls ``set_defaults(func=...)``)
and one line in ``COMMANDS``. Command modules import their heavy dependencies inside the function
that runs, so ``drmas-bench --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from drmas_bench import __version__
from drmas_bench.types import UserError

COMMANDS = [
    "drmas_bench.commands.data",  # data list / check / show
    "drmas_bench.commands.models",  # models list / prepare / chat
    "drmas_bench.commands.retrieval",  # retrieval index / eval / serve
    "drmas_bench.commands.eval",  # eval: a team over benchmarks, resumable
    "drmas_bench.commands.report",  # leaderboard / compare / cost
    "drmas_bench.commands.train",  # train / regress / plot (imports the trainer lazily)
    "drmas_bench.commands.config_schema",  # config-schema: the keys of team / prices / prompts / train files
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drmas-bench",
        description="Evaluate and train teams of LLM agents (Dr. MAS).",
        epilog="Run `drmas-bench COMMAND --help` for each command's options and an example.",
    )
    parser.add_argument("--version", action="version", version=f"drmas-bench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def _cpu_threads_default() -> None:
    """On small CPU machines run torch with one intra-op thread per process unless told otherwise
    (OMP_NUM_THREADS / DRMAS_TORCH_THREADS). Its spinning worker threads slow decoding ~10x as soon
    as anything else (grading workers, a second engine, a test runner) wants the same cores; measured
    on 2 cores: the README's search eval took 33 s with 1 thread, 217 s with 2."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    n = os.environ.get("DRMAS_TORCH_THREADS") or ("1" if (os.cpu_count() or 1) <= 4 else None)
    if n:
        os.environ["OMP_NUM_THREADS"] = n  # read when torch is first imported (commands import it lazily)


def main(argv: list[str] | None = None) -> int:
    _cpu_threads_default()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = [parser.prog, *(sys.argv[1:] if argv is None else argv)]  # the command line, for provenance
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except UserError as e:
        print(f"drmas-bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("drmas-bench: interrupted (finished work is kept on disk)", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
