"""`drmas-bench view RUN [RUN2] [--out FILE.html]`: one self-contained page that explains a run
(how good, why, at what cost, where the time went: tables and charts; every trajectory's turns; two
runs side by side, with the questions fixed and broken). The page is built by
`drmas_bench.report.view`; this module only parses the arguments."""

from __future__ import annotations

import argparse

EPILOG = """examples:
  drmas-bench view runs/toy-tiny-random-1a2b3c4d                # writes RUN/view.html
  drmas-bench view runs/base runs/trained --out compare.html     # the same questions side by side

The page needs no server and loads nothing from the network: open it from disk in any recent
browser (a phone too). How to read it: docs/analysis.md.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="write one HTML page explaining a run (or two runs side by side)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directory; give a second one to pair two runs")
    p.add_argument("--out", metavar="FILE.html", help="where to write the page (default: RUN/view.html)")
    p.set_defaults(func=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    from drmas_bench.report.view import write_view
    from drmas_bench.types import UserError

    if len(args.runs) > 2:
        raise UserError(f"view takes one run or two (to pair them), got {len(args.runs)}")
    out = write_view(args.runs, args.out)
    size = out.stat().st_size
    shown = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
    print(f"wrote {out} ({shown}); open it in a browser")
    return 0
