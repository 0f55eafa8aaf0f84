"""`drmas-bench cache stats|prune DIR`: what a call cache holds (drmas_bench.call_cache) and making it smaller.

A missing or damaged database is one line (a damaged one is refused, never served or pruned).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone

EPILOG_STATS = """examples:
  drmas-bench cache stats runs/cache
  drmas-bench cache stats runs/cache --json

Entries, size on disk (database and its write-ahead log), entries per model and engine, the oldest
and newest entry. SQLite's page check runs first: a damaged file is reported, not read.
"""

EPILOG_PRUNE = """examples:
  drmas-bench cache prune runs/cache --older-than 30
  drmas-bench cache prune runs/cache --model tiny-random
  drmas-bench cache prune runs/cache --max-size 500

--older-than and --model together delete the entries matching both; --max-size then deletes the
oldest entries until the stored values fit. The file is compacted (VACUUM) afterwards. Do not prune
while an eval writes to the same cache if you need its entries: they may be among those deleted.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="inspect or shrink a call cache (cache stats DIR, cache prune DIR)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = actions.add_parser("stats", help="entries, size on disk, per model/engine counts, oldest/newest",
                           epilog=EPILOG_STATS, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("dir", help="cache directory (holds calls.sqlite3)")
    s.add_argument("--json", action="store_true", help="print the numbers as JSON")
    s.set_defaults(func=cmd_stats)
    r = actions.add_parser("prune", help="delete entries by age, model or total size, then VACUUM",
                           epilog=EPILOG_PRUNE, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("dir", help="cache directory (holds calls.sqlite3)")
    r.add_argument("--older-than", type=float, metavar="DAYS", help="delete entries written more than DAYS days ago")
    r.add_argument("--model", metavar="ID", help="delete the entries of this model (as runs named it, or a prefix of its "
                                                 "content hash shown by `cache stats`)")
    r.add_argument("--max-size", type=float, metavar="MB", help="then delete the oldest entries until the values fit in MB")
    r.set_defaults(func=cmd_prune)


def _when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:.2f} MB"


def cmd_stats(args: argparse.Namespace) -> int:
    from drmas_bench.call_cache import CallCache

    with CallCache.open(args.dir, create=False) as cache:
        cache.check()
        st = cache.stats()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(f"{st['path']}: {st['entries']} entries, {_mb(st['disk_bytes'])} on disk ({_mb(st['value_bytes'])} of values); "
          f"oldest {_when(st['oldest'])}, newest {_when(st['newest'])}")
    if st["models"]:
        from tabulate import tabulate

        rows = [(m["model"], m["content"][:12] or "-", m["engine"], m["entries"], _mb(m["value_bytes"])) for m in st["models"]]
        print(tabulate(rows, headers=["model", "content", "engine", "entries", "values"], tablefmt="github"))
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from drmas_bench.call_cache import CallCache
    from drmas_bench.types import UserError

    if args.older_than is None and args.model is None and args.max_size is None:
        raise UserError("cache prune: say what to delete: --older-than DAYS, --model ID and/or --max-size MB")
    for flag, v in (("--older-than", args.older_than), ("--max-size", args.max_size)):
        if v is not None and not v >= 0:
            raise UserError(f"cache prune: {flag} must be >= 0, got {v}")
    with CallCache.open(args.dir, create=False) as cache:
        cache.check()
        before = cache.stats()
        deleted = cache.prune(older_than_days=args.older_than, model=args.model, max_size_mb=args.max_size)
        after = cache.stats()
    print(f"{after['path']}: deleted {deleted} of {before['entries']} entries; {after['entries']} left, "
          f"{_mb(before['disk_bytes'])} -> {_mb(after['disk_bytes'])} on disk")
    return 0
