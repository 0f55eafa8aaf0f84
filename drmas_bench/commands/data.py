"""`drmas-bench data list | check | show | prepare`: what benchmarks exist, whether local copies are
valid, and the reference's sampled validation sets built from them."""

from __future__ import annotations

import argparse
import json
import textwrap

from tabulate import tabulate

from drmas_bench.suites.registry import suite_names
from drmas_bench.types import UserError

EPILOG = """examples:
  drmas-bench data list --data-dir ../shared/data
  drmas-bench data check --data-dir ../shared/data
  drmas-bench data check --data-dir ../shared/data --suite math --allow-missing
  drmas-bench data check --data-dir ../shared/data --train       # the training sets too
  drmas-bench data show aime24 --n 3
  drmas-bench data prepare --sampled --data-dir ../shared/data   # math_sampled, search_sampled
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="list, validate and inspect benchmarks", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    dsub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--data-dir", help="folder with local benchmark files (default: $DRMAS_DATA_DIR)")

    q = dsub.add_parser("list", help="table of benchmarks: suite, expected rows, found rows, source", epilog=EPILOG,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    common(q)
    q.add_argument("--suite", choices=suite_names(), help="only this suite")
    q.set_defaults(func=cmd_list)

    q = dsub.add_parser("check", help="validate the evaluation benchmarks' local copies (exit 0 only if all are present "
                                      "and valid); training sets are shown apart (--train counts them)",
                        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(q)
    q.add_argument("--suite", choices=suite_names(), help="only this suite")
    q.add_argument("--allow-missing", action="store_true",
                   help="a partial set is fine: benchmarks without a local copy are listed but do not fail "
                        "the check (invalid ones still do)")
    q.add_argument("--train", action="store_true",
                   help="also require the training sets (dapo_math_17k, nq_hotpotqa_train: what `train` reads): "
                        "a missing or invalid one fails the check")
    q.set_defaults(func=cmd_check)

    q = dsub.add_parser("show", help="print the first N tasks of a benchmark", epilog=EPILOG,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    common(q)
    q.add_argument("benchmark", help="benchmark name (see `data list`)")
    q.add_argument("--n", type=int, default=3, help="how many tasks to show (default 3)")
    q.add_argument("--json", action="store_true", help="print tasks as JSON lines")
    q.set_defaults(func=cmd_show)

    q = dsub.add_parser("prepare", help="build derived sets into the data dir: --sampled, the reference's validation "
                                        "sets (test_sampled) from the first rows of their sources",
                        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(q)
    q.add_argument("--sampled", action="store_true",
                   help="the reference's sampled validation sets (math_sampled: the first 50 of MATH500 + AIME24 + "
                        "AIME25, 110; search_sampled: the first 30 of each of its 7 sources, 210), written as the "
                        "reference writes test_sampled.parquet")
    q.add_argument("--suite", choices=suite_names(), help="only this suite's sets")
    q.add_argument("--out", help="write under this folder instead of the data dir (same relative paths)")
    q.add_argument("--force", action="store_true", help="rebuild a set whose file exists (an earlier build or "
                                                        "the reference's own file)")
    q.set_defaults(func=cmd_prepare)


def _rows(suite: str | None, data_dir):
    from drmas_bench.benchmarks import catalog

    names = catalog.known_names()
    return [catalog.BENCHMARKS[n] for n in names if suite is None or catalog.BENCHMARKS[n].suite == suite]


def cmd_list(args: argparse.Namespace) -> int:
    from drmas_bench.benchmarks import catalog

    d = catalog.resolve_data_dir(args.data_dir)
    table = []
    for b in _rows(args.suite, d):
        source, partial = catalog.source_of(b, d)
        found = "-"
        if b.generate is not None:
            found = len(b.generate())
        elif catalog.local_file(b, d) is not None:
            found = sum(1 for _ in catalog.iter_records(catalog.local_file(b, d)))
        table.append([b.suite, b.name, b.title, b.expected_rows, found, source + (f"  [{partial}]" if partial else "")])
    print(tabulate(table, headers=["suite", "benchmark", "title", "expected", "found", "source"]))
    return 0


def check_benchmark(b, data_dir) -> tuple[str, int | None, list[str]]:
    """Validate one benchmark's local copy: (status, rows, problems). status: ok | partial | invalid | missing."""
    from drmas_bench.benchmarks import catalog

    if b.generate is not None:
        tasks = b.generate()
        path_note = ""
    else:
        path = catalog.local_file(b, data_dir)
        if path is None:
            return "missing", None, []
        try:
            tasks = catalog.load_tasks(b, data_dir)
        except UserError as e:
            return "invalid", None, [str(e)]
        path_note = str(path.relative_to(data_dir))
    problems = []
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        problems.append(f"duplicate ids: {', '.join(dup)}")
    empty = [t.id for t in tasks if not t.answers or not all(a.strip() for a in t.answers)]
    if empty:
        problems.append(f"{len(empty)} tasks with an empty answer (first: {empty[0]})")
    if not all(t.question.strip() for t in tasks):
        problems.append("tasks with an empty question")
    partial = b.partial_files.get(path_note, "")
    if len(tasks) != b.expected_rows and not partial:
        problems.append(f"{len(tasks)} rows, expected {b.expected_rows}")
    status = "invalid" if problems else ("partial" if partial else "ok")
    return status, len(tasks), problems


