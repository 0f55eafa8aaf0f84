"""Per-step advantage metrics, loss-balance weights and the KL in the reward against plain-loop
references (dicts of lists, Python floats, numpy percentiles) on random batches, plus properties."""

from __future__ import annotations

import math
import random
import zlib
from collections import defaultdict

import numpy as np
import pytest
import torch

from drmas_trainer.adv_metrics import lemma_diagnostics, reference_adv_metrics
from drmas_trainer.advantages import compute_advantages
from drmas_trainer.loss_balance import agent_freq_weights, row_loss_weights
from drmas_trainer.rewards import kl_in_reward, kl_reward_step, make_kl_controller

NAMES = ["solver", "verifier", "critic", "refiner"]


def random_batch(rng: random.Random):
    """Rows of a few prompt groups: each trajectory has 1-5 calls of 1-4 agents, scores on a coarse
    grid (ties, equal groups and one-value pools happen)."""
    rows = []
    for u in range(rng.randint(1, 5)):
        for t in range(rng.randint(1, 5)):
            for _ in range(rng.randint(1, 5)):
                rows.append((u * 10 + 3, u * 100 + t, rng.randrange(rng.randint(1, 4)), rng.choice([0.0, 0.5, 0.9, 1.0, -0.1])))
    rng.shuffle(rows)
    return rows


def tensors(rows):
    uid, traj, agent, x = zip(*rows)
    return (torch.tensor(x, dtype=torch.float64), torch.tensor(uid), torch.tensor(traj), torch.tensor(agent))


def mean_std(vals: list[float]) -> tuple[float, float]:
    if len(vals) == 1:
        return 0.0, 1.0
    m = sum(vals) / len(vals)
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))


def loop_diag(rows) -> dict[str, float]:
    traj_vals, pair_vals = defaultdict(list), defaultdict(list)
    for u, t, a, x in rows:
        traj_vals[(u, t)].append(x)
        pair_vals[(u, a)].append(x)
    uid_means = defaultdict(list)
    for (u, _), v in traj_vals.items():
        uid_means[u].append(sum(v) / len(v))
    glob = {u: mean_std(v) for u, v in uid_means.items()}
    per = defaultdict(lambda: defaultdict(list))
    for (u, a), v in pair_vals.items():
        mk, sk = mean_std(v)
        mu, s = glob[u]
        gap = mk - mu
        per[a]["gap"].append(gap)
        per[a]["vr"].append(sk * sk / (s * s + 1e-12))
        per[a]["inf"].append((sk * sk + gap * gap) / (s * s + 1e-12))
    out = {}
    for a, d in per.items():
        n = NAMES[a]
        out[f"adv_diag/{n}/mean_gap_mean"] = sum(d["gap"]) / len(d["gap"])
        out[f"adv_diag/{n}/mean_gap_abs_mean"] = sum(map(abs, d["gap"])) / len(d["gap"])
        out[f"adv_diag/{n}/mean_gap_abs_max"] = max(map(abs, d["gap"]))
        out[f"adv_diag/{n}/var_ratio_mean"] = sum(d["vr"]) / len(d["vr"])
        out[f"adv_diag/{n}/var_ratio_min"] = min(d["vr"])
        out[f"adv_diag/{n}/var_ratio_max"] = max(d["vr"])
        out[f"adv_diag/{n}/inflation_factor_mean"] = sum(d["inf"]) / len(d["inf"])
        out[f"adv_diag/{n}/inflation_factor_p95"] = float(np.percentile(d["inf"], 95))
        out[f"adv_diag/{n}/inflation_factor_max"] = max(d["inf"])
    return out


def loop_std(rows, by_agent: bool) -> dict[str, float]:
    pools = defaultdict(list)
    if by_agent:
        for u, _, a, x in rows:
            pools[(u, a)].append(x)
    else:
        traj_vals = defaultdict(list)
        for u, t, _, x in rows:
            traj_vals[(u, t)].append(x)
        for (u, _), v in traj_vals.items():
            pools[(u, None)].append(sum(v) / len(v))
    buckets = defaultdict(lambda: ([], []))
    for (_, a), v in pools.items():
        stds, sizes = buckets["all" if a is None else NAMES[a]]
        stds.append(mean_std(v)[1])
        sizes.append(len(v))
    out = {}
    for b, (s, n) in buckets.items():
        out |= {f"adv_std/{b}/mean": sum(s) / len(s), f"adv_std/{b}/min": min(s), f"adv_std/{b}/max": max(s),
                f"adv_std/{b}/p5": float(np.percentile(s, 5)), f"adv_std/{b}/median": float(np.median(s)),
                f"adv_std/{b}/num_groups": float(len(s)), f"adv_std/{b}/group_size_mean": sum(n) / len(n)}
        for th in (0.001, 0.01, 0.1):
            out[f"adv_std/{b}/frac_below_{th:g}"] = sum(v < th for v in s) / len(s)
    return out


