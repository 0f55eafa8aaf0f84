"""scripts/balance_study.py: the 2 x 2's effects against a plain per-seed computation, the arms' config
overrides, and the factor table on hand-made runs (the runs themselves are the study's, not a test's)."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def study():
    sys.path.insert(0, str(SCRIPTS))
    for name in ("stability_study", "balance_study"):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod  # dataclasses look their module up
            spec.loader.exec_module(mod)
    return sys.modules["balance_study"]


def _run(rng, max_g, reward, agents=("fixer", "solver"), steps=4):
    return {"reward": [reward] * steps, "eval": None, "train_cpu_s": 1.0, "train_s": 2.0,
            "agents": {a: {"grad": [max_g] * steps, "max": max_g if a == "fixer" else 1.0, "median": max_g / 2,
                           "moment": [rng.uniform(1, 4) for _ in range(steps)],
                           "inflation": [rng.uniform(1, 4) for _ in range(steps)]} for a in agents}}


def test_effects_are_the_per_seed_contrasts(monkeypatch):
    b = study()
    monkeypatch.setattr(b.S, "wilcoxon_p", lambda d: float("nan"))  # scipy's resampling on ties is slow
    rng = random.Random(0)
    seeds = range(6)
    v = {arm: {k: rng.uniform(0, 10) for k in seeds} for arm in b.ARMS}
    arms = {arm: {k: _run(rng, v[arm][k], 0.5) for k in seeds} for arm in b.ARMS}
    arms["drmas"][99] = _run(rng, 1.0, 0.5)  # a seed not every arm finished is left out
    e = b.effects(arms, "max", "fixer")
    assert e["n"] == 6
    for k_name, fn in (("statistics", lambda k: (v["grpo+balance"][k] + v["grpo"][k] - v["drmas+balance"][k] - v["drmas"][k]) / 2),
                       ("balance", lambda k: (v["grpo+balance"][k] + v["drmas+balance"][k] - v["grpo"][k] - v["drmas"][k]) / 2),
                       ("interaction", lambda k: (v["grpo+balance"][k] - v["grpo"][k]) - (v["drmas+balance"][k] - v["drmas"][k]))):
        d = [fn(k) for k in seeds]
        assert e[k_name]["diff"] == pytest.approx(sum(d) / len(d)) and e[k_name]["b_greater"] == sum(x > 0 for x in d)
    assert e["balance_vs_stats"]["diff"] == pytest.approx(sum(v["grpo+balance"][k] - v["drmas"][k] for k in seeds) / 6)
    assert b.effects({"drmas": arms["drmas"]}, "max", "fixer") is None


def test_arms_set_the_estimator_and_the_balance_switch():
    b = study()
    assert b.arm_overrides("grpo") == {"algo.estimator": "grpo"}
    assert b.arm_overrides("drmas+balance") == {"algo.estimator": "drmas", "algo.balance_loss_by_agent_freq": True}
    assert set(b.CELLS.values()) == set(b.ARMS) and len(b.ARMS) == 4


def test_factor_table_puts_both_factors_per_step_and_their_agreement():
    b = study()
    rng = random.Random(1)
    runs = [_run(rng, 2.0, 0.5) for _ in range(3)]
    runs[0]["agents"]["fixer"]["inflation"] = list(runs[0]["agents"]["fixer"]["moment"])  # 4 cells agree exactly
    runs[1]["agents"]["fixer"]["inflation"][0] = 1e12  # a prompt whose trajectories all scored alike
    lines = b.factor_lines(runs, ["fixer", "solver"], None)
    step1 = next(ln for ln in lines if ln.startswith("| 1 |"))
    m = sum(r["agents"]["fixer"]["moment"][0] for r in runs) / 3
    i = sorted(r["agents"]["fixer"]["inflation"][0] for r in runs)[1]  # the median of three
    assert step1.split("|")[2].strip() == f"{m:.3f} / {i:.3f} [1/3]"
    fixer = next(ln for ln in lines if ln.startswith("| fixer |"))
    assert "1 of 12" in fixer and "(11 cells)" in fixer and not math.isnan(float(fixer.split("|")[4].split("(")[0]))