def empty_gold_note(b, data_dir) -> str:
    """For a QA benchmark: how many golds normalise to the empty string (matched by their spelling
    only, so a task with no other matchable gold scores 0 whatever the answer); "" when none or not QA-graded."""
    if b.family != "qa":
        return ""
    from drmas_bench.benchmarks import catalog
    from drmas_bench.grading.qa import empty_golds, matchable_golds

    tasks = catalog.load_tasks(b, data_dir)
    hit = [(t, empty_golds(t.answers)) for t in tasks]
    hit = [(t, e) for t, e in hit if e]
    if not hit:
        return ""
    golds = sum(len(e) for _, e in hit)
    dead = sum(1 for t, _ in hit if not matchable_golds(t.answers))
    first = hit[0]
    return (f"{golds} golds normalise to empty and are matched by their spelling only ({dead} tasks have no "
            f"matchable gold and score 0; first: {first[0].id} {first[1][0]!r})")


def _check_rows(benches, d) -> tuple[list[list], list[str], list[str]]:
    """The check table of ``benches`` and the names of the invalid and the missing ones."""
    from drmas_bench.benchmarks import catalog

    table, bad, missing = [], [], []
    for b in benches:
        status, n, problems = check_benchmark(b, d)
        _, partial = catalog.source_of(b, d)
        if status == "missing":
            problems = [f"expected {' or '.join(b.files)}" if b.files else "no local file known"]
        notes = problems or [x for x in (partial, empty_gold_note(b, d) if status in ("ok", "partial") else "") if x]
        table.append([b.suite, b.name, b.expected_rows, "-" if n is None else n, status.upper(), "; ".join(notes)])
        if status == "invalid":
            bad.append(b.name)
        elif status == "missing":
            missing.append(b.name)
    return table, bad, missing


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 1 when an evaluation benchmark is invalid or (without ``--allow-missing``) has no local
    copy: a missing file is what makes a later offline eval stop, so "all valid" must not hide it.
    Training sets (what `train` reads) are checked and shown in their own section; they decide the
    exit code only with ``--train`` (an eval never reads them, and the shipped data holds one of the
    two: the search mix is hub-only unless saved locally)."""

    from drmas_bench.benchmarks import catalog

    d = catalog.resolve_data_dir(args.data_dir)
    rows = _rows(args.suite, d)
    headers = ["suite", "benchmark", "expected", "found", "status", "notes"]
    table, bad, missing = _check_rows([b for b in rows if b.split == "test"], d)
    t_table, t_bad, t_missing = _check_rows([b for b in rows if b.split == "train"], d)
    v_table, v_bad, v_missing = _check_rows([b for b in rows if b.split == "val"], d)
    if table:
        print("evaluation benchmarks\n")
        print(tabulate(table, headers=headers))
    if t_table:
        print(("\n" if table else "") + "training sets" + ("" if args.train else " (not counted in the exit code; --train counts them)")
              + "\n")
        print(tabulate(t_table, headers=headers))
    if v_table:  # built here from the evaluation benchmarks: shown, never counted in the exit code
        print("\nvalidation sets (not counted in the exit code; `data prepare --sampled` builds them)\n")
        print(tabulate(v_table, headers=headers))
        if v_bad:
            print(f"\nvalidation sets invalid: {', '.join(v_bad)} (rebuild: data prepare --sampled --force)")
    if d is None:
        print("\nno data dir given (--data-dir / $DRMAS_DATA_DIR): only built-in benchmarks have a copy here")
    if args.train:
        bad, missing = bad + t_bad, missing + t_missing
    elif t_bad or t_missing:
        which = [f"{n} missing" for n in t_missing] + [f"{n} invalid" for n in t_bad]
        print(f"\ntraining sets not ready ({', '.join(which)}): only `drmas-bench train` reads them "
              "(check them with --train)")
    hub = "they would load from the hub when online; "
    if missing:
        print(f"\nMISSING locally ({len(missing)}): {', '.join(missing)} ({hub}"
              + ("accepted by --allow-missing)" if args.allow_missing else "--allow-missing accepts a partial set)"))
    if bad:
        print(f"\nINVALID ({len(bad)}): {', '.join(bad)}")
    if bad or (missing and not args.allow_missing):
        return 1
    counted = len(table) + (len(t_table) if args.train else 0) - len(missing)
    what = "benchmarks and training sets" if args.train else "evaluation benchmarks"
    print(f"\nall {counted} present {what} are valid")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from drmas_bench.benchmarks import load_tasks

    if args.n < 1:
        raise UserError("--n must be at least 1")
    for t in load_tasks(args.benchmark, args.data_dir, limit=args.n):
        if args.json:
            print(json.dumps(t.to_dict(), ensure_ascii=False))
            continue
        print(f"[{t.benchmark} / {t.id}]")
        print(textwrap.indent(textwrap.shorten(t.question, 600, placeholder=" ...") if len(t.question) > 600 else t.question, "  Q: "))
        print(f"  A: {t.answers if len(t.answers) > 1 else t.answers[0]}")
        print()
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from drmas_bench.benchmarks.sampled import prepare_sampled

    if not args.sampled:
        raise UserError("say what to prepare: --sampled (the reference's validation sets)")
    built = prepare_sampled(args.data_dir, args.out, suite=args.suite, force=args.force)
    if not built:
        from drmas_bench.benchmarks.sampled import sampled_sets

        have = ", ".join(f"{b.name} ({b.suite})" for b in sampled_sets())
        print(f"nothing to prepare: suite {args.suite} has no sampled validation set (the ones there are: {have})")
    for b in built:
        if b.kept:
            print(f"{b.benchmark.name}: kept {b.path} (it exists: an earlier build or the reference's own file; "
                  f"--force rebuilds it)")
            continue
        parts = ", ".join(f"{source} {n}" for source, n in b.counts.items())
        print(f"{b.benchmark.name}: {sum(b.counts.values())} rows ({parts}) -> {b.path}")
        for note in b.notes:
            print(f"  note: {note}")
    for b in built:  # one set per team: a benchmark is graded by its own suite's family
        print(f"validate a {b.benchmark.suite} team on it during training with val.benchmarks: [{b.benchmark.name}]"
              " (and val.data: the folder it is in, when it is not the data dir)")
    return 0
