"""``train --plan``'s flags honoured or refused: ``--gpus N`` re-plans the recipe's
ranks on N GPUs and says which ``--set`` trains that layout, or refuses in one line naming the setting
that fits; no plan lays out more GPUs than it was given; ``--gpus`` and ``--gpu-memory`` are positive;
the header says where each figure came from; a recipe too small for GPU figures says so."""

from __future__ import annotations

import pytest

from drmas_bench.cli import main
from drmas_bench.commands.train import plan_recipe
from drmas_bench.types import UserError
from drmas_trainer.config.train import load_config

ROW = "math_qwen3_4b"  # a reference row: 2 worker groups, fsdp.ranks 4, colocated


@pytest.mark.parametrize("flag, value", [("--gpus", "0"), ("--gpus", "-1"), ("--gpus", "two"),
                                         ("--gpu-memory", "0"), ("--gpu-memory", "-5"), ("--gpu-memory", "nan")])
def test_a_gpu_count_or_memory_that_is_not_positive_is_refused_in_one_line(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--recipe", ROW, "--plan", flag, value])
    assert e.value.code == 2
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert f"argument {flag}: must be" in line and repr(value) in line


# --gpus N on the 4-rank colocated row: (GPUs laid out, the --set that trains it); declared, not computed
PROBES = {1: (1, "--set fsdp.ranks=1 --set ray.gpus_per_worker=0.5"), 2: (2, "--set fsdp.ranks=2"),
          3: (3, "--set fsdp.ranks=3"), 4: (4, ""), 8: (8, "--set fsdp.ranks=8")}


@pytest.mark.parametrize("gpus", sorted(PROBES))
def test_gpus_replans_the_ranks_and_says_which_setting_trains_it(gpus):
    plan, est = plan_recipe(load_config(ROW), gpu_gib=141, gpus=gpus)
    laid_out, sets = PROBES[gpus]
    assert plan.n_gpus == laid_out == est.gpus
    assert len({g for gpu in plan.gpus for g in gpu}) == 2  # both groups planned
    note = est.sources["GPUs"]
    assert note.startswith(f"--gpus {gpus}:")
    assert (f"train it with {sets}" in note) if sets else "re-planned" not in note


def test_gpus_1_with_fsdp_ranks_1_lays_out_one_gpu_and_the_plan_says_so(capsys):
    """The issue's probe: it said "fits" while laying out GPU 0 and GPU 1 ("2 x NVIDIA H200")."""
    rc = main(["train", "--recipe", ROW, "--plan", "--gpus", "1", "--gpu-memory", "141", "--set", "fsdp.ranks=1"])
    out = capsys.readouterr().out
    assert rc == 0 and "hours on 1 x NVIDIA H200" in out
    assert "GPU 1" not in out.replace("GPU 141", "")  # no second GPU anywhere in the plan
    assert "--set ray.gpus_per_worker=0.5" in out


def test_separate_groups_on_fewer_gpus_than_groups_are_refused_naming_the_setting_that_fits():
    cfg = load_config(ROW, {"fsdp.layout": "separate", "fsdp.ranks": 1})
    with pytest.raises(UserError, match=r"^--gpus 1: fsdp.layout separate .*--set fsdp.layout=colocated fits them"):
        plan_recipe(cfg, gpus=1)
    plan, est = plan_recipe(cfg, gpus=5)  # 2 groups x 2 ranks of their own: 4 of the 5, said
    assert plan.n_gpus == 4 and "4 of the 5 GPUs" in est.sources["GPUs"]


def test_the_header_names_where_each_figure_came_from():
    cfg = load_config(ROW)  # plan.gpu: h100
    plan, est = plan_recipe(cfg)
    assert plan.memory_source == "the recipe's plan.gpu: h100" and est.sources["GPU"] == "the recipe's plan.gpu"
    plan, est = plan_recipe(cfg, gpu_gib=141)
    assert plan.memory_source == "--gpu-memory" and est.sources["GPU"] == "nearest --gpu-memory"
    assert plan.prompt_source == "the recipe's plan.prompt_tokens"
    plan, est = plan_recipe(load_config("tiny"))  # no plan.gpu, no plan.prompt_tokens, no flag
    assert plan.memory_source == "default: an H200" and est.sources["GPU"] == "default"
    assert plan.prompt_source.startswith("default") and plan.seq == 4096 + load_config("tiny").rollout.max_new_tokens
    plan, _ = plan_recipe(load_config("tiny"), prompt_tokens=256)
    assert plan.prompt_source == "--prompt-tokens" and plan.seq == 256 + load_config("tiny").rollout.max_new_tokens


def test_a_recipe_too_small_for_gpu_figures_says_so_instead_of_zero_hours(capsys):
    assert main(["train", "--recipe", "tiny", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "too small for GPU figures to mean anything" in out and " h predicted" not in out


def test_a_plan_flag_without_plan_is_refused_not_ignored(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--recipe", "tiny", "--gpus", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--gpus is a --plan flag" in err and "fsdp.ranks" in err and not out.exists()
