"""End-to-end runs of the trainer on a micro version of the tiny recipe: a local run (CLI, checkpoints,
team.yaml, eval of the trained team), SIGKILL + --resume against an uninterrupted run, a Ray run
with logical GPUs, and the regression check / plot commands."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from drmas_bench.types import UserError

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
# a micro tiny: 2 prompts x 4 rollouts, 6 new tokens, a 3-step warm start
MICRO = ["sft.steps=3", "sft.batch_size=8", "rollout.prompts_per_step=2", "rollout.n=4",
         "rollout.max_new_tokens=6", "data.size=40", "agent_defaults.micro_batch_size=16",
         "val.before_train=false", "val.every=0"]  # the recipe's validation: tests/test_validation.py


def train_args(out: Path, *extra: str, steps: int = 3, **kw) -> argparse.Namespace:
    ns = dict(recipe="tiny", estimator="drmas", loss=None, shared=False, out=str(out), steps=steps, seed=0,
              set=list(MICRO) + list(extra), resume=False, fresh=False, local=True, ray=False, no_progress=True)
    ns.update(kw)
    return argparse.Namespace(**ns)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_tiny_run_end_to_end_and_eval_of_the_trained_team(tmp_path, capsys):
    from drmas_bench.agents.team import build_team
    from drmas_bench.commands.train import cmd_regress, cmd_train

    run = tmp_path / "run"
    assert cmd_train(train_args(run, "save_every=2", shared=True, loss="gspo")) == 0
    err = capsys.readouterr().err  # the quiet minute before step 1 says what it is doing
    assert "[train] starting 1 worker group(s) (shared)" in err and "supervised warm start (sft): 3 steps" in err
    assert "ckpt/step_0" in err and "3 RL step(s) to go" in err
    recs = records(run)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert [r["data_cursor"] for r in recs] == [0, 2, 4]
    for r in recs:
        assert 0.0 <= r["critic/score/mean"] <= 1.0 and r["agent/solver/num_calls/mean"] >= 1.0 and r["agent/checker/num_calls/mean"] <= 1.0
        assert {"agent/solver/actor/grad_norm", "agent/checker/actor/grad_norm", "agent/solver/critic/advantages/mean", "agent/checker/critic/advantages/std", "actor/pg_clipfrac",
                "actor/ppo_kl", "actor/entropy", "timing_s/step", "actor/skipped_steps"} <= set(r)
    ck = run / "ckpt"
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_0", "step_2", "step_3"]
    assert (ck / "latest").resolve().name == "step_3"
    team_yaml = yaml.safe_load((ck / "latest" / "team.yaml").read_text())
    assert team_yaml["trained"]["estimator"] == "drmas" and team_yaml["agents"] == {"solver": "shared", "checker": "shared"}
    # eval rebuilds the trained team from the checkpoint folder alone
    team = build_team("toy", ("solver", "checker"), model=str(ck / "latest"))
    assert list(team.worker_groups) == ["shared"]
    assert Path(team.worker_groups["shared"].model, "model.safetensors").is_file()
    from drmas_bench.cli import main

    assert main(["eval", "--model", str(ck / "latest"), "--suite", "toy", "--limit", "3", "--n", "1",
                 "--out", str(tmp_path / "eval"), "--concurrency", "8", "--max-batch", "8", "--no-progress"]) == 0
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())
    # a second start without --resume refuses to mix into the run
    with pytest.raises(UserError, match="--resume"):
        cmd_train(train_args(run, "save_every=2"))
    # the regression check runs on it (loose bands)
    bands = tmp_path / "bands.json"
    bands.write_text(json.dumps({"bands": [{"metric": "critic/score/mean", "stat": "count", "min": 3},
                                           {"metric": ["critic/score/mean", "actor/loss"], "stat": "nonfinite", "max": 0}]}))
    assert cmd_regress(argparse.Namespace(run=str(run), against=str(bands))) == 0


def test_sigkill_then_resume_continues_like_an_uninterrupted_run(tmp_path):
    from drmas_bench.commands.train import cmd_train

    steps = 4
    extra = ("save_every=1", "sft.steps=0")  # no warm start: step_0 is the base model
    full = tmp_path / "full"
    assert cmd_train(train_args(full, *extra, steps=steps)) == 0

    killed = tmp_path / "killed"
    script = ("import sys; from drmas_bench.commands.train import register; import argparse; "
              "p = argparse.ArgumentParser(); s = p.add_subparsers(); register(s); "
              "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))")
    cmd = [sys.executable, "-c", script, "train", "--recipe", "tiny", "--estimator", "drmas", "--out", str(killed),
           "--steps", str(steps), "--seed", "0", "--local", "--no-progress"]
    for s in MICRO + list(extra):
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = killed / "ckpt" / "step_1" / "COMPLETE"
    t0 = time.time()
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"the training subprocess ended before its first checkpoint: {proc.stderr.read().decode()[-800:]}")
        if time.time() - t0 > 240:
            proc.kill()
            pytest.fail("no checkpoint within 240 s")
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    from drmas_trainer.checkpoint import latest_checkpoint

    at_kill, _ = latest_checkpoint(killed / "ckpt")
    assert 1 <= at_kill < steps, "the kill should land mid-run"
    # the kill lands before or after step K's metrics line: make it the harder case, every time
    log = killed / "metrics.jsonl"
    log.write_text("".join(x + "\n" for x in log.read_text().splitlines() if json.loads(x)["step"] < at_kill))
    # resume: continues from the last complete checkpoint with the same data cursor
    assert cmd_train(train_args(killed, *extra, steps=steps, resume=True)) == 0
    a, b = records(full), records(killed)
    assert [r["step"] for r in b] == list(range(1, steps + 1))  # every step exactly once
    for ra, rb in zip(a, b):
        assert ra["data_cursor"] == rb["data_cursor"] and ra["tasks"] == rb["tasks"]
        assert ra["critic/score/mean"] == rb["critic/score/mean"]  # same prompts, seeds and weights: same rollouts
    state = json.loads((killed / "ckpt" / "latest" / "trainer_state.json").read_text())
    assert state["step"] == steps and state["cursor"] == steps * 2


def test_a_resume_from_step_0_whose_validation_line_was_cut_off_validates_it(tmp_path):
    # a stop after ckpt/step_0's commit, before the before-RL validation's line: the resume validates
    # the step-0 team then, once, as the uninterrupted run did
    val = ("val.before_train=true", "val.every=1", "val.limit=4", "val.n=1", "save_every=1")
    full, cut = tmp_path / "full", tmp_path / "cut"
    from drmas_bench.commands.train import cmd_train

    assert cmd_train(train_args(full, *val, steps=1)) == 0
    assert cmd_train(train_args(cut, *val, steps=1)) == 0
    shutil.rmtree(cut / "ckpt" / "step_1")  # resuming trusts the COMPLETE markers: step_0 is the newest
    shutil.rmtree(cut / "val" / "step_1")
    (cut / "metrics.jsonl").write_text("")  # val/step_0 stays: the validation ran, its line was cut off
    assert cmd_train(train_args(cut, *val, steps=1, resume=True)) == 0
    a, b = records(full), records(cut)
    assert [r["step"] for r in b] == [0, 1]
    assert b[0]["val/avg@1"] == a[0]["val/avg@1"] and b[1]["critic/score/mean"] == a[1]["critic/score/mean"]


def test_ray_run_with_logical_gpus(tmp_path):
    pytest.importorskip("ray")
    from drmas_trainer.config.train import load_config, parse_override
    from drmas_trainer.ray_workers import init_ray, shutdown_ray
    from drmas_trainer.trainer import train

    overrides = dict(parse_override(s) for s in MICRO + ["sft.steps=1", "steps=2"])
    cfg = load_config("tiny", overrides)
    assert init_ray(num_cpus=2, num_gpus=2)  # two logical GPUs on this CPU machine
    try:
        summary = train(cfg, tmp_path / "ray", use_ray=True, progress=False)
    finally:
        shutdown_ray()
    assert summary["steps"] == 2
    recs = records(tmp_path / "ray")
    assert all(math.isfinite(r["agent/solver/actor/grad_norm"]) and math.isfinite(r["agent/checker/actor/grad_norm"]) for r in recs)
    assert (tmp_path / "ray" / "ckpt" / "step_2" / "models" / "checker" / "model.safetensors").is_file()
    # each worker group ran in its own actor process on its own logical GPU
    infos = json.loads((tmp_path / "ray" / "workers.json").read_text())
    assert infos["ray"] is True
    groups = infos["worker_groups"]
    assert sorted(g["name"] for g in groups) == ["checker", "solver"]
    assert len({g["pid"] for g in groups} | {os.getpid()}) == 3
    assert all(len(g["ray_gpu_ids"]) == 1 for g in groups) and groups[0]["ray_gpu_ids"] != groups[1]["ray_gpu_ids"]
