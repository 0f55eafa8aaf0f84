"""scripts/gpu_smoke.sh is what a session with a borrowed GPU runs once, with minutes to spare; its
CPU dry run (same steps, tiny sizes, the GPU machine's missing packages made absent) runs here so
the script does not rot between GPU sessions (a renamed config key once broke its `cli` step)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_smoke_cpu_dry_run_passes(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=sys.executable, OMP_NUM_THREADS="1")
    p = subprocess.run(["bash", "scripts/gpu_smoke.sh", "--cpu"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=600)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-4000:]
    for step in ("build", "engine", "pool", "train", "train-tis", "faiss", "encoder", "train-lora", "cli"):
        assert f"PASS {step} " in log, (step, log[-4000:])
    assert "gpu_smoke: PASSED" in (tmp_path / "out" / "gpu_smoke.log").read_text()
