"""`drmas-bench export RUN --format inspect|hub [--out PATH] [--force]`: a finished run in the
formats other tools read (an Inspect AI log, a Hugging Face model card with per-sample parquet).
The formats live in `drmas_bench.export`; this module only parses the arguments. Exporting a
checkpoint's model weights is another command: `drmas-bench models export`."""

from __future__ import annotations

import argparse

EPILOG = """examples:
  drmas-bench export runs/toy-tiny-random-1a2b3c4d --format inspect    # RUN/export/inspect.eval
  inspect view --log-dir runs/toy-tiny-random-1a2b3c4d/export           # open it in Inspect's viewer
  drmas-bench export runs/math-qwen3 --format hub --out hub/qwen3-math  # README.md + samples.parquet

--format inspect needs the `inspect` extra: pip install 'drmas-bench[inspect]'.
A run stopped by a limit is exported flagged as partial; a run without summary.json (stopped before
it finished) is refused. What each format holds: docs/export.md.
"""


def register(sub: argparse._SubParsersAction) -> None:
    from drmas_bench.export import FORMATS

    p = sub.add_parser("export", help="write a finished run as an Inspect AI log or a Hugging Face model card + parquet",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="a finished run directory (written by `drmas-bench eval`)")
    p.add_argument("--format", required=True, choices=list(FORMATS),
                   help="; ".join(f"{k}: {f.what}" for k, f in FORMATS.items()))
    p.add_argument("--out", metavar="PATH",
                   help="where to write (default: " + ", ".join(f"{k}: RUN/{f.default_out}" for k, f in FORMATS.items()) + ")")
    p.add_argument("--force", action="store_true", help="replace an existing PATH")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from drmas_bench.export import export_run

    written = export_run(args.run, args.format, args.out, force=args.force)
    for p in written:
        print(f"wrote {p}")
    return 0
