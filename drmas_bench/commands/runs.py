"""`drmas-bench runs repair RUN`: keep a run directory usable after a damaged samples.jsonl.

Every reader (eval's resume, leaderboard, compare, cost) stops at a line it cannot read and names
this command; it moves such lines aside (``drmas_bench.run_dir.repair_samples``) so that one bad line
never costs the good samples around it.
"""

from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)

EPILOG = """examples:
  drmas-bench runs repair runs/toy-tiny-random-1a2b3c4d

Unreadable lines of RUN/samples.jsonl (not JSON, not UTF-8, not a trajectory record) are appended,
byte for byte, to RUN/samples.jsonl.quarantine; every readable line stays, in order. Running it again
changes nothing. Re-run the eval afterwards to recompute the quarantined samples.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="maintain run directories (runs repair RUN)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = actions.add_parser("repair", help="move unreadable lines of RUN/samples.jsonl into a quarantine file, keep the rest",
                           epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("run", help="run directory")
    r.set_defaults(func=cmd_repair)


def cmd_repair(args: argparse.Namespace) -> int:
    from drmas_bench.run_dir import repair_samples
    from drmas_bench.run_samples import SAMPLES

    kept, moved, quarantine = repair_samples(args.run)
    samples = f"{args.run.rstrip('/')}/{SAMPLES}"
    if not moved:
        print(f"{samples}: every line is readable ({kept} samples); nothing to repair")
        return 0
    shown = ", ".join(map(str, moved[:10])) + (f" and {len(moved) - 10} more" if len(moved) > 10 else "")
    print(f"{samples}: moved {len(moved)} unreadable line(s) ({'line' if len(moved) == 1 else 'lines'} {shown}) "
          f"to {quarantine}; kept {kept} samples")
    logger.info("[runs] re-run the eval command to recompute the samples of those lines")
    return 0
