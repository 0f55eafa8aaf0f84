"""``val:`` checked at load: a wrong ``keep_best`` (a name validation does not log,
the wrong n, validation off) or a benchmark of another grading family is refused in one line before
the run folder exists, not after the warm start, a step-0 checkpoint and a validation."""

from __future__ import annotations

import argparse

import pytest

from drmas_bench.cli import main
from drmas_bench.commands.train import _resume_argv
from drmas_bench.types import UserError
from drmas_bench.workflows.base import get_workflow
from drmas_trainer.config.train import load_config
from drmas_trainer.val_checks import check_val

VAL = ["--set", "val.every=2", "--set", "val.benchmarks=toy", "--set", "val.n=4"]  # tiny: toy, n 4

REFUSED = {  # keep_best -> what the one line says (the docs' own example first: avg@1 with val.n 4)
    "val/avg@1": "logs avg@4, not avg@1; set val.keep_best=val/avg@4",
    "val/toy/avg@2": "logs avg@4, not avg@2; set val.keep_best=val/toy/avg@4",
    "val/bogus": "no validation logs it",
    "val/pass@5": "logs pass@1 .. pass@4",
    "val/math500/avg@4": "'math500' is none of the validated benchmarks",
    "val/questions": "counts work, not a score",
    "val/agent/critic/valid/mean": "no agent 'critic' in the team",
}


@pytest.mark.parametrize("metric", sorted(REFUSED))
def test_a_wrong_keep_best_is_refused_in_one_line_before_the_run_folder_exists(metric, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--recipe", "tiny", *VAL, "--set", f"val.keep_best={metric}", "--out", str(out)]) == 2
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert line.startswith(f"drmas-bench: error: val.keep_best {metric!r}") and REFUSED[metric] in line
    assert "--resume" not in line
    assert not out.exists()


def test_keep_best_with_validation_off_is_refused_before_the_run_folder_exists(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "--recipe", "tiny", "--set", "val.every=0", "--set", "val.before_train=false",
               "--set", "val.keep_best=val/avg@4", "--out", str(out)])
    assert rc == 2 and "validation is off" in capsys.readouterr().err and not out.exists()


def test_a_benchmark_of_another_grading_family_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--recipe", "tiny", "--set", "val.benchmarks=math500", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "math500 is graded as math" in err and "toy" in err and not out.exists()


@pytest.mark.parametrize("metric", ["val/avg@4", "val/pass@2", "val/toy/avg@4", "val/toy/test_score",
                                    "val/macro/avg@4", "val/agent/solver/valid/mean"])
def test_the_names_validation_logs_pass(metric):
    cfg = load_config("tiny", {"val.keep_best": metric})
    check_val(cfg, get_workflow(cfg.workflow))


def test_a_sampled_sets_data_sources_are_known_names():
    cfg = load_config("math_qwen3_4b", {"val.keep_best": "val/aime24/test_score"})
    check_val(cfg, get_workflow(cfg.workflow))
    with pytest.raises(UserError, match="'aime26' is none of the validated benchmarks or their data sources"):
        check_val(load_config("math_qwen3_4b", {"val.keep_best": "val/aime26/avg@1"}), get_workflow(cfg.workflow))


def test_a_refusal_after_a_checkpoint_names_the_command_that_continues():
    args = argparse.Namespace(argv=["drmas-bench", "train", "--recipe", "tiny", "--fresh", "--out", "r"])
    assert _resume_argv(args) == ["--recipe", "tiny", "--out", "r", "--resume"]


def test_a_fractional_count_is_named_once_with_its_value():
    with pytest.raises(UserError, match=r"rollout\.n: must be a whole number, got 2\.5$"):
        load_config("tiny", {"rollout.n": 2.5})


def test_a_rollout_budget_that_awake_engines_would_ignore_is_refused_at_load():
    with pytest.raises(UserError, match=r"rollout: engines: awake keeps every engine awake, so a budget"):
        load_config("tiny", {"rollout.engines": "awake", "rollout.engines_awake": 1})
    load_config("tiny", {"rollout.engines": "pooled", "rollout.engines_awake": 1})  # the budget is its to use
