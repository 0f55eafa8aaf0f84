"""scripts/gpu_smoke.sh is what a session with a borrowed GPU runs once, with minutes to spare; its
CPU dry run runs here so the script does not rot between GPU sessions (a renamed config key once
broke its `cli` step).

Two tests share the work, because each step of the script is its own process that imports torch
and transformers again (13 steps: most of the whole dry run's time was that start-up):

- the script itself, `gpu_smoke.sh --cpu`, on three of its steps (`GPU_SMOKE_STEPS`), one of each
  kind: a pytest step (`build`), a benchmark script (`logprob-bf16`) and the `drmas-bench train`
  command (`cli`). This proves the script's own path: the packages linked without an install, the
  GPU machine's missing packages made absent, each step in its own process under its timeout, and
  PASS/FAIL read from each step's output.
- every pytest-run step (the gpu-marked tests of tests/test_gpu_smoke.py, test_memory.py and
  test_losses.py) in ONE pytest process, on CPU at the dry run's tiny sizes, with the same packages
  made absent (the script's own sitecustomize, read from the script).

What the script passes to the two benchmark scripts and to its `cli` step is checked in the fast
tier too (tests/test_gpu_smoke_script.py)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import busy_factor

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_smoke.sh"


@pytest.mark.slow
def test_gpu_smoke_cpu_dry_run_passes_its_steps_of_each_kind(tmp_path):
    steps = ("build", "logprob-bf16", "cli")
    # the steps' timeouts are the GPU machine's; on a busy machine they stretch with its load
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=sys.executable, OMP_NUM_THREADS="1",
               GPU_SMOKE_STEPS=" ".join(steps), GPU_SMOKE_TIME_SCALE=str(math.ceil(busy_factor())))
    p = subprocess.run(["bash", str(SCRIPT), "--cpu"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=400 * math.ceil(busy_factor()))
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-4000:]
    for step in steps:
        assert f"PASS {step} " in log, (step, log[-4000:])
    ran = re.findall(r"^(?:PASS|FAIL|SKIP) ([\w-]+)", log, flags=re.M)
    assert ran == list(steps), ran  # the other steps are not run
    assert "gpu_smoke: PASSED" in (tmp_path / "out" / "gpu_smoke.log").read_text()


def test_gpu_smoke_steps_names_an_unknown_step_in_one_line(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, GPU_SMOKE_STEPS="build trian")
    p = subprocess.run(["bash", str(SCRIPT), "--cpu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "FAIL setup: unknown step 'trian' in GPU_SMOKE_STEPS" in p.stdout, p.stdout + p.stderr
    env["GPU_SMOKE_STEPS"], env["GPU_SMOKE_TIME_SCALE"] = "build", "1.5"
    p = subprocess.run(["bash", str(SCRIPT), "--cpu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "GPU_SMOKE_TIME_SCALE must be a whole number >= 1, got '1.5'" in p.stdout


def _absent_packages_sitecustomize() -> str:
    """The sitecustomize.py that the script writes in its dry run (the GPU machine's missing packages)."""
    m = re.search(r'sitecustomize\.py" <<\'EOF\'\n(.*?)\nEOF\n', SCRIPT.read_text(encoding="utf-8"), flags=re.S)
    assert m, "scripts/gpu_smoke.sh no longer writes its sitecustomize.py with a quoted EOF here-document"
    return m.group(1) + "\n"


@pytest.mark.slow
def test_every_pytest_step_passes_on_cpu_in_one_process(tmp_path):
    site = tmp_path / "path"
    site.mkdir()
    # the script's sitecustomize, and one line that shows it is in force in the pytest process
    probe = "\ntry:\n    import ray\nexcept ModuleNotFoundError as e:\n    print(e)\n"
    (site / "sitecustomize.py").write_text(_absent_packages_sitecustomize() + probe, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               GPU_SMOKE_CPU="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", GPU_SMOKE_DIR=str(tmp_path / "models"),
               DRMAS_CACHE_DIR=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-rA", "-p", "no:cacheprovider", "-m", "gpu",
                        "tests/test_gpu_smoke.py", "tests/test_memory.py", "tests/test_losses.py"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=400 * math.ceil(busy_factor()))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "No module named 'ray' (absent on the GPU machine)" in out  # the sitecustomize was in force
    passed = set(re.findall(r"^PASSED tests/test_gpu_smoke\.py::(\S+)", out, flags=re.M))
    want = {"test_build", "test_engine", "test_pool", "test_train[adamw]", "test_train[offload]", "test_train_tis",
            "test_train_lora", "test_train_row", "test_faiss"}
    assert want <= passed, (sorted(want - passed), out[-4000:])
    assert out.count("RESULT {") >= len(want), out[-4000:]
