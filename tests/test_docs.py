"""The docs as a newcomer uses them: every Python block of README.md and docs/*.md runs, every file a
doc names exists, the README's main job is marked for CI, and the README's stated exit codes hold.

A block that cannot run on its own (a sketch with names from the surrounding code, a GPU, a server)
carries ``<!-- not-run: REASON -->`` on the line above its fence; it is skipped with that reason.
Each runnable block runs in a fresh Python process inside an empty temporary folder (so relative
outputs such as ``runs/...`` land there) that holds ``corpus.jsonl``, a copy of the test corpus,
for the examples that index one. Top-level ``await`` is allowed, as in a notebook.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _doc_blocks():
    spec = importlib.util.spec_from_file_location("doc_blocks", REPO / "scripts" / "doc_blocks.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("doc_blocks", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


db = _doc_blocks()

PY_BLOCKS = [(doc, b) for doc in DOCS for b in db.blocks(doc.read_text(encoding="utf-8")) if b.lang == "python"]

# runs a block's code; top-level await is allowed (the engines' example awaits its calls)
RUNNER = """
import ast, asyncio, sys
src = open(sys.argv[1], encoding="utf-8").read()
code = compile(src, sys.argv[2], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
result = eval(code, {"__name__": "__main__"})
if asyncio.iscoroutine(result):
    asyncio.run(result)
"""


@pytest.mark.slow
@pytest.mark.parametrize("doc,block", PY_BLOCKS, ids=[f"{d.name}:{b.line}" for d, b in PY_BLOCKS])
def test_python_block_runs(doc, block, tmp_path):
    if block.marker == db.NOT_RUN:
        pytest.skip(f"{doc.name}:{block.line} marked not-run: {block.note}")
    shutil.copy(REPO / "tests" / "data" / "retrieval_corpus.jsonl", tmp_path / "corpus.jsonl")
    (tmp_path / "block.py").write_text(block.code, encoding="utf-8")
    (tmp_path / "runner.py").write_text(RUNNER, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "runner.py", "block.py", f"{doc.name}:{block.line}"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{doc.relative_to(REPO)}:{block.line} failed:\n{p.stderr[-3000:]}"


def test_not_run_blocks_say_why():
    for doc in DOCS:
        for b in db.blocks(doc.read_text(encoding="utf-8")):
            if b.marker == db.NOT_RUN:
                assert b.note.strip(), f"{doc.name}:{b.line}: <!-- not-run: REASON --> needs a reason"


# a repository path in running text or a code block: examples/..., scripts/..., docs/..., ...
PATH = re.compile(r"(?<![\w./~$<-])((?:examples|scripts|docs|leaderboards|trainer|retrieval|drmas_bench|tests|\.ci)"
                  r"/[A-Za-z0-9_./*-]*[A-Za-z0-9_*/])")
OUTPUT_FLAG = re.compile(r"--(out|output-dir)[ =]$")  # `--out leaderboards/mine` names what a command writes


def test_every_file_a_doc_names_exists():
    missing = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in PATH.finditer(text):
            path = m.group(1)
            if OUTPUT_FLAG.search(text[max(0, m.start() - 14):m.start()]):
                continue
            found = glob.glob(str(REPO / path)) if "*" in path else (REPO / path).exists()
            if not found:
                line = text.count("\n", 0, m.start()) + 1
                missing.append(f"{doc.relative_to(REPO)}:{line}: {path}")
    assert not missing, "docs name files that do not exist:\n" + "\n".join(missing)


def test_the_path_scan_sees_a_missing_file():
    text = "run `drmas-bench eval --team examples/teams/hetero.yaml`, then see docs/eval.md."
    assert [m.group(1) for m in PATH.finditer(text)] == ["examples/teams/hetero.yaml", "docs/eval.md"]
    assert not (REPO / "examples/teams/hetero.yaml").exists()


def test_readme_marks_one_main_job_for_ci():
    cmd = db.main_job((REPO / "README.md").read_text(encoding="utf-8"))
    assert cmd.startswith("drmas-bench eval ") and "\\" not in cmd and "\n" not in cmd
    assert "--suite" in cmd or "--benchmarks" in cmd


def test_main_job_extraction_follows_the_marker_not_a_line_number():
    text = ("# T\n\nSome text.\n\n```bash\ndrmas-bench eval --suite toy\n```\n\n<!-- main-job -->\n\n"
            "```bash\n# a comment\ndrmas-bench eval --model m \\\n    --suite search --n 2\n```\n")
    assert db.main_job(text) == "drmas-bench eval --model m --suite search --n 2"
    with pytest.raises(ValueError, match="0 blocks"):
        db.main_job(text.replace("<!-- main-job -->", ""))
    with pytest.raises(ValueError, match="2 commands"):
        db.main_job(text.replace("--n 2\n```", "--n 2\nls\n```"))
    with pytest.raises(ValueError, match="0 blocks"):  # text between marker and fence: not its block
        db.main_job(text.replace("<!-- main-job -->\n", "<!-- main-job -->\nA paragraph.\n"))


def test_readme_plan_exit_claim_holds(capsys):
    """The README says what `train --plan` of the 1-GPU paper recipe exits with; check it."""
    from drmas_bench.cli import main

    line = next(ln for ln in (REPO / "README.md").read_text().splitlines() if "math_qwen3_4b_1gpu --plan" in ln)
    claimed = int(re.search(r"exit (\d)", line).group(1))
    assert main(["train", "--recipe", "math_qwen3_4b_1gpu", "--plan"]) == claimed
    assert ("fits" in capsys.readouterr().out) == (claimed == 0)
