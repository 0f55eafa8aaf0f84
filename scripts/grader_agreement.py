"""Agreement of every math grader with the reference's own grader, per perturbation kind.

Reads the reference vectors' `math_grade.jsonl` (REFERENCE.md 2b; ../shared/reference_vectors, see
its MANIFEST.md): about 24,000 (gold, response) pairs built from the gold answers of AIME24, AIME25,
AMC23, MATH500, Minerva and OlympiadBench under many perturbations (units, `\\text`, assignments,
thousands separators, tiny numbers, `\\fbox`, think tags, lists, ...), each with the verdict of the
reference's RewardMathFn. Every registered grader (`drmas_bench.grading.GRADERS`: careful,
reference_compat, and math_verify when installed) grades every pair in the grading process pool
(`grade_math_many`, hard timeout per item; a timeout counts wrong).

Prints, per kind, the share the reference marks right and the share of cases on which each grader
agrees with it; then, per grader, every disagreement pattern (kind, reference verdict) with a count
and an example. `--write-docs` puts the same text into docs/grading.md (between the
`<!-- agreement:begin -->` / `<!-- agreement:end -->` markers). Which side is right in each pattern
is a judgement, written by hand in docs/grading.md under the table.

Example (math_verify takes most of the time: 5 to 8 minutes on 2 cores; the others ~20 s):
    python scripts/grader_agreement.py --write-docs
    python scripts/grader_agreement.py --vectors path/to/math_grade.jsonl --graders careful
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "grading.md"
BEGIN, END = "<!-- agreement:begin -->", "<!-- agreement:end -->"
VECTORS_ENV = "DRMAS_REFERENCE_VECTORS"
SYNTHETIC = "syn: "  # one-case kinds of the synthetic benchmark: one table row for all of them


def default_vectors() -> Path | None:
    """math_grade.jsonl in $DRMAS_REFERENCE_VECTORS, else in ../shared/reference_vectors."""
    for d in (os.environ.get(VECTORS_ENV), REPO.parent / "shared" / "reference_vectors"):
        if d and (Path(d) / "math_grade.jsonl").is_file():
            return Path(d) / "math_grade.jsonl"
    return None


def load_cases(path: Path) -> list[dict]:
    """The `math_grade` cases: {benchmark, kind, gold, response, reference (bool)}."""
    cases = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            c = json.loads(line)
            if c.get("rule") != "math_grade" or not isinstance(c.get("reference"), bool):
                raise SystemExit(f"{path}:{n}: not a math_grade case (rule {c.get('rule')!r})")
            cases.append({**c["input"], "reference": c["reference"]})
    if not cases:
        raise SystemExit(f"{path}: no cases")
    return cases


def grade_all(cases, graders: list[str], timeout: float, workers: int | None) -> dict[str, list]:
    from drmas_bench.grading import grade_math_many

    pairs = [(c["response"], c["gold"]) for c in cases]
    out = {}
    for name in graders:
        t0 = time.perf_counter()
        out[name] = grade_math_many(pairs, timeout_s=timeout, workers=workers, backend=name)
        bad = sum(r.status != "ok" for r in out[name])
        print(f"[agreement] {name}: {len(pairs)} cases in {time.perf_counter() - t0:.1f} s"
              f"{f', {bad} timeouts/errors (counted wrong)' if bad else ''}", file=sys.stderr)
    return out


def _row_kind(kind: str) -> str:
    return "synthetic (one case per kind)" if kind.startswith(SYNTHETIC) else kind


def tables(cases, results: dict[str, list], graders: list[str], n_examples: int) -> str:
    """The markdown: per kind, the reference's right share and each grader's agreement with it;
    then the disagreement patterns per grader."""
    ok = {g: [r.correct for r in results[g]] for g in graders}
    ref = [c["reference"] for c in cases]
    rows_of: dict[str, list[int]] = {}
    for i, c in enumerate(cases):
        rows_of.setdefault(_row_kind(c["kind"]), []).append(i)

    def row(label: str, idx: list[int]) -> list[str]:
        cells = [label, str(len(idx)), f"{100 * sum(ref[i] for i in idx) / len(idx):.1f}"]
        return cells + [f"{100 * sum(ok[g][i] == ref[i] for i in idx) / len(idx):.1f}" for g in graders]

    head = ["kind", "cases", "reference right %"] + [f"{g} agrees %" for g in graders]
    rows = [row(k, idx) for k, idx in rows_of.items()]
    rows.append(row("**all**", list(range(len(cases)))))
    md = [tabulate(rows, head, tablefmt="github", disable_numparse=True), ""]
    agree = ", ".join(f"{g} {sum(ok[g][i] == ref[i] for i in range(len(cases)))}" for g in graders)
    md.append(f"{len(cases)} cases ({len({c['gold'] for c in cases})} distinct golds); agreeing: {agree}; "
              "timeouts / errors (counted wrong): "
              + ", ".join(f"{g} {sum(r.status != 'ok' for r in results[g])}" for g in graders) + ".")
    md += ["", "Disagreements with the reference, per grader: kind, the reference's verdict -> the grader's "
           "(count), then an example (response -> gold).", ""]
    for g in graders:
        patterns: dict[tuple[str, bool], list[int]] = defaultdict(list)
        for i in range(len(cases)):
            if ok[g][i] != ref[i]:
                patterns[(cases[i]["kind"], ref[i])].append(i)
        md.append(f"- **{g}**: {sum(map(len, patterns.values()))} differ")
        for (kind, verdict), idx in sorted(patterns.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            status = {results[g][i].status for i in idx} - {"ok"}
            note = f", {'/'.join(sorted(status))}" if status else ""
            examples = "; ".join(f"`{_clip(cases[i]['response'])}` -> `{_clip(cases[i]['gold'], 40)}`"
                                 for i in idx[:n_examples])
            md.append(f"  - {kind}, {_verdict(verdict)} -> {_verdict(not verdict)} ({len(idx)}{note}): {examples}")
    return "\n".join(md) + "\n"


def _verdict(right: bool) -> str:
    return "right" if right else "wrong"


def _clip(s: str, width: int = 70) -> str:
    """The part of a response around its last box (where the answer is), on one line."""
    s = s.replace("`", "'").replace("\n", " ").strip()
    if len(s) <= width:
        return s
    cut = max(s.rfind("\\boxed"), s.rfind("\\fbox"), s.rfind("</think>"))
    start = max(0, min(cut - width // 4, len(s) - width + 3)) if cut >= 0 else 0
    out = s[start:start + width - 3]
    return ("..." if start else "") + out + ("..." if start + width - 3 < len(s) else "")


def write_docs(text: str, path: Path = DOC) -> None:
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path}: no {BEGIN} / {END} markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    from drmas_bench.grading import GRADERS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vectors", type=Path, default=None,
                    help=f"math_grade.jsonl (default: ${VECTORS_ENV}/ or ../shared/reference_vectors/)")
    ap.add_argument("--graders", help=f"comma-separated (default: all installed of {', '.join(GRADERS)})")
    ap.add_argument("--timeout", type=float, default=5.0, help="per-case timeout in seconds (default 5)")
    ap.add_argument("--workers", type=int, default=None, help="grading processes (default: usable CPUs)")
    ap.add_argument("--examples", type=int, default=1, help="examples per disagreement pattern (default 1)")
    ap.add_argument("--write-docs", action="store_true", help="write the tables into docs/grading.md")
    args = ap.parse_args(argv)

    graders = args.graders.split(",") if args.graders else [g for g in GRADERS if g != "math_verify" or _has_math_verify()]
    for g in graders:
        if g not in GRADERS:
            ap.error(f"unknown grader {g!r}; known: {', '.join(GRADERS)}")
    path = args.vectors or default_vectors()
    if path is None or not path.is_file():
        ap.error(f"no math_grade.jsonl: pass --vectors FILE or set ${VECTORS_ENV}"
                 + (f" ({path} is not a file)" if path else ""))
    cases = load_cases(path)
    results = grade_all(cases, graders, args.timeout, args.workers)
    versions = ", ".join(f"{g} v{GRADERS[g].version}" for g in graders)
    text = (f"Graders: {versions}; the reference's verdicts from `math_grade.jsonl`. Made by "
            f"`python scripts/grader_agreement.py --write-docs`.\n\n" + tables(cases, results, graders, args.examples))
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
