"""The heterogeneous tiny team (trainer/recipes/tiny_hetero.yaml: a Qwen2 solver, a Llama checker,
each with its own tokenizer) with 2 gloo ranks per worker group as Ray actors (FSDP2 over 2 logical
GPUs, colocated), checkpointing into a ``file://`` URL root, resumed from it by 2 ranks again, and
evaluated from the URL: the checks of tests/test_hetero.py on the sharded layout. Slow tier; its own
file so that CI's slow tier runs it with the other Ray files (.ci/run) and the in-process test beside them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_hetero import BANDS, MODELS, _check_checkpoint, _check_eval, _tokenizers  # tests/ is on sys.path


@pytest.mark.slow
def test_tiny_hetero_with_two_ranks_per_group_into_a_url_root(tmp_path, monkeypatch):
    """The same with 2 gloo ranks per group as Ray actors (FSDP2 over 2 logical GPUs, colocated),
    checkpointing into a file:// URL root (each rank uploads its own optimiser shard), resumed from
    that URL by 2 ranks again for a third step, then `eval --model URL/latest`."""
    from drmas_bench.cli import main

    root = tmp_path / "bucket" / "hetero"
    url = root.as_uri()
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    sharded = ["--recipe", "tiny_hetero", "--ray", "--set", "ray.num_gpus=2", "--set", "ray.num_cpus=2",
               "--set", "fsdp.ranks=2", "--set", f"ckpt_root={url}", "--out", str(run), "--no-progress"]

    def cli(*args: str) -> subprocess.CompletedProcess:  # each Ray run in its own process, as a user starts it
        return subprocess.run([sys.executable, "-m", "drmas_bench", "train", *args], env=env, capture_output=True,
                              text=True, timeout=1200)

    got = cli(*sharded)
    assert got.returncode == 0, got.stderr[-2000:]
    workers = json.loads((run / "workers.json").read_text())["worker_groups"]
    assert [len(w["ranks"]) for w in workers] == [2, 2] and {w["backend"] for w in workers} == {"gloo"}
    assert main(["regress", str(run), "--against", str(BANDS)]) == 0
    assert (root / "latest").read_text() == "step_2\n" and not (run / "ckpt").exists()
    for wg in MODELS:
        shards = root / "step_2" / "optim" / f"{wg}.dcp"
        assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    _check_checkpoint(root / "step_2")

    got = cli(*sharded, "--steps", "3", "--resume")
    assert got.returncode == 0, got.stderr[-2000:]
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert (root / "latest").read_text() == "step_3\n"
    _check_checkpoint(root / "step_3")
    toks = _tokenizers()
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))  # where eval downloads the URL's checkpoint
    assert main(["eval", "--model", f"{url}/latest", "--suite", "toy", "--limit", "2", "--n", "1",
                 "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    _check_eval(tmp_path / "eval", toks)
