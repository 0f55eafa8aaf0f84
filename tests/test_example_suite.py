"""The example suite of docs/architecture.md (examples/suites/mcq/: a 2-agent proposer -> judge
multiple-choice team in one file, importing only `drmas_bench.suite`), copied outside the checkout
and named by its folder path in ``$DRMAS_SUITES``: the real CLI evaluates it (tiny-random, two
questions), views it, puts it on a leaderboard, trains it one step and evaluates the checkpoint;
the checkout is left as it was. The docs show the file itself (a test keeps them the same)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "suites" / "mcq" / "__init__.py"
DOC = ROOT / "docs" / "architecture.md"


def test_the_docs_show_the_example_file_and_it_imports_only_the_author_module():
    text = EXAMPLE.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    assert text in blocks  # the docs' copy is the file, whole
    assert len(text.splitlines()) <= 50
    imported = {n.module for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m.split(".")[0] == "drmas_bench"} == {"drmas_bench.suite"}


def _cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "drmas_bench", *args], env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.mark.slow  # four fresh interpreters with tiny-random: about a minute on 2 busy cores
def test_the_example_suite_evaluates_views_ranks_trains_and_reevaluates(tmp_path):
    suite = tmp_path / "outside" / "mcq"
    shutil.copytree(EXAMPLE.parent, suite, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "DRMAS_SUITES": str(suite)}
    before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout

    _cli(env, tmp_path, "-q", "eval", "--model", "tiny-random", "--suite", "mcq", "--n", "1", "--limit", "2",
         "--no-progress", "--out", "run")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["run"]["workflow"] == "propose_judge" and s["micro"]["questions"] == 2
    agents = s["compliance"]["agents"]
    assert agents["proposer"]["rule"] == "mcq_letter" and sum(agents["judge"]["verdicts"].values()) == agents["judge"]["calls"]
    assert "reasoned" in agents["judge"] and s["effects"]["mcq"]["episodes"] == 2  # its own figure, its effects
    assert s["effects"]["labels"]["retried"] == "answered twice (%)"
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "propose-judge" in md and "rulings with a reason" in md and "answered twice (%)" in md

    _cli(env, tmp_path, "view", "run", "--out", "run.html")
    page = (tmp_path / "run.html").read_text(encoding="utf-8")
    assert "propose-judge" in page and "rulings with a reason" in page and "answered twice" in page
    board = _cli(env, tmp_path, "leaderboard", "run", "--no-paper").stdout
    assert "mcq_demo" in board and "answered twice in" in board

    _cli(env, tmp_path, "-q", "train", "--recipe", "tiny", "--steps", "1", "--out", "train",
         "--set", "workflow=propose_judge", "--set", "data.source=benchmark:mcq_demo", "--set", "sft.steps=0",
         "--set", "sft.agent_steps={}", "--set", "rollout.prompts_per_step=2", "--set", "rollout.n=2",
         "--set", "algo.mini_batches=1", "--set", "val.benchmarks=mcq_demo", "--set", "val.n=1")
    # validated on its own benchmark before the step and after it, each a run folder
    (v0, rec) = [json.loads(x) for x in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    assert v0["step"] == 0 and v0["val/questions"] == 3 and (tmp_path / "train" / "val" / "step_1" / "summary.json").is_file()
    assert rec["step"] == 1 and {"proposer", "judge"} <= {k.split("/")[1] for k in rec if k.startswith("agent/")}

    _cli(env, tmp_path, "-q", "eval", "--model", "train/ckpt/latest", "--suite", "mcq", "--n", "1", "--limit", "1",
         "--no-progress", "--out", "again")
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["run"]["workflow"] == "propose_judge"
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    assert after == before  # nothing in the checkout changed
