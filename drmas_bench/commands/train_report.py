"""`drmas-bench train-report RUN [--out FILE.html]`: the training run's page (reward, validation
avg@n, per-agent gradient norms and validity against the step; each validation point links to its
run folder RUN/val/step_N/; the best validation step named). The page is built by
`drmas_trainer.reports.page`, imported when the command runs; this module only parses the arguments."""

from __future__ import annotations

import argparse
from pathlib import Path

EPILOG = """examples:
  drmas-bench train --recipe tiny --out runs/tiny-drmas
  drmas-bench train-report runs/tiny-drmas                        # writes runs/tiny-drmas/train_report.html
  drmas-bench train-report runs/tiny-drmas --out tiny-drmas.html  # elsewhere (its links stay relative)

The page needs no server and loads nothing from the network: open it from disk. Validation points
come from RUN/val/step_N/summary.json (each an evaluation run folder: `drmas-bench view` opens it);
a run without validation folders gets the training curves and says so. docs/trainer.md.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-report", help="write one HTML page of a training run's curves and validation steps",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="training run folder (the --out of `drmas-bench train`)")
    p.add_argument("--out", metavar="FILE.html", help="where to write the page (default: RUN/train_report.html)")
    p.set_defaults(func=cmd_train_report)


def cmd_train_report(args: argparse.Namespace) -> int:
    from drmas_trainer.reports.page import best_step, validation_points, write_report

    out = write_report(args.run, args.out)
    points = validation_points(Path(args.run))
    best = best_step(points)
    said = (f"best validation step {best.step}" if best is not None
            else "no validation step" if not points else "no finished validation yet")
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB; {said}); open it in a browser")
    return 0
