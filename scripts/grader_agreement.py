"""Agreement between the math graders on every gold answer of the math suite and its perturbations.

For every gold answer of AIME24, AIME25, AMC23, MATH500, Minerva and OlympiadBench (read from
--data-dir / $DRMAS_DATA_DIR) it builds model-like responses (`perturbations`) and grades each with
every registered grader (`drmas_bench.grading.GRADERS`: careful, reference_compat, and math_verify
when installed) in the grading process pool (`grade_math_many`, hard timeout per item). Kinds:

  self        the gold, boxed                               (right)
  nested      the gold in `\\boxed{\\boxed{...}}`            (right)
  wrong       the next different gold of the same benchmark  (wrong)
  equivalent  an easy equivalent spelling: `g.0` and `x = g` for an integer, `a/b` for `\\frac{a}{b}`,
              `\\dfrac`, a `$...$` wrapper                     (right)
  thousands   an integer >= 1000 with `1{,}000` / `1,000` separators   (right)
  units       a number followed by `\\text{ cm}` / `^\\circ`    (right: the unit is not the answer)
  text        the gold inside `\\text{...}`                   (right)
  tiny        an integer gold plus 1e-8 (`7.00000001`), and `10^{-8}` against gold 0 or `2 \\times 10^{-8}`
              (wrong: they are different numbers)
  fbox        `\\fbox{g}` and `\\boxed g` (unbraced)           (right for a lenient reader, no answer for the reference)
  think       `<think>\\boxed{w}</think>` then the gold boxed (right)
  reordered   a comma-separated list of answers in reverse order (right: the order is not asked)

Prints, per kind, the share each grader marks right and the pairwise agreement, then examples of
every disagreement pattern; `--write-docs` puts the same tables into docs/grading.md (between the
`<!-- agreement:begin -->` / `<!-- agreement:end -->` markers).

Example (about a minute on 2 cores):
    python scripts/grader_agreement.py --data-dir ../shared/data --write-docs
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

from tabulate import tabulate

from drmas_bench.grading.normalize import split_top_level

MATH = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")
DOC = Path(__file__).resolve().parent.parent / "docs" / "grading.md"
BEGIN, END = "<!-- agreement:begin -->", "<!-- agreement:end -->"
KINDS = ("self", "nested", "wrong", "equivalent", "thousands", "units", "text", "tiny", "fbox", "think", "reordered")

_INT = re.compile(r"^-?\d+$")
_NUM = re.compile(r"^-?\d+(?:\.\d+)?$")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}$")


def perturbations(gold: str, other: str | None) -> list[tuple[str, str]]:
    """(kind, response) pairs for one gold; `other` is a different gold of the same benchmark."""
    g = gold.strip()
    bare = g.strip("$").strip()
    out = [("self", f"The answer is $\\boxed{{{g}}}$."), ("nested", f"So \\boxed{{\\boxed{{{g}}}}}.")]
    if other is not None:
        out.append(("wrong", f"The answer is \\boxed{{{other}}}."))
    if _INT.match(bare):
        out += [("equivalent", f"\\boxed{{{bare}.0}}"), ("equivalent", f"\\boxed{{x = {bare}}}")]
        if abs(int(bare)) >= 1000:
            grouped = f"{int(bare):,}"
            out += [("thousands", f"\\boxed{{{grouped.replace(',', '{,}')}}}"), ("thousands", f"\\boxed{{{grouped}}}")]
        out += [("tiny", f"\\boxed{{{bare}.00000001}}"), ("units", f"\\boxed{{{bare}^\\circ}}"),
                ("fbox", f"\\fbox{{{bare}}}"), ("fbox", f"$\\boxed {bare}$")]
        if bare == "0":
            out.append(("tiny", "\\boxed{10^{-8}}"))
    m = _FRAC.match(bare)
    if m:
        out += [("equivalent", f"\\boxed{{{m.group(1)}{m.group(2)}/{m.group(3)}}}"),
                ("equivalent", f"\\boxed{{{m.group(1)}\\dfrac{{{m.group(2)}}}{{{m.group(3)}}}}}")]
    if _NUM.match(bare):
        out += [("units", f"\\boxed{{{bare} \\text{{ cm}}}}"), ("text", f"\\boxed{{\\text{{{bare}}}}}")]
        if not _INT.match(bare):
            out.append(("tiny", f"\\boxed{{{bare}0000001}}" if "." in bare else f"\\boxed{{{bare}.0000001}}"))
    if bare != g:
        out.append(("equivalent", f"\\boxed{{{bare}}}"))
    if re.fullmatch(r"[A-Za-z]{2,}", bare):
        out.append(("text", f"\\boxed{{\\text{{{bare}}}}}"))
    flat = bare.replace("$", "")
    parts = [p.strip() for p in split_top_level(flat, ",")]
    if len(parts) > 1 and flat[:1] not in "([" and "\\" not in flat and len(set(parts)) == len(parts):
        out.append(("reordered", f"\\boxed{{{', '.join(reversed(parts))}}}"))
    if other is not None:
        out.append(("think", f"<think>maybe \\boxed{{{other}}}</think> Final: \\boxed{{{g}}}"))
    return out


def tiny_cases() -> list[tuple[str, str, str]]:
    """(kind, response, gold): small numbers that are not zero, and not each other."""
    return [("tiny", "\\boxed{10^{-8}}", "2\\times 10^{-8}"), ("tiny", "\\boxed{3\\times10^{-9}}", "0"),
            ("tiny", "\\boxed{0.00000001}", "0"), ("tiny", "\\boxed{5\\times 10^{-8}}", "10^{-8}")]


def build_items(data_dir: str | None) -> list[tuple[str, str, str, str]]:
    """(benchmark, kind, response, gold) for the whole suite."""
    from drmas_bench.grading import normalize_answer
    from drmas_bench.tasks import load_tasks

    items = []
    for bench in MATH:
        golds = [t.answers[0] for t in load_tasks(bench, data_dir)]
        for i, gold in enumerate(golds):
            mine = normalize_answer(gold)
            other = next((golds[(i + j) % len(golds)] for j in range(1, len(golds))
                          if normalize_answer(golds[(i + j) % len(golds)]) != mine), None)
            items += [(bench, kind, resp, gold) for kind, resp in perturbations(gold, other)]
    items += [("synthetic", kind, resp, gold) for kind, resp, gold in tiny_cases()]
    return items


def grade_all(items, graders: list[str], timeout: float, workers: int | None) -> dict[str, list]:
    from drmas_bench.grading import grade_math_many

    pairs = [(resp, gold) for _, _, resp, gold in items]
    out = {}
    for name in graders:
        t0 = time.perf_counter()
        out[name] = grade_math_many(pairs, timeout_s=timeout, workers=workers, backend=name)
        bad = sum(r.status != "ok" for r in out[name])
        print(f"[agreement] {name}: {len(pairs)} items in {time.perf_counter() - t0:.1f} s"
              f"{f', {bad} timeouts/errors (counted wrong)' if bad else ''}", file=sys.stderr)
    return out


def tables(items, results: dict[str, list], graders: list[str], n_examples: int) -> str:
    """The markdown: per kind, the share each grader marks right and the pairwise agreement."""
    pairs = list(itertools.combinations(graders, 2))
    by_kind: dict[str, list[int]] = defaultdict(list)
    for i, (_, kind, _, _) in enumerate(items):
        by_kind[kind].append(i)
    ok = {g: [r.correct for r in results[g]] for g in graders}

    def row(label: str, idx: list[int]) -> list[str]:
        cells = [label, str(len(idx))]
        cells += [f"{100 * sum(ok[g][i] for i in idx) / len(idx):.1f}" for g in graders]
        cells += [f"{100 * sum(ok[a][i] == ok[b][i] for i in idx) / len(idx):.1f}" for a, b in pairs]
        return cells

    head = ["kind", "items"] + [f"{g} right %" for g in graders] + [f"agree {a} / {b} %" for a, b in pairs]
    rows = [row(k, by_kind[k]) for k in KINDS if by_kind.get(k)]
    rows.append(row("**all**", list(range(len(items)))))
    golds = [i for i, it in enumerate(items) if it[1] == "self"]
    md = [tabulate(rows, head, tablefmt="github", disable_numparse=True), ""]
    md.append(f"{len(golds)} gold answers ({', '.join(MATH)}), {len(items)} graded responses; "
              f"timeouts / errors: " + ", ".join(f"{g} {sum(r.status != 'ok' for r in results[g])}" for g in graders) + ".")
    md += ["", "Where they differ (counts per kind; first examples, response -> gold):", ""]
    for a, b in pairs:
        diff = [i for i in range(len(items)) if ok[a][i] != ok[b][i]]
        counts = defaultdict(int)
        for i in diff:
            counts[items[i][1]] += 1
        md.append(f"- **{a} vs {b}**: {len(diff)} differ"
                  + (f" ({', '.join(f'{k} {v}' for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))})" if diff else ""))
        shown: dict[tuple, int] = defaultdict(int)
        for i in diff:
            key = (items[i][1], ok[a][i])
            if shown[key] >= n_examples:
                continue
            shown[key] += 1
            bench, kind, resp, gold = items[i]
            md.append(f"  - {kind} ({bench}): `{_clip(resp)}` vs gold `{_clip(gold)}`: "
                      f"{a} {'right' if ok[a][i] else 'wrong'}, {b} {'right' if ok[b][i] else 'wrong'}")
    return "\n".join(md) + "\n"


def _clip(s: str, width: int = 70) -> str:
    s = s.replace("`", "'").replace("\n", " ")
    return s if len(s) <= width else s[:width - 3] + "..."


def write_docs(text: str, path: Path = DOC) -> None:
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path}: no {BEGIN} / {END} markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    from drmas_bench.grading import GRADERS
    from drmas_bench.tasks import resolve_data_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", help="folder holding math/ (default: $DRMAS_DATA_DIR)")
    ap.add_argument("--graders", help=f"comma-separated (default: all installed of {', '.join(GRADERS)})")
    ap.add_argument("--timeout", type=float, default=5.0, help="per-item timeout in seconds (default 5)")
    ap.add_argument("--workers", type=int, default=None, help="grading processes (default: usable CPUs)")
    ap.add_argument("--examples", type=int, default=2, help="examples per disagreement pattern (default 2)")
    ap.add_argument("--write-docs", action="store_true", help="write the tables into docs/grading.md")
    args = ap.parse_args(argv)

    graders = args.graders.split(",") if args.graders else [g for g in GRADERS if g != "math_verify" or _has_math_verify()]
    for g in graders:
        if g not in GRADERS:
            ap.error(f"unknown grader {g!r}; known: {', '.join(GRADERS)}")
    data_dir = resolve_data_dir(args.data_dir)
    items = build_items(str(data_dir) if data_dir else None)
    results = grade_all(items, graders, args.timeout, args.workers)
    versions = ", ".join(f"{g} v{GRADERS[g].version}" for g in graders)
    text = f"Graders: {versions}. Made by `python scripts/grader_agreement.py --write-docs`.\n\n" + \
        tables(items, results, graders, args.examples)
    print(text)
    if args.write_docs:
        write_docs(text)
        print(f"[agreement] wrote {DOC}", file=sys.stderr)
    return 0


def _has_math_verify() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
