"""The per-agent second-moment factor (trainer/moment_factor.py) against a plain loop reference."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from drmas_trainer import metric_names as N
from drmas_trainer.advantages import compute_advantages
from drmas_trainer.moment_factor import second_moment_factors


def _loop_factors(scores: list[float], uid: list[int], agent: list[int], n_agents: int) -> dict[int, tuple[float, int]]:
    """Dicts of lists and plain sums, written independently of the module."""
    groups: dict[int, list[int]] = {}
    for i, u in enumerate(uid):
        groups.setdefault(u, []).append(i)
    per_agent: dict[int, list[float]] = {k: [] for k in range(n_agents)}
    for rows in groups.values():
        xs = [scores[i] for i in rows]
        mu = sum(xs) / len(xs)
        var = sum((x - mu) ** 2 for x in xs) / len(xs)
        if var <= 1e-12:
            continue
        for k in range(n_agents):
            ys = [scores[i] for i in rows if agent[i] == k]
            if not ys:
                continue
            mk = sum(ys) / len(ys)
            vk = sum((y - mk) ** 2 for y in ys) / len(ys)
            per_agent[k].append((vk + (mk - mu) ** 2) / var)
    return {k: (sum(v) / len(v) if v else float("nan"), len(v)) for k, v in per_agent.items()}


def _random_batch(rng: random.Random, n_agents: int):
    scores, uid, agent = [], [], []
    for u in rng.sample(range(1000), rng.randint(1, 6)):  # sparse, unsorted uids
        kind = rng.random()
        for _ in range(rng.randint(1, 12)):
            k = rng.randrange(n_agents)
            if kind < 0.2:
                x = 1.0  # an all-equal group: left out
            elif kind < 0.6:
                x = float(rng.random() < 0.3 + 0.2 * k) - 0.1 * (rng.random() < 0.2)  # 0/1 reward with penalty
            else:
                x = rng.gauss(0.5 * k, 1.0)
            scores.append(x)
            uid.append(u)
            agent.append(k)
    order = list(range(len(scores)))
    rng.shuffle(order)  # rows in any order
    return [scores[i] for i in order], [uid[i] for i in order], [agent[i] for i in order]


@pytest.mark.parametrize("seed", range(40))
def test_matches_loop_reference_on_random_batches(seed: int) -> None:
    rng = random.Random(seed)
    n_agents = rng.randint(1, 4)
    scores, uid, agent = _random_batch(rng, n_agents)
    got = second_moment_factors(torch.tensor(scores, dtype=torch.float64), torch.tensor(uid), torch.tensor(agent), n_agents)
    want = _loop_factors(scores, uid, agent, n_agents)
    assert set(got) == set(want)
    for k in want:
        assert got[k][1] == want[k][1]
        if math.isnan(want[k][0]):
            assert math.isnan(got[k][0])
        else:
            assert got[k][0] == pytest.approx(want[k][0], rel=1e-9, abs=1e-12)


def test_share_weighted_factors_sum_to_one_in_a_group() -> None:
    """sum_k w_k F_k = 1 for population moments: the factor redistributes, it does not add."""
    rng = random.Random(7)
    scores = [float(rng.random() < 0.6) - 0.1 * (i % 3 == 0) for i in range(30)]
    agent = [i % 3 for i in range(30)]
    got = second_moment_factors(torch.tensor(scores, dtype=torch.float64), torch.zeros(30, dtype=torch.long), torch.tensor(agent), 3)
    assert sum(got[k][0] * 10 / 30 for k in range(3)) == pytest.approx(1.0, abs=1e-12)


def test_factor_is_the_global_step_advantage_second_moment() -> None:
    """F_k equals the mean squared advantage of agent k under global (step-level) population
    statistics, and agent-wise statistics give exactly 1 (the lemma's two sides)."""
    g = torch.Generator().manual_seed(0)
    n = 400
    agent = torch.arange(n) % 2
    scores = torch.where(agent == 0, torch.randn(n, generator=g, dtype=torch.float64) * 2.0 + 1.0,
                         torch.randn(n, generator=g, dtype=torch.float64) * 0.3)
    uid = torch.zeros(n, dtype=torch.long)
    f = second_moment_factors(scores, uid, agent, 2)
    mu, sd = scores.mean(), scores.std(unbiased=False)
    for k in range(2):
        a = (scores[agent == k] - mu) / sd
        assert f[k][0] == pytest.approx(float((a * a).mean()), rel=1e-9)
    assert f[0][0] > 1.5 and f[1][0] < 0.5  # a wide, off-centre agent vs a narrow one
    # Dr. MAS: agent-wise advantages have second moment (N-1)/N * 1 (unbiased std) -> 1
    adv = compute_advantages(scores, uid, torch.arange(n), agent, estimator="drmas")
    for k in range(2):
        m2 = float((adv[agent == k].double() ** 2).mean())
        assert m2 == pytest.approx((n / 2 - 1) / (n / 2), rel=1e-5)


def test_all_equal_and_missing_agent_give_nan() -> None:
    f = second_moment_factors(torch.ones(6), torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0, 1, 0, 1, 0, 1]), 3)
    assert all(math.isnan(v) and c == 0 for v, c in f.values())


