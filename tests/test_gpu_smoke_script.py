"""The fast-tier check of scripts/gpu_smoke.sh, in about a second: what rotted in it before (a step
naming a test that was renamed, a `--set` key of its `cli` step that the trainer no longer takes, a
benchmark flag that went away) fails here without running the steps. The CPU dry run (three steps
through the script, every pytest step in one process) is the slow-tier tests/test_gpu_smoke_dryrun.py."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = (REPO / "scripts" / "gpu_smoke.sh").read_text(encoding="utf-8")


def _logical_lines(text: str) -> list[str]:
    """The script's lines with backslash continuations joined."""
    return text.replace("\\\n", " ").splitlines()


def test_the_script_parses():
    p = subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_smoke.sh")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_every_step_names_a_test_that_exists():
    tree = ast.parse((REPO / "tests" / "test_gpu_smoke.py").read_text(encoding="utf-8"))
    tests = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    ids = set(re.findall(r'ids=\[([^\]]*)\]', (REPO / "tests" / "test_gpu_smoke.py").read_text(encoding="utf-8")))
    param_ids = {x.strip().strip('"\'') for group in ids for x in group.split(",")}
    named = re.findall(r'"\$T::(test_\w+)(?:\[(\w+)\])?"', SCRIPT)
    assert len(named) >= 8, named  # build engine pool train train-tis faiss train-offload train-lora
    for name, param in named:
        assert name in tests, f"gpu_smoke.sh runs $T::{name}, which tests/test_gpu_smoke.py does not define"
        if param:
            assert param in param_ids, f"gpu_smoke.sh runs $T::{name}[{param}]: no such parameter id"


def test_the_cli_step_overrides_load_into_the_tiny_recipe():
    from drmas_trainer.config.train import load_config, parse_override

    line = next(ln for ln in _logical_lines(SCRIPT) if ln.startswith("run_step cli "))
    words = shlex.split(line.replace("$MODELS", "/models").replace("$DEV", "cpu").replace("$STEPS_SFT", "5"))
    assert words[words.index("--recipe") + 1] == "tiny"
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    assert any(s.startswith("model=") for s in sets), sets
    cfg = load_config("tiny", dict(parse_override(s) for s in sets))
    assert cfg.device == "cpu" and cfg.save_every == 0 and cfg.sft.steps == 5


@pytest.mark.parametrize("bench", ["bench_logprob_memory.py", "bench_encoder.py"])
def test_every_benchmark_flag_the_script_passes_is_declared(bench):
    declared = set(re.findall(r'add_argument\(\s*"(--[\w-]+)"', (REPO / "scripts" / bench).read_text(encoding="utf-8")))
    lines = [ln for ln in _logical_lines(SCRIPT) if ("BENCH=" in ln if "logprob" in bench else "ENC=" in ln)]
    used = {f for ln in lines for f in re.findall(r"(--[a-z][\w-]*)", ln)}
    assert used, f"no flags found for {bench}"
    assert used <= declared, f"gpu_smoke.sh passes {sorted(used - declared)} to scripts/{bench}, which does not declare them"


def test_the_step_list_of_gpu_smoke_steps_is_every_step_the_script_runs():
    """GPU_SMOKE_STEPS is checked against ALL_STEPS: a step added to the script and not to the list
    could not be picked, and a name left in the list would be accepted and run nothing."""
    listed = re.search(r'^ALL_STEPS=" ([^"]*) "$', SCRIPT, flags=re.M)
    assert listed, "gpu_smoke.sh has no ALL_STEPS line"
    run = re.findall(r"^run_step ([\w-]+) ", SCRIPT, flags=re.M)
    assert listed.group(1).split() == run
