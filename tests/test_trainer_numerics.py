"""Trainer numerics: learning rates checked at config load, the NaN/inf guard of the supervised warm
start, strict-JSON metrics (null for non-finite values, read back by regress and plot), and a run in
which no update was ever applied exits non-zero with one line."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch

from drmas_bench.types import UserError
from drmas_trainer.config.train import AgentConfig, load_config
from drmas_bench.suites.toy.toy import toy_sft_examples
from drmas_trainer.runlog import MetricsLog, json_line, never_updated, read_metrics
from drmas_trainer.worker import SFT_MAX_BAD_IN_A_ROW, WorkerGroup

torch.set_num_threads(1)


def _strict(line: str) -> dict:
    def bad(c: str) -> None:
        raise ValueError(f"non-standard JSON constant {c}")

    return json.loads(line, parse_constant=bad)


# ------------------------------------------------------------------------------------ learning rates

@pytest.mark.parametrize("key", ["agent_defaults.lr", "agents.solver.lr", "sft.lr"])
@pytest.mark.parametrize("value", [float("nan"), -1e-4, float("inf"), "nan", float("-inf")])
def test_bad_learning_rates_are_one_line_errors_naming_the_key(key, value):
    with pytest.raises(UserError) as e:
        load_config("tiny", {key: value})
    msg = str(e.value)
    assert f"{key}: must be a finite number >= 0" in msg and "\n" not in msg


def test_zero_and_small_learning_rates_load():
    cfg = load_config("tiny", {"agent_defaults.lr": 0, "sft.lr": "1e-6"})
    assert cfg.agent_defaults["lr"] == 0 and cfg.sft.lr == 1e-6


# ------------------------------------------------------------------------------------ SFT guard

@pytest.fixture(scope="module")
def tiny_path() -> str:
    from drmas_bench.models import resolve_model

    got = resolve_model("tiny-random")
    return str(getattr(got, "path", got))


def _sft(wg: WorkerGroup, steps: int) -> dict:
    ex = toy_sft_examples(["solver"], 8, seed=0)
    return asyncio.run(wg.sft(ex, steps=steps, lr=1e-3, batch_size=4, seed=0))


def test_sft_skips_a_non_finite_step_and_goes_on(tiny_path):
    wg = WorkerGroup("solver", ["solver"], AgentConfig(micro_batch_size=4), tiny_path, device="cpu")
    calls = {"n": 0}

    def poison_first(g):  # a real backward pass whose gradient turns NaN on the first step only
        calls["n"] += 1
        return g * float("nan") if calls["n"] == 1 else g

    hook = wg.params[0].register_hook(poison_first)
    out = _sft(wg, steps=4)
    hook.remove()
    assert out["sft_skipped"] == 1 and out["sft_steps"] == 3 and "sft_aborted" not in out
    assert math.isfinite(out["sft_loss_last"]) and wg.weights_finite()


def test_sft_stops_after_k_bad_steps_in_a_row_with_weights_untouched(tiny_path):
    wg = WorkerGroup("solver", ["solver"], AgentConfig(micro_batch_size=4), tiny_path, device="cpu")
    before = [p.detach().clone() for p in wg.policy.parameters()]
    hook = wg.params[0].register_hook(lambda g: g * float("inf"))
    out = _sft(wg, steps=SFT_MAX_BAD_IN_A_ROW + 10)
    hook.remove()
    assert out["sft_steps"] == 0 and out["sft_skipped"] == SFT_MAX_BAD_IN_A_ROW
    assert "in a row had a non-finite gradient" in out["sft_aborted"]
    assert out["sft_loss_first"] is None  # no applied step, no loss to report
    assert all(torch.equal(a, p) for a, p in zip(before, wg.policy.parameters()))
    json.loads(json_line(out))  # sft.json stays strict JSON


# ------------------------------------------------------------------------------------ metrics.jsonl

def test_metrics_are_strict_json_with_null_and_readers_accept_it(tmp_path):
    from drmas_trainer.reports.plot import plot_runs
    from drmas_trainer.reports.regress import check_band

    log = MetricsLog(tmp_path, tracker="none")
    log.write({"step": 1, "critic/score/mean": 0.5, "actor/loss": float("nan"), "agent/solver/actor/grad_norm": float("inf"),
               "wg/solver/actor/optimizer_steps": 0, "wg/solver/actor/skipped_steps": 2, "nested": [1.0, float("-inf")]})
    log.write({"step": 2, "critic/score/mean": float("nan"), "actor/loss": 0.25, "agent/solver/actor/grad_norm": 1.5,
               "wg/solver/actor/optimizer_steps": 2, "wg/solver/actor/skipped_steps": 0})
    log.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    recs = [_strict(x) for x in lines]
    assert recs[0]["actor/loss"] is None and recs[0]["agent/solver/actor/grad_norm"] is None and recs[0]["nested"] == [1.0, None]
    assert read_metrics(tmp_path) == recs
    # regress still counts a null as non-finite, and skips it in max
    (ok, line), = check_band(recs, {"metric": ["actor/loss", "agent/*/actor/grad_norm"], "stat": "nonfinite", "max": 0})
    assert not ok and "= 2" in line
    (ok, _), = check_band(recs, {"metric": "actor/loss", "stat": "last", "max": 1})
    assert ok
    path, spread = plot_runs([tmp_path], tmp_path / "c.png")
    assert path.stat().st_size > 0 and spread[tmp_path.name]["solver"]["max"] == 1.5
    # MetricsLog keeps strict JSON when it rewrites the file on resume
    MetricsLog(tmp_path, keep_until=1, tracker="none").close()
    assert [_strict(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]


def test_a_resume_logs_the_checkpoint_record_of_a_step_stopped_before_its_line(tmp_path):
    # the run stopped after step 2's checkpoint committed and before its metrics line: the resume
    # logs the record the checkpoint carries, once, and no record past the checkpoint survives
    log = MetricsLog(tmp_path, tracker="none")
    for step in (1, 3):
        log.write({"step": step, "critic/score/mean": step / 10})
    log.close()
    saved = {"step": 2, "critic/score/mean": 0.2, "actor/loss": None}
    MetricsLog(tmp_path, keep_until=2, tracker="none", restore=saved).close()
    assert read_metrics(tmp_path) == [{"step": 1, "critic/score/mean": 0.1}, saved]
    MetricsLog(tmp_path, keep_until=2, tracker="none", restore=saved).close()  # a second resume: still once
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    MetricsLog(tmp_path, keep_until=1, tracker="none", restore=saved).close()  # another step's record: not logged
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]


def test_never_updated_names_groups_that_only_skipped():
    recs = [{"wg/a/actor/optimizer_steps": 0, "wg/a/actor/skipped_steps": 2, "wg/b/actor/optimizer_steps": 1, "wg/b/actor/skipped_steps": 1,
             "wg/c/actor/optimizer_steps": 0, "wg/c/actor/skipped_steps": 0},
            {"wg/a/actor/optimizer_steps": None, "wg/a/actor/skipped_steps": 2, "wg/b/actor/optimizer_steps": 0, "wg/b/actor/skipped_steps": 2}]
    assert never_updated(recs, ["a", "b", "c"]) == ["a"]  # c had no rows at all: not a failure


@pytest.mark.slow
def test_a_run_whose_every_update_was_skipped_exits_non_zero(tmp_path, capsys):
    """eps 0 and an untrained team: every group has all-equal scores, so every advantage is 0/0."""
    from drmas_bench.cli import main

    out = tmp_path / "run"
    rc = main(["train", "--recipe", "tiny", "--steps", "1", "--no-progress", "--local", "--out", str(out),
               "--set", "sft.steps=0", "--set", "sft.agent_steps={}", "--set", "algo.eps=0", "--set", "val.before_train=false",
               "--set", "val.every=0"])
    err = capsys.readouterr().err
    assert rc != 0
    line = [x for x in err.splitlines() if "no optimizer step was applied" in x]
    assert line and "solver" in line[0] and "checker" in line[0]
    recs = [_strict(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 1 and recs[0]["actor/loss"] is None and recs[0]["actor/skipped_steps"] > 0