def loop_norm(rows, adv: list[float], per_agent: bool) -> dict[str, float]:
    buckets = defaultdict(list)
    for (_, _, a, _), v in zip(rows, adv):
        buckets[NAMES[a] if per_agent else "all"].append(abs(v))
    out = {}
    for b, v in buckets.items():
        out |= {f"adv_norm/{b}/abs_max": max(v), f"adv_norm/{b}/abs_p99": float(np.percentile(v, 99)),
                f"adv_norm/{b}/abs_mean": sum(v) / len(v)}
    return out


def agree(got: dict, want: dict) -> bool:
    return sorted(got) == sorted(want) and all(math.isclose(got[k], want[k], rel_tol=1e-9, abs_tol=1e-9) for k in want)


@pytest.mark.parametrize("seed", range(60))
def test_diagnostics_std_and_norm_match_the_loop_reference(seed):
    rng = random.Random(seed)
    rows = random_batch(rng)
    x, uid, traj, agent = tensors(rows)
    assert agree(lemma_diagnostics(x, uid, traj, agent, NAMES), loop_diag(rows))
    gbai = bool(seed % 2)
    adv = compute_advantages(x, uid, traj, agent, "master", group_by_agent=gbai).double()
    got = reference_adv_metrics(x, uid, traj, agent, NAMES, group_by_agent=gbai, version="40f50a1", adv=adv)
    want = loop_std(rows, gbai) | loop_diag(rows) | loop_norm(rows, adv.tolist(), per_agent=True)
    assert agree(got, want)
    got = reference_adv_metrics(x, uid, traj, agent, NAMES, group_by_agent=gbai, version="755152e", adv=adv)
    assert agree(got, loop_std(rows, gbai) | loop_norm(rows, adv.tolist(), per_agent=gbai))


def test_the_inflation_factor_of_one_agent_with_the_uid_pool_is_one_and_the_gap_zero():
    """One agent, one call per trajectory: its (uid, agent) pool is the uid's pool of trajectory means."""
    rng = random.Random(3)
    rows = [(1, t, 0, rng.random()) for t in range(6)] + [(2, 10 + t, 0, rng.random()) for t in range(4)]
    d = lemma_diagnostics(*tensors(rows), NAMES)
    assert d["adv_diag/solver/mean_gap_abs_max"] == pytest.approx(0.0, abs=1e-12)
    assert d["adv_diag/solver/inflation_factor_max"] == pytest.approx(1.0, rel=1e-9)
    assert d["adv_diag/solver/inflation_factor_mean"] == pytest.approx(1.0, rel=1e-9)


def test_version_none_logs_nothing_and_an_unknown_version_is_refused():
    x, uid, traj, agent = tensors(random_batch(random.Random(0)))
    assert reference_adv_metrics(x, uid, traj, agent, NAMES, group_by_agent=True, version="none") == {}
    with pytest.raises(ValueError, match="unknown advantage-metric version"):
        reference_adv_metrics(x, uid, traj, agent, NAMES, group_by_agent=True, version="master")


# ---------------------------------------------------------------------------------- loss balance


@pytest.mark.parametrize("seed", range(30))
def test_agent_freq_weights_match_the_loop_reference(seed):
    rows = random_batch(random.Random(100 + seed))
    count = defaultdict(int)
    for u, _, a, _ in rows:
        count[(u, a)] += 1
    raw = [1.0 / count[(u, a)] for u, _, a, _ in rows]
    want = [w / (sum(raw) / len(raw)) for w in raw]
    _, uid, _, agent = tensors(rows)
    got = agent_freq_weights(uid, agent).tolist()
    assert all(math.isclose(g, w, rel_tol=1e-6) for g, w in zip(got, want))


def test_every_prompt_agent_pair_gets_the_same_total_weight():
    rows = random_batch(random.Random(7))
    _, uid, _, agent = tensors(rows)
    w = agent_freq_weights(uid, agent)
    assert float(w.mean()) == pytest.approx(1.0, rel=1e-6)
    totals = defaultdict(float)
    for (u, _, a, _), wi in zip(rows, w.tolist()):
        totals[(u, a)] += wi
    assert max(totals.values()) == pytest.approx(min(totals.values()), rel=1e-5)