def test_metric_names_scope_per_agent() -> None:
    assert N.agent("checker", N.MOMENT_FACTOR) == "agent/checker/critic/moment_factor/mean"
    assert N.agents_with({N.agent("solver", N.MOMENT_FACTOR), N.agent("checker", N.MOMENT_FACTOR)},
                         N.MOMENT_FACTOR) == ["checker", "solver"]


def test_plot_shows_the_factor_per_agent(tmp_path, capsys) -> None:
    """``drmas-bench plot`` draws the logged factor and prints its mean per agent; a run without it still plots."""
    import json

    from drmas_bench.cli import main

    run, old = tmp_path / "grpo", tmp_path / "old"
    for d, with_factor in ((run, True), (old, False)):
        d.mkdir()
        lines = []
        for s in range(1, 11):
            r = {"step": s, N.SCORE: 0.4, N.agent("solver", N.GRAD_NORM): 0.5, N.agent("checker", N.GRAD_NORM): 0.5 + s % 2}
            if with_factor:
                r[N.agent("solver", N.MOMENT_FACTOR)] = 0.8
                r[N.agent("checker", N.MOMENT_FACTOR)] = 1.0 + 0.1 * s if s != 3 else None  # a null step is left out
            lines.append(json.dumps(r))
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["plot", str(run), str(old), "--out", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    want = sum(1.0 + 0.1 * s for s in range(1, 11) if s != 3) / 9
    assert f"grpo\tagent/checker/critic/moment_factor/mean\tmean {want:.4g}" in out
    assert "grpo\tagent/solver/critic/moment_factor/mean\tmean 0.8" in out
    assert "old\tagent/checker/actor/grad_norm" in out and "old\tagent/checker/critic/moment_factor" not in out


# ------------------------------------------------------------------------------ the study's statistics

def study_module():
    """scripts/stability_study.py loaded as a module (scripts/ is not a package)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "stability_study.py"
    spec = importlib.util.spec_from_file_location("stability_study", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("stability_study", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_study_sign_test_is_the_exact_binomial_test(monkeypatch) -> None:
    """The study's sign p (the package's report.compare.sign_test_p) is scipy's exact binomial test."""
    from scipy.stats import binomtest

    s = study_module()
    # a fake Wilcoxon p: scipy's test on tied differences resamples (about 1 s a call), and this test
    # reads only the sign p of the 31 comparisons
    monkeypatch.setattr(s, "wilcoxon_p", lambda d: float("nan"))
    rng = random.Random(3)
    for _ in range(30):
        d = [rng.choice([-1.0, 0.0, 1.0, 2.5]) for _ in range(rng.randint(1, 14))]
        pos, neg = sum(x > 0 for x in d), sum(x < 0 for x in d)
        want = binomtest(pos, pos + neg, 0.5).pvalue if pos + neg else 1.0
        assert s.paired([0.0] * len(d), d)["sign_p"] == pytest.approx(want, rel=1e-12)
    assert s.paired([0.0] * 10, [1.0] * 10)["sign_p"] == pytest.approx(2 / 1024)


def test_study_uses_the_package_statistics() -> None:
    """One home for the sign test and the bootstrap: the study's CI is metrics.bootstrap_ci's, bit for bit."""
    from drmas_bench.metrics import bootstrap_ci

    s = study_module()
    a = [0.1 * k for k in range(10)]
    b = [x + (0.3 if k % 3 else -0.2) for k, x in enumerate(a)]
    d = [y - x for x, y in zip(a, b)]
    assert s.paired(a, b)["ci"] == bootstrap_ci(d, n_boot=s.N_BOOT, seed=0)
    assert not hasattr(s, "sign_test") and not hasattr(s, "bootstrap_mean_ci")


def test_study_paired_summary() -> None:
    s = study_module()
    a = [1.0, 2.0, 3.0, 4.0, float("nan")]
    b = [2.0, 2.5, 4.0, 4.5, 9.0]  # the NaN pair is dropped
    p = s.paired(a, b)
    d = [1.0, 0.5, 1.0, 0.5]
    assert p["n"] == 4 and p["diff"] == pytest.approx(0.75) and p["b_greater"] == 4
    assert p["dz"] == pytest.approx(0.75 / statistics.stdev(d))
    assert p["ci"][0] <= 0.75 <= p["ci"][1] and 0.5 <= p["ci"][0] and p["ci"][1] <= 1.0
    assert s.parse_seeds("0-3,7") == [0, 1, 2, 3, 7]
