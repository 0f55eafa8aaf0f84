"""The plan's hours count validation, and come with a range from the recipe's stated bounds:
each part is printed; each of the nine reference rows' reported hours lies inside
its range; the math rows' point estimates stay within 1.5x."""

from __future__ import annotations

import pytest
import yaml

from drmas_bench.commands.train import plan_recipe
from drmas_trainer.config.train import RECIPES_DIR, load_config
from drmas_trainer.forecast.workload import stated

ROWS = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")
              if ((yaml.safe_load(p.read_text()) or {}).get("plan") or {}).get("reported_hours"))


def test_the_hours_count_every_validation_the_reference_counts():
    """math_qwen3_4b: 1,120 steps, val.before_train and every 10 (the reference's run_math.sh):
    1 + 112 validations (the last step, 1,120, is one of the every-10 ones) of 110 questions x 1."""
    cfg = load_config("math_qwen3_4b")
    _, est = plan_recipe(cfg, gpu_gib=80)
    assert (est.steps, est.val_count, est.val_episodes) == (1120, 1 + 1120 // 10, 110)
    assert est.val_s > 0 and est.hours == pytest.approx(est.train_hours + est.val_count * est.val_s / 3600)
    off = load_config("math_qwen3_4b", {"val.every": 0, "val.before_train": False})
    _, none = plan_recipe(off, gpu_gib=80)
    assert none.val_count == 0 and none.hours == pytest.approx(est.train_hours)
    _, nine = plan_recipe(load_config("math_qwen3_4b", {"val.every": 9}), gpu_gib=80)
    assert nine.val_count == 1 + 1120 // 9 + 1  # 1,120 is not a multiple of 9: the last step is one more


def test_a_validation_costs_the_steps_calls_over_its_episodes_not_a_whole_step():
    _, est = plan_recipe(load_config("math_qwen3_4b"), gpu_gib=80)
    # 110 episodes against a step's 32 x 8 = 256: memory-bound decode waits for the same longest response,
    # so a validation costs less than the step's rollout, but more than 110/256 of it
    assert 110 / 256 * est.rollout_s < est.val_s < est.rollout_s


@pytest.mark.parametrize("recipe", ROWS)
def test_each_rows_range_holds_its_point_and_the_reported_hours(recipe):
    _, est = plan_recipe(load_config(recipe), gpu_gib=80)
    assert est.low_hours < est.hours < est.high_hours
    assert est.low_hours <= est.reported_hours <= est.high_hours, (est.low_hours, est.reported_hours, est.high_hours)
    if recipe.startswith("math"):
        assert 1 / 1.5 <= est.hours / est.reported_hours <= 1.5
    assert set(est.parts) == {"the longest response", "early stopping"}
    for lo, hi in est.parts.values():  # each unknown alone spans part of the range and holds the point
        assert est.low_hours <= lo <= est.hours <= hi <= est.high_hours


def test_the_bounds_are_the_recipes_stated_ones():
    """The low end: the longest response at the mean and each call's share_low (0: the call is gone);
    the high end: the cap and each share_high; the point: the recipe's own shares at the cap."""
    cfg = load_config("search_qwen2.5_3b")
    agents = ["verifier", "searcher", "answerer"]
    low, point, high = (stated(cfg, agents, end) for end in ("low", "point", "high"))
    cap, mean = 800, 0.2 * 800
    assert [(c.agent, c.share) for c in low.calls] == [("verifier", 1.0), ("answerer", 1.0)]
    assert {c.longest_response for c in low.calls} == {mean}
    assert [c.agent for c in high.calls] == ["verifier", "searcher"] * 3 + ["verifier", "answerer"]
    assert {c.share for c in high.calls} == {1.0} and {c.longest_response for c in high.calls} == {cap}
    assert [c.share for c in point.calls] == [c.share for c in cfg.plan.calls]
    assert {c.longest_response for c in point.calls} == {cap} and {c.mean_response for c in point.calls} == {mean}
