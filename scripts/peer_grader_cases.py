"""Extract (gold, prediction, expected) cases from other projects' grader tests into JSONL.

    python scripts/peer_grader_cases.py --math-verify DIR --hendrycks FILE --out tests/data/peer_grader_cases

--math-verify: a folder holding Math-Verify's `tests/*.py` (github.com/huggingface/Math-Verify);
--hendrycks: the MATH repository's `modeling/math_equivalence_test.py` (github.com/hendrycks/math).
The test files are read with `ast` (never imported or run): every `pytest.mark.parametrize` list
whose names hold gold, pred and expected (or result), and every `unittest` method that assigns
`test_in` / `test_out` and asserts `is_equiv` true or false. Each case keeps its file and test name
and whether it is in scope for our graders (`in_scope`: see `scope`).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

# Math-Verify tests whose expected verdict depends on an option of its own (a set compared with a
# relation on request, a looser float precision): another convention, not a grading fact
OPTION_TESTS = {"test_set_rel_assymetry": "allow_set_relation_comp", "test_float_precision": "precision=5",
                "test_sqrt_precision": "precision=5", "test_symbols": "precision=5",
                "test_strict_variable_comparison": "strict=False"}
_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[A-Za-z]{4,}(?![a-zA-Z])")


def scope(gold: str, pred: str, test: str) -> str:
    """"" when the case is in scope; else why not. Our graders grade a boxed final answer against a
    gold answer; Math-Verify's suite also tests finding an answer in prose (`Answer \\[ 9 \\]`,
    a whole solution as the gold) and options of its own."""
    if test in OPTION_TESTS:
        return f"depends on math-verify's option {OPTION_TESTS[test]}"
    for s in (gold, pred):
        bare = re.sub(r"\\(?:text|mathrm|textbf|mbox)\s*\{[^{}]*\}", "", s)
        if len(s) > 200 or _PROSE_WORD.search(bare):
            return "answer extraction from prose"
    return ""


def _parametrized(tree: ast.Module):
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize"):
                continue
            names = [n.strip() for n in ast.literal_eval(dec.args[0]).split(",")]
            if "gold" not in names or "pred" not in names:
                continue
            want = "expected" if "expected" in names else "result" if "result" in names else None
            if want is None:
                continue
            if not isinstance(dec.args[1], (ast.List, ast.Tuple)):
                continue
            for node in dec.args[1].elts:
                try:
                    row = ast.literal_eval(node)
                except ValueError:  # a row built by code (an f-string, a call): not a plain case
                    continue
                if isinstance(row, (tuple, list)) and len(row) == len(names):
                    d = dict(zip(names, row))
                    yield fn.name, d["gold"], d["pred"], bool(d[want]), {k: v for k, v in d.items()
                                                                         if k not in ("gold", "pred", want)}


def math_verify_cases(folder: Path) -> list[dict]:
    out = []
    for path in sorted(folder.glob("test_*.py")):
        for test, gold, pred, expected, extra in _parametrized(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(gold, str) or not isinstance(pred, str):
                continue
            why = scope(gold, pred, test)
            out.append({"suite": "math_verify", "file": f"tests/{path.name}", "test": test, "gold": gold,
                        "pred": pred, "expected": expected, "in_scope": not why, "out_of_scope": why,
                        **({"options": extra} if extra else {})})
    return out


def hendrycks_cases(path: Path) -> list[dict]:
    out = []
    for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(fn, ast.FunctionDef):
            continue
        values, verdict = {}, None
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                values[node.targets[0].id] = ast.literal_eval(node.value)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("assertTrue", "assertFalse"):
                verdict = node.func.attr == "assertTrue"
        if verdict is not None and "test_in" in values and "test_out" in values:
            out.append({"suite": "hendrycks_math", "file": "modeling/math_equivalence_test.py", "test": fn.name,
                        "gold": values["test_in"], "pred": values["test_out"], "expected": verdict,
                        "in_scope": True, "out_of_scope": ""})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: python scripts/peer_grader_cases.py --math-verify mv/tests "
                                        "--hendrycks math/modeling/math_equivalence_test.py --out tests/data/peer_grader_cases",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--math-verify", type=Path, required=True, help="folder with Math-Verify's tests/*.py")
    ap.add_argument("--hendrycks", type=Path, required=True, help="MATH's modeling/math_equivalence_test.py")
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, cases in (("math_verify.jsonl", math_verify_cases(args.math_verify)),
                        ("hendrycks_math.jsonl", hendrycks_cases(args.hendrycks))):
        with open(args.out / name, "w", encoding="utf-8") as f:
            for c in cases:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        print(f"{name}: {len(cases)} cases, {sum(c['in_scope'] for c in cases)} in scope", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
