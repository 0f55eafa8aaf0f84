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


@pytest.mark.parametrize("recipe", ROWS)
def test_a_row_fits_its_gpus_and_8_h200s_and_says_how_long(recipe, capsys):
    assert main(["train", "--recipe", recipe, "--plan", "--gpu-memory", "80"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "rollout budget on GPU 0" in out and "h predicted; the reference reports" in out
    assert main(["train", "--recipe", recipe, "--plan", "--gpus", "8", "--gpu-memory", "141"]) == 0
    out = capsys.readouterr().out
    assert "H200" in out and "h predicted" in out and "the reference reports" not in out  # not its hardware


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
