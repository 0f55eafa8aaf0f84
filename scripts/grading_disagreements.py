"""Where the reference grader and math-verify disagree on the math suite's gold answers.

For every gold answer of AIME24, AIME25, AMC23, MATH500, Minerva and OlympiadBench it grades
three predictions with both backends (`grade_math_many`, hard timeout per item):

- self:      the gold itself, boxed (both should say correct);
- other:     the next gold of the same benchmark whose normalised form differs (both: incorrect);
- rewrite:   an equivalent spelling of the gold where one is easy to write (`a/b` for
             `\\frac{a}{b}`, `x = g`, `g.0` for an integer) -- the reference grader's integer and
             fraction guards make some of these incorrect on purpose.

Prints a count per kind and benchmark, then every disagreement (or the first --show of them).

Example:
    python scripts/grading_disagreements.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

from tabulate import tabulate

from drmas_bench.grading import grade_math_many, normalize_answer
from drmas_bench.tasks import benchmarks_of_suite, load_tasks


def rewrite(gold: str) -> str | None:
    """An equivalent spelling of `gold`, or None when there is no obvious one."""
    g = gold.strip().strip("$")
    if re.fullmatch(r"-?\d+", g):
        return f"{g}.0"
    m = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", g)
    if m:
        return f"{m.group(1)}{m.group(2)}/{m.group(3)}"
    if "," not in g and "=" not in g and len(g) < 60:
        return f"x = {g}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", required=True, help="folder holding the math/ benchmark files")
    ap.add_argument("--timeout", type=float, default=10.0, help="per-item timeout in seconds (default 10)")
    ap.add_argument("--workers", type=int, default=None, help="grading processes (default: usable CPUs)")
    ap.add_argument("--show", type=int, default=0, help="print at most this many disagreements (default: all)")
    args = ap.parse_args(argv)

    rows: list[tuple[str, int, str, str, str]] = []  # (benchmark, row, kind, gold, prediction)
    for bench in benchmarks_of_suite("math"):
        golds = [t.answers[0] for t in load_tasks(bench.name, args.data_dir)]
        for i, gold in enumerate(golds):
            rows.append((bench.name, i, "self", gold, gold))
            mine = normalize_answer(gold)
            other = next((golds[(i + j) % len(golds)] for j in range(1, len(golds))
                          if normalize_answer(golds[(i + j) % len(golds)]) != mine), None)
            if other is not None:
                rows.append((bench.name, i, "other", gold, other))
            alt = rewrite(gold)
            if alt is not None:
                rows.append((bench.name, i, "rewrite", gold, alt))

    pairs = [(f"The answer is \\boxed{{{pred}}}.", gold) for _, _, _, gold, pred in rows]
    ref = grade_math_many(pairs, timeout_s=args.timeout, workers=args.workers, backend="reference")
    mv = grade_math_many(pairs, timeout_s=args.timeout, workers=args.workers, backend="math_verify")

    verdict = lambda r: r.status if r.status != "ok" else ("correct" if r.correct else "incorrect")  # noqa: E731
    table: Counter = Counter()
    disagreements = []
    for row, a, b in zip(rows, ref, mv):
        table[(row[0], row[2], "pairs")] += 1
        if verdict(a) != verdict(b):
            table[(row[0], row[2], "disagree")] += 1
            disagreements.append((*row, verdict(a), verdict(b)))
    kinds = ("self", "other", "rewrite")
    summary = [[bench.name] + [f"{table[(bench.name, k, 'disagree')]}/{table[(bench.name, k, 'pairs')]}" for k in kinds]
               for bench in benchmarks_of_suite("math")]
    summary.append(["total"] + [f"{sum(table[(b.name, k, 'disagree')] for b in benchmarks_of_suite('math'))}/"
                                f"{sum(table[(b.name, k, 'pairs')] for b in benchmarks_of_suite('math'))}" for k in kinds])
    print("Disagreements (reference vs math_verify) / pairs graded:")
    print(tabulate(summary, ["benchmark", *kinds], tablefmt="github", disable_numparse=True))
    shown = disagreements[: args.show] if args.show else disagreements
    if shown:
        print()
        print(tabulate([[b, i, k, g, p, r, m] for b, i, k, g, p, r, m in shown],
                       ["benchmark", "row", "kind", "gold", "prediction", "reference", "math_verify"],
                       tablefmt="github", disable_numparse=True))
    print(f"\n{len(disagreements)} disagreements in {len(rows)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
