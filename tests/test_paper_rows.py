"""The reference's compute table, row by row: every recipe with ``plan.reported_hours`` is one
row; each plans to fit its own hardware (its fsdp ranks of 80 GB H100s) and 8 x 141 GB, prints the
rollout budget's reasons and the predicted hours, and docs/trainer.md shows those hours beside the
reported ones. A recipe that does not fit says why in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from drmas_bench.cli import main
from drmas_bench.commands.train import plan_recipe
from drmas_trainer.config.train import RECIPES_DIR, load_config

REPO = Path(__file__).resolve().parent.parent
ROWS = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")
              if ((yaml.safe_load(p.read_text()) or {}).get("plan") or {}).get("reported_hours"))


def test_the_nine_rows_have_a_recipe_each():
    assert len(ROWS) == 9
    cfgs = [load_config(r) for r in ROWS]
    assert sorted(c.fsdp.ranks for c in cfgs) == [4] * 4 + [8] * 5  # the README: 4 rows on 4 GPUs, 5 on 8
    assert all(c.plan.gpu == "h100" for c in cfgs)


# the reference README's compute table: the GPUs of each row (4B / 3B rows on 4, 7B / 8B / hetero on 8)
ROW_GPUS = {"math_qwen3_4b": 4, "math_qwen3_4b_shared": 4, "math_qwen3_8b": 8, "math_qwen3_8b_shared": 8,
            "search_hetero_llama3.2_3b_qwen2.5_7b": 8, "search_qwen2.5_3b": 4, "search_qwen2.5_3b_shared": 4,
            "search_qwen2.5_7b": 8, "search_qwen2.5_7b_shared": 8}


def laid_out(plan) -> int:
    """The GPUs a memory plan lays out, counted from its parts: the GPU indices its phases use (each
    a row of its layout, none skipped) times the ranks each row stands for."""
    used = {p.gpu for p in plan.phases}
    assert used == set(range(len(plan.gpus))), (used, plan.gpus)
    return plan.ranks * len(used)


def cli_plan(args: list[str], capsys) -> tuple[int, dict[str, int | str]]:
    """``train --plan`` through the CLI: (exit code, what its output says it laid out): the GPU
    indices of its phase table, the ``hours on N x`` count, or the one error line."""
    rc = main(["train", "--plan", *args])
    cap = capsys.readouterr()
    said: dict[str, int | str] = {"err": cap.err.strip()}
    table = {int(g) for g in re.findall(r"^  (\d+) {2,}[a-z]", cap.out, re.M)}
    hours = re.search(r"^hours on (\d+) x (.+?) \(", cap.out, re.M)
    if hours:
        said.update(table_rows=len(table), hours_gpus=int(hours.group(1)), gpu=hours.group(2))
    return rc, said


@pytest.mark.parametrize("recipe", ROWS)
def test_a_row_lays_out_its_gpus_and_8_h200s_never_more_than_given(recipe, capsys):
    """Each row lays out the GPUs of its README row on its own H100s, and all 8 of a node of 8 x H200
    (``--gpus 8`` re-plans a 4-GPU row's ranks); a node of fewer GPUs than the row needs is re-planned
    on no more than it has, or refused in one line. The plan's parts, the CLI's table and its hours
    agree."""
    want = ROW_GPUS[recipe]
    rc, said = cli_plan(["--recipe", recipe, "--gpu-memory", "80"], capsys)
    plan, est = plan_recipe(load_config(recipe), gpu_gib=80)
    assert rc == 0 and plan.fits, said["err"]
    assert laid_out(plan) == est.gpus == said["hours_gpus"] == want, (recipe, said)
    assert said["table_rows"] == len(plan.gpus) and "H100" in str(said["gpu"]) and est.reported_hours
    rc, said = cli_plan(["--recipe", recipe, "--gpus", "8", "--gpu-memory", "141"], capsys)
    plan, est = plan_recipe(load_config(recipe), gpu_gib=141, gpus=8)
    assert rc == 0 and plan.fits, said["err"]
    assert laid_out(plan) == est.gpus == said["hours_gpus"] == 8, (recipe, said)  # a 4-GPU row re-planned on 8
    assert "H200" in str(said["gpu"]) and est.reported_hours is None  # not its hardware: nothing to compare with
    rc, said = cli_plan(["--recipe", recipe, "--gpus", str(want // 2), "--gpu-memory", "141"], capsys)
    if rc == 0:  # re-planned onto the GPUs given
        assert said["hours_gpus"] <= want // 2, (recipe, said)
    else:
        assert rc == 2 and re.fullmatch(rf"drmas-bench: error: .*--gpus is {want // 2}\b.*", str(said["err"])), said


def test_one_gpu_given_is_never_two_laid_out(capsys):
    over = ["--set", "fsdp.ranks=1"]
    rc, said = cli_plan(["--recipe", "math_qwen3_4b", "--gpus", "1", "--gpu-memory", "141", *over], capsys)
    if rc == 0:
        plan, _ = plan_recipe(load_config("math_qwen3_4b", {"fsdp.ranks": 1}), gpu_gib=141, gpus=1)
        assert laid_out(plan) <= 1 and said["hours_gpus"] <= 1, said
    else:
        assert rc == 2 and "--gpus" in str(said["err"]), said


def test_a_row_that_does_not_fit_says_why_in_one_line(capsys):
    assert main(["train", "--recipe", "math_qwen3_8b", "--plan", "--gpu-memory", "40"]) == 1
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if "does not fit" in ln]
    assert "update solver on GPU 0 needs" in line and "the largest item: activations" in line
    assert main(["train", "--recipe", "math_qwen3_8b", "--plan", "--gpu-memory", "80",
                 "--set", "agent_defaults.engine_options.mem_fraction_static=0.9"]) == 1
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if "does not fit" in ln]
    assert "not even one engine fits" in line and "mem_fraction_static <=" in line


def test_docs_show_each_rows_predicted_and_reported_hours():
    text = (REPO / "docs" / "trainer.md").read_text(encoding="utf-8")
    text = text[text.index("## How long a run takes"):]
    text = text[:text.index("\n## ", 10)]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", text, re.M)}
    for recipe in ROWS:
        plan, est = plan_recipe(load_config(recipe), gpu_gib=80)
        line = rows.get(recipe)
        assert line is not None, f"docs/trainer.md has no row for {recipe}"
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert f"{plan.peak.bytes / 2**30:.1f}" in cells[3], (recipe, cells)
        assert cells[-3] == f"{est.hours:.1f}" and cells[-2] == f"{est.reported_hours:g}", (recipe, cells)
        assert cells[-1] == f"{est.hours / est.reported_hours:.2f}", (recipe, cells)
