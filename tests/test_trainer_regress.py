"""`drmas-bench regress` and `plot` on synthetic metrics files: a good run passes the tiny recipe's
stored bands; NaN, a low final reward, exploding grad norms or skipped steps fail them, one line each."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from drmas_bench.types import UserError
from drmas_trainer.reports.regress import check_run, load_bands

REPO = Path(__file__).resolve().parent.parent
BANDS = REPO / "trainer" / "recipes" / "tiny_bands.json"


def write_run(path: Path, n: int = 40, reward=lambda s: 0.40 + 0.005 * s, grad=lambda s, a: 0.5,
              skipped=lambda s: 0, nan_at: int | None = None, val=(0.40, 0.55)) -> Path:
    """A synthetic run: ``n`` steps, and the recipe's validations before step 1 and after step n
    (``val``: their val/avg@4)."""
    path.mkdir(parents=True, exist_ok=True)

    def validation(step: int, acc: float) -> dict:
        return {"val/avg@4": acc, "val/agent/solver/valid/mean": 1.0, "val/agent/checker/valid/mean": 1.0,
                "val/run": f"val/step_{step}"}

    lines = [json.dumps({"step": 0, **validation(0, val[0])})]
    for s in range(1, n + 1):
        r = {"step": s, "data_cursor": 8 * (s - 1), "critic/score/mean": reward(s), "critic/rewards/mean": reward(s) - 0.01,
             "actor/loss": -0.01, "actor/ppo_kl": 0.0, "actor/entropy": 0.2, "agent/solver/valid/mean": 0.98, "agent/checker/valid/mean": 0.85,
             "actor/skipped_steps": skipped(s), "rollout_corr/kl": 1e-5, "rollout_corr/k3_kl": 1e-5,
             "rollout/token_mismatch": 0}
        for a in ("solver", "checker"):
            r[f"agent/{a}/actor/grad_norm"] = grad(s, a)
            r[f"agent/{a}/critic/advantages/mean"] = 0.0
            r[f"agent/{a}/critic/advantages/std"] = 0.9
        if nan_at == s:
            r["actor/loss"] = float("nan")
            r["agent/solver/actor/grad_norm"] = float("nan")
        if s == n:
            r.update(validation(s, val[1]))
        lines.append(json.dumps(r))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_stored_bands_are_valid():
    bands = load_bands(BANDS)
    assert {b["stat"] for b in bands} >= {"last_k_mean", "max", "nonfinite", "sum", "count"}


@pytest.mark.parametrize("recipe", ["tiny", "tiny_lora", "tiny_4agent", "tiny_hetero"])
def test_each_ci_recipes_bands_count_the_steps_and_validations_its_recipe_runs(recipe):
    """The bands that count (every step logged, the validations before RL and at the end) are read
    from the recipe, not remembered: a recipe whose steps or validation schedule change without its
    bands (tiny_4agent and tiny_lora went from 20 to 10 steps) is caught here, not by CI's run."""
    from drmas_trainer.config.train import load_config

    cfg = load_config(recipe)
    bands = json.loads((REPO / "trainer" / "recipes" / f"{recipe}_bands.json").read_text())["bands"]
    counts = {b["metric"]: b for b in bands if b["stat"] == "count" and isinstance(b["metric"], str)}
    assert counts["critic/score/mean"]["min"] == cfg.steps
    val = [b for m, b in counts.items() if m.startswith("val/")]
    if val:  # validated before RL and at the last step only, as the band says
        assert cfg.val.before_train and cfg.val.every == cfg.steps, (cfg.val.before_train, cfg.val.every, cfg.steps)
        assert val[0]["min"] == val[0]["max"] == 2


def test_good_run_passes(tmp_path):
    failures, lines = check_run(write_run(tmp_path / "good"), BANDS)
    assert failures == [] and lines and all(line.startswith("ok") for line in lines)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(nan_at=17), "no NaN"),
    (dict(reward=lambda s: 0.40), "final reward"),
    (dict(grad=lambda s, a: 80.0 if (s == 30 and a == "checker") else 0.5), "agent/checker/actor/grad_norm max = 80"),
    (dict(skipped=lambda s: 1 if s == 5 else 0), "skipped"),
    (dict(n=12), "ran every step"),
    (dict(val=(0.40, 0.40)), "held-out accuracy at the end"),  # learns the training questions, not held-out ones
])
def test_bad_runs_fail_with_one_line_per_band(tmp_path, kwargs, needle):
    failures, lines = check_run(write_run(tmp_path / "bad", **kwargs), BANDS)
    assert failures, lines
    assert any(needle in f for f in failures), failures
    assert all("\n" not in f for f in failures)


def test_regress_command_exit_codes(tmp_path, capsys):
    from drmas_bench.commands.train import cmd_regress

    assert cmd_regress(argparse.Namespace(run=str(write_run(tmp_path / "ok")), against=str(BANDS))) == 0
    assert cmd_regress(argparse.Namespace(run=str(write_run(tmp_path / "nan", nan_at=3)), against=str(BANDS))) == 1
    err = capsys.readouterr().err
    assert err.count("regression:") == 2 and "NaN" in err  # the NaN band and the grad-norm band (max = nan)
    bad = tmp_path / "bands.json"
    bad.write_text(json.dumps({"bands": [{"metric": "critic/score/mean", "stat": "median", "min": 0}]}))
    with pytest.raises(UserError, match="stat"):
        cmd_regress(argparse.Namespace(run=str(tmp_path / "ok"), against=str(bad)))
    bad.write_text(json.dumps({"bands": [{"metric": "critic/score/mean", "stat": "max", "mn": 0}]}))
    with pytest.raises(UserError, match="mn"):
        load_bands(bad)


def test_plot_writes_a_png_with_both_runs(tmp_path):
    from drmas_trainer.reports.plot import plot_runs

    a = write_run(tmp_path / "grpo", grad=lambda s, ag: 0.5 + (3.0 if ag == "checker" and s % 7 == 0 else 0.0))
    b = write_run(tmp_path / "drmas", nan_at=9)
    out, spread = plot_runs([a, b], tmp_path / "curves.png", title="test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert spread["grpo"]["checker"]["spread"] == pytest.approx(3.5 / 0.5)
    assert spread["drmas"]["solver"]["spread"] == pytest.approx(1.0)  # the NaN step is left out
    assert math.isfinite(spread["drmas"]["solver"]["max"])
