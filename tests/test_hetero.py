"""A heterogeneous team, trained and evaluated (trainer/recipes/tiny_hetero.yaml): the toy workflow's
solver on tiny-random (Qwen2, ChatML, 2,458 tokens) and its checker on tiny-random-llama (Llama,
Llama 3's chat template, 1,536 tokens). Each worker group must keep its own tokenizer end to end:
the rows a group trains on are its own tokenizer's ids (the chat template rendered and encoded by
that tokenizer, the response ids decoding to the text the workflow used), its checkpoint folder holds
its own model and tokenizer, and `eval --model RUN/ckpt/latest` rebuilds the same two models.

The module's run (`trained`) is the recipe as CI would run it, in one process (its stored bands). The
first test checks it, resumes it for a third step and evaluates the checkpoint; the second does the
same with 2 gloo ranks per group as Ray actors (FSDP2) checkpointing into a ``file://`` URL root,
starting from the first run's warm-started team (its ``ckpt/step_0`` models, ``sft.steps=0``) so that
the warm start's 140 optimiser steps are not trained a second time over gloo. Slow tier; CI's slow tier
runs this file with the other Ray files (.ci/run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from drmas_bench.models import resolve_model

RECIPES = Path(__file__).resolve().parent.parent / "trainer" / "recipes"
BANDS = RECIPES / "tiny_hetero_bands.json"
#: worker group -> the alias its model was made from (the recipe's agents.<a>.model)
MODELS = {"solver": "tiny-random", "checker": "tiny-random-llama"}


def _tokenizers() -> dict[str, object]:
    from transformers import AutoTokenizer

    return {wg: AutoTokenizer.from_pretrained(resolve_model(alias)) for wg, alias in MODELS.items()}


def _check_rows(rows: dict[str, list], toks: dict[str, object]) -> None:
    """Every group's rows are its own tokenizer's ids: the prompt is that tokenizer's chat template,
    encoded by it, and the response ids decode (with it) to the text the workflow used; the other
    tokenizer reads them as something else."""
    heads = {"solver": "<|im_start|>system\n", "checker": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>"}
    assert set(rows) == set(MODELS) and all(rows.values())
    for wg, got in rows.items():
        tok, other = toks[wg], toks["checker" if wg == "solver" else "solver"]
        assert {r.agent for r in got} == {wg}
        for r in got:
            prompt = tok.decode(r.prompt_ids)
            assert prompt.startswith(heads[wg]), prompt[:80]
            assert tok(prompt, add_special_tokens=False)["input_ids"] == r.prompt_ids  # encoded by this tokenizer
            assert max(r.prompt_ids + r.response_ids) < len(tok)
            assert tok.decode(r.response_ids, skip_special_tokens=True) == r.text
            assert other(prompt, add_special_tokens=False)["input_ids"] != r.prompt_ids  # ids of this tokenizer only


def _check_checkpoint(step_dir: Path, base_models: dict[str, str] = MODELS) -> None:
    """team.yaml maps each agent to its own worker group and model folder; each folder holds the
    architecture and the very tokenizer of the model its group started from (``base_models``: what the
    run's agents.<a>.model named)."""
    team = yaml.safe_load((step_dir / "team.yaml").read_text())
    assert team["agents"] == {"solver": "solver", "checker": "checker"}
    assert {wg: (g["model"], g["engine"]) for wg, g in team["worker_groups"].items()} == \
        {wg: (f"models/{wg}", "hf") for wg in MODELS}
    assert {g["options"]["dtype"] for g in team["worker_groups"].values()} == {"bfloat16"}  # the recipe's engines
    assert team["trained"]["base_models"] == base_models
    kinds = {"solver": "qwen2", "checker": "llama"}
    for wg, alias in MODELS.items():
        folder = step_dir / "models" / wg
        assert json.loads((folder / "config.json").read_text())["model_type"] == kinds[wg]
        saved, own = (json.loads((f / "tokenizer.json").read_text()) for f in (folder, Path(resolve_model(alias))))
        for key in ("vocab", "merges"):  # the very vocabulary the group started from
            assert saved["model"][key] == own["model"][key], (wg, key)
        assert saved["added_tokens"] == own["added_tokens"]


def _check_eval(out: Path, toks: dict[str, object]) -> None:
    """The evaluated team is the heterogeneous one: each agent's prompt was counted in its own
    tokenizer's tokens (the two tokenizers count the same messages differently)."""
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2
    seen = set()
    for s in samples:
        for turn in s["turns"]:
            wg = turn["wg"]
            seen.add(wg)
            msgs = turn["request"]["messages"]
            counts = {name: len(t(t.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                                  add_special_tokens=False)["input_ids"]) for name, t in toks.items()}
            assert counts["solver"] != counts["checker"]
            assert turn["completion"]["prompt_tokens"] == counts[wg], (wg, turn["completion"]["prompt_tokens"], counts)
    assert seen == set(MODELS)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The recipe as CI runs it, in one process: its run folder, the rows each group trained on
    (recorded by wrapping WorkerGroup.score_rows) and a copy of its warm-started team's model folders
    (ckpt/step_0/models, taken before any test resumes the run)."""
    from drmas_bench.cli import main
    from drmas_trainer.worker import WorkerGroup

    tmp = tmp_path_factory.mktemp("hetero")
    rows: dict[str, list] = {}
    score_rows = WorkerGroup.score_rows

    async def recording(self, batch, **kwargs):  # the real method, its rows kept for the checks
        rows.setdefault(self.name, []).extend(r for r in batch if r.response_ids)
        return await score_rows(self, batch, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(WorkerGroup, "score_rows", recording)
    try:
        run = tmp / "run"
        assert main(["train", "--recipe", "tiny_hetero", "--local", "--out", str(run), "--no-progress"]) == 0
    finally:
        mp.undo()
    warm = tmp / "warm"
    shutil.copytree(run / "ckpt" / "step_0" / "models", warm)
    return run, rows, warm


@pytest.mark.slow
def test_tiny_hetero_trains_in_bands_keeps_each_tokenizer_resumes_and_evaluates(trained, tmp_path):
    """In one process: the recipe's bands, the rows each group trained on, its checkpoint, a resumed
    third step, eval."""
    from drmas_bench.cli import main

    run, rows, _ = trained
    assert main(["regress", str(run), "--against", str(BANDS)]) == 0
    toks = _tokenizers()
    _check_rows(rows, toks)
    _check_checkpoint(run / "ckpt" / "step_2")

    assert main(["train", "--recipe", "tiny_hetero", "--local", "--steps", "3", "--resume", "--out", str(run),
                 "--no-progress"]) == 0
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    _check_checkpoint(run / "ckpt" / "step_3")
    assert main(["eval", "--model", str(run / "ckpt" / "latest"), "--suite", "toy", "--limit", "2", "--n", "1",
                 "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    _check_eval(tmp_path / "eval", toks)


def _records(folder: Path) -> dict[str, dict]:
    """A run's records by task id, less what timing decides (wall and latency seconds, the run's name)."""
    out = {}
    for line in (folder / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        del r["run"], r["wall_s"]
        for t in r["turns"]:
            del t["completion"]["latency_s"]
        out[r["task"]["id"]] = r
    return out


@pytest.mark.slow
def test_tiny_hetero_with_two_ranks_per_group_into_a_url_root(trained, tmp_path, monkeypatch):
    """The same with 2 gloo ranks per group as Ray actors (FSDP2 over 2 logical GPUs, colocated),
    from the in-process run's warm-started team: 2 RL steps inside the recipe's bands, validated at
    step 2 on the ranks' engines (the same records as `eval --model` of the step's checkpoint),
    checkpointing into a file:// URL root (each rank uploads its own optimiser shard); resumed from
    that URL by 2 ranks again for a third step, then in one process (the sharded checkpoint read
    whole) for a fourth, then `eval --model URL/latest`. This is also CI's trainer run with several
    ranks per group: a tiny recipe with 2 ranks per group, inside its bands."""
    from drmas_bench.cli import main

    _, _, warm = trained
    root = tmp_path / "bucket" / "hetero"
    url = root.as_uri()
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    starts = {wg: str(warm / wg) for wg in MODELS}
    common = ["--recipe", "tiny_hetero", "--set", f"ckpt_root={url}", "--out", str(run), "--no-progress",
              "--set", "sft.steps=0", "--set", "sft.agent_steps={}",
              *(x for wg, folder in starts.items() for x in ("--set", f"agents.{wg}.model={folder}"))]
    sharded = [*common, "--ray", "--set", "ray.num_gpus=2", "--set", "ray.num_cpus=2", "--set", "fsdp.ranks=2"]
    val = ["--set", "val.every=2", "--set", "val.benchmarks=[toy]", "--set", "val.limit=8", "--set", "val.n=1"]

    def cli(*args: str) -> subprocess.CompletedProcess:  # each Ray run in its own process, as a user starts it
        return subprocess.run([sys.executable, "-m", "drmas_bench", "train", *args], env=env, capture_output=True,
                              text=True, timeout=1200)

    def steps() -> list[int]:
        return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]

    got = cli(*sharded, *val)
    assert got.returncode == 0, got.stderr[-2000:]
    workers = json.loads((run / "workers.json").read_text())["worker_groups"]
    assert [len(w["ranks"]) for w in workers] == [2, 2] and {w["backend"] for w in workers} == {"gloo"}
    assert main(["regress", str(run), "--against", str(BANDS)]) == 0
    assert (root / "latest").read_text() == "step_2\n" and not (run / "ckpt").exists()
    for wg in MODELS:
        shards = root / "step_2" / "optim" / f"{wg}.dcp"
        assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    _check_checkpoint(root / "step_2", starts)
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))  # where eval downloads the URL's checkpoints
    # the validation on the 2 ranks' engines (requests spread over both) = eval of the step's checkpoint
    assert main(["eval", "--model", f"{url}/step_2", "--benchmarks", "toy", "--limit", "8", "--n", "1",
                 "--out", str(tmp_path / "eval2"), "--no-progress"]) == 0
    validated = _records(run / "val" / "step_2")
    assert len(validated) == 8 and validated == _records(tmp_path / "eval2")

    got = cli(*sharded, "--steps", "3", "--resume")
    assert got.returncode == 0, got.stderr[-2000:]
    assert steps() == [1, 2, 3] and (root / "latest").read_text() == "step_3\n"
    _check_checkpoint(root / "step_3", starts)
    assert main(["train", *common, "--local", "--steps", "4", "--resume"]) == 0  # 2 ranks' shards read by one
    assert steps() == [1, 2, 3, 4] and (root / "latest").read_text() == "step_4\n"
    toks = _tokenizers()
    assert main(["eval", "--model", f"{url}/latest", "--suite", "toy", "--limit", "2", "--n", "1",
                 "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    _check_eval(tmp_path / "eval", toks)