def test_no_weighting_is_none_and_an_unknown_one_is_refused():
    _, uid, _, agent = tensors(random_batch(random.Random(1)))
    assert row_loss_weights("none", uid, agent) is None
    with pytest.raises(ValueError, match="unknown loss weighting"):
        row_loss_weights("by_length", uid, agent)


# ---------------------------------------------------------------------------------- KL in the reward

KINDS = {"kl": lambda lp, r: lp - r, "k1": lambda lp, r: lp - r, "abs": lambda lp, r: abs(lp - r),
         "mse": lambda lp, r: 0.5 * (lp - r) ** 2, "k2": lambda lp, r: 0.5 * (lp - r) ** 2,
         "low_var_kl": lambda lp, r: min(max(math.exp(r - lp) - (r - lp) - 1, -10), 10),
         "k3": lambda lp, r: min(max(math.exp(r - lp) - (r - lp) - 1, -10), 10)}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("ctrl_type", ["fixed", "adaptive"])
def test_kl_steps_match_the_loop_reference(kind, ctrl_type):
    rng = random.Random(zlib.crc32(f"{kind}/{ctrl_type}".encode()))  # str hash() differs per process
    ctrl = make_kl_controller(ctrl_type, 0.05, target_kl=0.02, horizon=50)
    beta_ref = 0.05
    for _ in range(4):
        B, T = rng.randint(1, 5), rng.randint(1, 6)
        lengths = [rng.randint(1, T) for _ in range(B)]
        old = [[rng.uniform(-3, 0) for _ in range(T)] for _ in range(B)]
        ref = [[rng.uniform(-3, 0) for _ in range(T)] for _ in range(B)]
        score = [rng.choice([0.0, 1.0, -0.1]) for _ in range(B)]
        # loop reference (float64)
        row_kl, want_rewards = [], []
        for b in range(B):
            kld = [KINDS[kind](old[b][t], ref[b][t]) if t < lengths[b] else 0.0 for t in range(T)]
            row_kl.append(sum(kld) / lengths[b])
            want_rewards.append([(score[b] if t == lengths[b] - 1 else 0.0) - beta_ref * kld[t] for t in range(T)])
        want_kl = sum(row_kl) / B
        # ours (float64 inputs, so the comparison is tight)
        mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
        scores = torch.zeros(B, T, dtype=torch.float64)
        scores[torch.arange(B), torch.tensor(lengths) - 1] = torch.tensor(score, dtype=torch.float64)
        rewards, current, beta = kl_reward_step(ctrl, scores, torch.tensor(old, dtype=torch.float64),
                                                torch.tensor(ref, dtype=torch.float64), mask, kind)
        assert beta == pytest.approx(beta_ref, rel=1e-9)  # as ctrl.value below: the KL it updates from agrees to ~1e-10
        assert current == pytest.approx(want_kl, rel=1e-6, abs=1e-12)
        assert rewards.flatten().tolist() == pytest.approx([v for r in want_rewards for v in r], rel=1e-9, abs=1e-12)
        if ctrl_type == "adaptive":
            beta_ref *= 1 + min(max(want_kl / 0.02 - 1, -0.2), 0.2) * B / 50
        assert ctrl.value == pytest.approx(beta_ref, rel=1e-9)


def test_padding_never_reaches_the_kl_and_bad_shapes_or_names_are_refused():
    old = torch.tensor([[-1.0, float("nan")]])
    ref = torch.tensor([[-1.5, float("inf")]])
    mask = torch.tensor([[True, False]])
    rewards, kl = kl_in_reward(torch.zeros(1, 2), old, ref, mask, 0.1, "k3")
    assert torch.isfinite(rewards).all() and math.isfinite(float(kl))
    with pytest.raises(ValueError, match="one \\[B, T\\] shape"):
        kl_in_reward(torch.zeros(1, 3), old, ref, mask, 0.1)
    with pytest.raises(ValueError, match="unknown kl_type"):
        kl_in_reward(torch.zeros(1, 2), old, ref, mask, 0.1, "k4")
    with pytest.raises(ValueError, match="unknown KL controller"):
        make_kl_controller("pid", 0.1)
    with pytest.raises(ValueError, match="horizon > 0"):
        make_kl_controller("adaptive", 0.1, horizon=0)
