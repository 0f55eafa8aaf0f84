"""`drmas-bench`: one console script, one sub-command per module in drmas_bench/commands/.

Adding a command = one module with ``register(subparsers)`` (which calls ``set_defaults(func=...)``)
and one line in ``COMMANDS`` (a lazy ``"module:register"`` entry). Command modules import their heavy dependencies inside the function
that runs, so ``drmas-bench --help`` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable

from drmas_bench import __version__, log, signals
from drmas_bench.limits import EXIT_CODE as LIMIT_EXIT_CODE
from drmas_bench.limits import LimitReached
from drmas_bench.registry import Registry
from drmas_bench.suites.discovery import discover
from drmas_bench.types import UserError

COMMANDS: Registry[Callable[[argparse._SubParsersAction], None]] = Registry("command module")
COMMANDS.register("data", "drmas_bench.commands.data:register")  # data list / check / show
COMMANDS.register("models", "drmas_bench.commands.models:register")  # models list / prepare / chat
COMMANDS.register("retrieval", "drmas_bench.commands.retrieval:register")  # retrieval index / eval / serve
COMMANDS.register("eval", "drmas_bench.commands.eval:register")  # eval: a team over benchmarks, resumable
COMMANDS.register("sweep", "drmas_bench.commands.sweep:register")  # sweep: many agent -> model assignments on one suite, paired, Pareto table
COMMANDS.register("runs", "drmas_bench.commands.runs:register")  # runs repair: quarantine unreadable lines of a run's samples.jsonl
COMMANDS.register("cache", "drmas_bench.commands.cache:register")  # cache stats / prune: the call cache (drmas_bench.call_cache)
COMMANDS.register("report", "drmas_bench.commands.report:register")  # leaderboard / compare / cost
COMMANDS.register("view", "drmas_bench.commands.view:register")  # view: one self-contained HTML page of a run's summary and trajectories
COMMANDS.register("export", "drmas_bench.commands.export:register")  # export: a finished run as an Inspect AI log or a Hugging Face model card
COMMANDS.register("train", "drmas_bench.commands.train:register")  # train / regress / plot (imports the trainer lazily)
COMMANDS.register("train_report", "drmas_bench.commands.train_report:register")  # train-report: one HTML page of a training run's curves and validation steps
COMMANDS.register("config_schema", "drmas_bench.commands.config_schema:register")  # config-schema: the keys of team / prices / prompts / train files


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drmas-bench",
        description="Evaluate and train teams of LLM agents (Dr. MAS).",
        epilog="Run `drmas-bench COMMAND --help` for each command's options and an example.",
    )
    parser.add_argument("--version", action="version", version=f"drmas-bench {__version__}")
    _add_global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        COMMANDS.get(name)(sub)
    for p in _leaf_parsers(sub):  # `drmas-bench eval ... -v` works as well as `drmas-bench -v eval ...`
        _add_global_flags(p, top=False)
    return parser


def _add_global_flags(p: argparse.ArgumentParser, top: bool) -> None:
    """-v / -q (logging level, see drmas_bench.log) and --debug (re-raise unexpected errors with
    their traceback instead of the one-line message). On sub-commands their default is SUPPRESS so
    a flag given before the command is not reset by the sub-command's default."""
    d = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    g = p.add_argument_group("output and errors")
    g.add_argument("-v", "--verbose", action="count", default=d(0), help="more messages (DEBUG level)")
    g.add_argument("-q", "--quiet", action="count", default=d(0), help="only warnings and errors on stderr")
    g.add_argument("--debug", action="store_true", default=d(False),
                   help="on an unexpected error, re-raise it with its full traceback instead of one line")


def _leaf_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    """Every parser below ``sub`` (commands and their actions), each once."""
    out: list[argparse.ArgumentParser] = []
    for p in dict.fromkeys(sub.choices.values()):
        out.append(p)
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                out.extend(_leaf_parsers(a))
    return out


# Flags that users of other harnesses (lm-evaluation-harness above all) type from habit, with what
# this CLI calls the same thing; named in the error instead of a bare "unrecognized arguments".
FOREIGN_FLAGS = {
    "--tasks": "--benchmarks NAME[,NAME] or --suite math|search|toy, names in `drmas-bench data list`",
    "--batch-size": "--max-batch N, the calls one engine batches together, and --concurrency N, the episodes in flight",
    "--model_args": "--engine-args K=V,... or its alias --model-args",
    "--num_fewshot": "none, the workflow's prompts are fixed and --prompts FILE replaces them",
    "--output_path": "--out DIR or its alias --output-dir",
    "--device": "--engine-args device=cuda:0",
}
FOREIGN_FLAGS["--batch_size"] = FOREIGN_FLAGS["--batch-size"]
FOREIGN_FLAGS["--num-fewshot"] = FOREIGN_FLAGS["--num_fewshot"]
FOREIGN_FLAGS["--output-path"] = FOREIGN_FLAGS["--output_path"]


def unrecognized_message(extra: list[str]) -> str:
    """argparse's "unrecognized arguments" line, plus what each familiar foreign flag is called here."""
    msg = f"unrecognized arguments: {' '.join(extra)}"
    hints: list[str] = []
    for a in extra:
        flag = a.split("=", 1)[0]
        if flag in FOREIGN_FLAGS and not any(h.startswith(flag + " ->") for h in hints):
            hints.append(f"{flag} -> {FOREIGN_FLAGS[flag]}")
    return msg + (f" (in drmas-bench: {'; '.join(hints)})" if hints else "")


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub-)parser of the command that was given, so an error shows that command's usage."""
    p = parser
    while True:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen not in (subs[0].choices if subs else {}):
            return p
        p = subs[0].choices[chosen]


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
    try:  # the suites, their declarations checked, before any parser or command (`--help` lists their names)
        discover()
    except UserError as e:
        if "--debug" in (sys.argv[1:] if argv is None else argv):
            raise
        print(f"drmas-bench: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        _command_parser(parser, args).error(unrecognized_message(extra))  # exits 2, as parse_args would
    args.argv = [parser.prog, *(sys.argv[1:] if argv is None else argv)]  # the command line, for provenance
    log.setup(log.level_for(args.verbose, args.quiet))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    original: BaseException | None = None
    try:
        with signals.stop_signals_as_interrupt():  # SIGTERM / SIGHUP stop like Ctrl-C: finished work is kept
            rc = args.func(args)
    except log.UnexpectedError as e:  # a bug inside a run: its traceback is already in RUN/error.log
        if not args.debug:
            print(f"drmas-bench: error: {e}", file=sys.stderr)
            return 2
        original = e.original
    except UserError as e:
        print(f"drmas-bench: error: {e}", file=sys.stderr)
        return 2
    except LimitReached as e:  # --max-usd / --max-tokens: finished work and the summary are written
        print(f"drmas-bench: {e.line()}", file=sys.stderr)
        return LIMIT_EXIT_CODE
    except KeyboardInterrupt:
        sig = signals.stopped_by()
        try:  # after SIGHUP the terminal may be gone
            print(f"drmas-bench: stopped by {signals.signal_name(sig)} (finished work is kept on disk)", file=sys.stderr)
        except OSError:
            pass
        return signals.exit_code()
    except BrokenPipeError:  # `drmas-bench ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
    except Exception as e:  # a bug outside a run directory: the same one line, traceback in a temp file
        if args.debug:
            raise
        logging.getLogger(__name__).debug("unexpected error", exc_info=True)
        print(f"drmas-bench: error: {log.unexpected(e)}", file=sys.stderr)
        return 2
    if original is not None:  # --debug: raised outside the handler, so its traceback is its own
        raise original
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
