"""Advantage estimators: a plain-Python loop reference, hand-worked fixtures, properties."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from drmas_trainer.advantages import (
    ESTIMATORS,
    GROUP_INDEXED,
    RENAMED,
    advantage_stats,
    compute_advantages,
    estimator_names,
    register_estimator,
)
from drmas_trainer.rewards import row_scores

# ------------------------------------------------------------------------------------------------
# loop reference: dicts of lists and plain sums, written independently of the module
# ------------------------------------------------------------------------------------------------

# estimator -> (numerator, pool of the mean, pool of the std); each as (kind, index)
#   index: "uid", "uid_agent", or "gbai" (uid_agent when group_by_agent is True, uid when False)
#   numerator kinds: "row" (the row's own score; index unused) or "cell" (the mean score of the
#     rows of the row's index group in the row's trajectory)
#   pool kinds: "rows" (every row score of the group), "cells" (one cell mean per trajectory of
#     the group), "first" (the score of each cell's first row in batch order)
ROW = ("row", None)
REF_TABLE: dict[str, tuple[tuple[str, str | None], tuple[str, str], tuple[str, str]]] = {
    "drmas": (ROW, ("rows", "uid_agent"), ("rows", "uid_agent")),
    "grpo": (("cell", "uid"), ("cells", "uid"), ("cells", "uid")),
    "grpo_first_row": (ROW, ("first", "uid"), ("first", "uid")),
    "global_step": (ROW, ("rows", "uid"), ("rows", "uid")),
    "drmas_mean_only": (ROW, ("rows", "uid_agent"), ("cells", "uid")),
    "drmas_std_only": (ROW, ("cells", "uid"), ("rows", "uid_agent")),
    "grpo_row_score": (ROW, ("cells", "uid"), ("cells", "uid")),
    # the reference's names (REFERENCE.md 2c)
    "agent_agent": (ROW, ("rows", "gbai"), ("rows", "gbai")),
    "traj_traj": (("cell", "gbai"), ("cells", "gbai"), ("cells", "gbai")),
    "agent_traj": (ROW, ("rows", "gbai"), ("cells", "gbai")),
    "traj_agent": (("cell", "gbai"), ("cells", "gbai"), ("rows", "gbai")),
}
# the reference's names that pick another estimator by group_by_agent
REF_BY_GBAI: dict[str, dict[bool, str]] = {
    "auto": {True: "agent_agent", False: "traj_traj"},
    "master": {True: "agent_agent", False: "traj_traj"},
    "reference_2025_10": {True: "drmas", False: "grpo_first_row"},
    "3b556f2": {True: "drmas", False: "grpo_first_row"},  # its alias (the reference vectors' name)
}
GBAI_NAMES = {"agent_agent", "traj_traj", "agent_traj", "traj_agent", *REF_BY_GBAI}


def gbai_options(name: str) -> list[bool | None]:
    """The group_by_agent values to run ``name`` under (None: the name fixes its index)."""
    return [True, False] if name in GBAI_NAMES else [None]


def ref_mean_std(values: list[float]) -> tuple[float, float, int]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var), n


def ref_advantages(scores, uid, traj, agent, estimator, norm_by_std=True, eps=1e-6, single_row="reference",
                   std_floor=0.0, group_by_agent=None):
    x = [float(v) for v in scores]
    u = [int(v) for v in uid]
    t = [int(v) for v in traj]
    k = [int(v) for v in agent]
    n_rows = len(x)
    name = REF_BY_GBAI[estimator][group_by_agent] if estimator in REF_BY_GBAI else estimator
    num_spec, mean_spec, std_spec = REF_TABLE[name]

    def group_of(i: int, index: str):
        if index == "gbai":
            index = "uid_agent" if group_by_agent else "uid"
        return (u[i], k[i]) if index == "uid_agent" else u[i]

    def pools_for(index: str):
        """(stats per pool kind per group, cell mean per row) under one index."""
        cells: dict[tuple, list[int]] = {}  # insertion order: cells in order of their first row
        for i in range(n_rows):
            cells.setdefault((group_of(i, index), t[i]), []).append(i)
        cell_mean = {c: sum(x[i] for i in rows) / len(rows) for c, rows in cells.items()}
        groups: dict[str, dict[object, list[float]]] = {"rows": {}, "cells": {}, "first": {}}
        for i in range(n_rows):
            groups["rows"].setdefault(group_of(i, index), []).append(x[i])
        for (g, tt), rows in cells.items():
            groups["cells"].setdefault(g, []).append(cell_mean[(g, tt)])
            groups["first"].setdefault(g, []).append(x[rows[0]])
        stats = {kind: {g: ref_mean_std(v) for g, v in gs.items()} for kind, gs in groups.items()}
        return stats, [cell_mean[(group_of(i, index), t[i])] for i in range(n_rows)]

    cache: dict[str, tuple] = {}

    def pools(index: str):
        if index not in cache:
            cache[index] = pools_for(index)
        return cache[index]

    # the reference's std of a one-value pool is a float32 1; float32 + eps stays float32
    lone_denom = float(np.float32(max(1.0, std_floor)) + np.float32(eps))
    out = []
    for i in range(n_rows):
        num = x[i] if num_spec[0] == "row" else pools(num_spec[1])[1][i]
        mean, _, n_mean = pools(mean_spec[1])[0][mean_spec[0]][group_of(i, mean_spec[1])]
        _, std, n_std = pools(std_spec[1])[0][std_spec[0]][group_of(i, std_spec[1])]
        lone = n_mean == 1 or (norm_by_std and n_std == 1)
        if single_row == "zero" and lone:
            out.append(0.0)
            continue
        if n_mean == 1:
            mean = 0.0
        if norm_by_std:
            out.append((num - mean) / (lone_denom if n_std == 1 else max(std, std_floor) + eps))
        else:
            out.append(num - mean)
    return out


# ------------------------------------------------------------------------------------------------
# random batches
# ------------------------------------------------------------------------------------------------


def random_batch(rng: random.Random):
    """Random rows: 1-5 uids, 1-8 trajectories each, 1-3 agents (some absent from some
    trajectories), 1-3 rows per acting agent, binary / all-equal / continuous rewards with format
    penalties, large non-contiguous ids, rows shuffled (or not)."""
    agents = rng.sample(range(-3, 40), rng.randint(1, 3))
    c_inv = rng.choice([0.1, 0.01])
    uids = rng.sample(range(-1000, 10**9), rng.randint(1, 5))
    next_traj = rng.randrange(-(10**6), 10**6)
    rows: list[tuple[float, int, int, int]] = []
    for u in uids:
        n_traj = rng.choice([1, 1, 2, 3, 4, 5, 8])
        style = rng.choice(["binary", "equal", "equal_penalised", "continuous"])
        base = rng.choice([0.0, 1.0])
        for _ in range(n_traj):
            next_traj += rng.randint(1, 1000)
            if style == "binary":
                reward = float(rng.random() < 0.5)
            elif style == "continuous":
                reward = rng.randint(0, 8) / 8
            else:
                reward = base
            p_invalid = {"equal": 0.0, "equal_penalised": 0.15}.get(style, 0.2)
            acting = [a for a in agents if rng.random() > 0.25] or [rng.choice(agents)]
            for a in acting:
                for _ in range(rng.randint(1, 3)):
                    valid = rng.random() >= p_invalid
                    rows.append((reward - c_inv * (not valid), u, next_traj, a))
    if rng.random() < 0.8:
        rng.shuffle(rows)
    scores = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    uid, traj, agent = (torch.tensor([r[j] for r in rows], dtype=torch.int64) for j in (1, 2, 3))
    return scores, uid, traj, agent


BATCHES = [random_batch(random.Random(seed)) for seed in range(150)]
OPTIONS = [
    dict(norm_by_std=n, single_row=s, std_floor=f)
    for n in (True, False)
    for s in ("reference", "zero")
    for f in (0.0, 0.05)
    if not (f and not n)  # std_floor only matters when dividing by the std
]


def assert_close_to_ref(got: torch.Tensor, want: list[float], what: str) -> None:
    assert got.dtype == torch.float32
    assert len(want) == got.numel()
    for i, (g, w) in enumerate(zip(got.tolist(), want)):
        assert abs(g - w) <= 1e-6 * max(1.0, abs(w)), f"{what}: row {i}: got {g}, loop reference {w}"


def test_reference_table_covers_every_registered_name():
    assert sorted([*REF_TABLE, *REF_BY_GBAI]) == estimator_names()
    assert sorted(GBAI_NAMES) == sorted(GROUP_INDEXED)


@pytest.mark.parametrize("estimator", sorted([*REF_TABLE, *REF_BY_GBAI]))
def test_matches_loop_reference_on_random_batches(estimator):
    for b, (scores, uid, traj, agent) in enumerate(BATCHES):
        for gbai in gbai_options(estimator):
            for opts in OPTIONS:
                opts = dict(opts, group_by_agent=gbai)
                got = compute_advantages(scores, uid, traj, agent, estimator=estimator, **opts)
                want = ref_advantages(scores, uid, traj, agent, estimator, **opts)
                assert_close_to_ref(got, want, f"{estimator} batch {b} {opts}")


def test_random_batches_cover_the_hard_cases():
    """The random batches must contain what the comparison is meant to exercise."""
    single_agent_group = all_equal_group = absent_agent = penalised = huge = 0
    uneven_cell = one_cell_many_rows = 0
    for scores, uid, traj, agent in BATCHES:
        x, u, t, k = scores.tolist(), uid.tolist(), traj.tolist(), agent.tolist()
        groups: dict[tuple[int, int], list[float]] = {}
        cells: dict[tuple[int, int], dict[int, list[float]]] = {}
        for i in range(len(x)):
            groups.setdefault((u[i], k[i]), []).append(x[i])
            cells.setdefault((u[i], k[i]), {}).setdefault(t[i], []).append(x[i])
        single_agent_group += sum(len(v) == 1 for v in groups.values())
        all_equal_group += sum(len(v) > 1 and len(set(v)) == 1 for v in groups.values())
        # a cell average that differs from some of its rows (the "traj" numerator is not the row score)
        uneven_cell += sum(len(set(c)) > 1 for g in cells.values() for c in g.values())
        # a one-value cell pool beside a row pool of several values (the one-value rule per pool)
        one_cell_many_rows += sum(len(g) == 1 and len(next(iter(g.values()))) > 1 for g in cells.values())
        agents_of: dict[int, set[int]] = {}
        for i in range(len(x)):
            agents_of.setdefault(t[i], set()).add(k[i])
        absent_agent += any(len(s) < len(set(k)) for s in agents_of.values())
        penalised += any(abs(v - round(v * 8) / 8) > 1e-4 for v in x)
        adv = compute_advantages(scores, uid, traj, agent, estimator="grpo_first_row")
        huge += bool((adv.abs() > 1e3).any())
    assert single_agent_group > 20
    assert all_equal_group > 20
    assert absent_agent > 20
    assert penalised > 20
    assert huge > 3  # the grpo_first_row pathology shows up in random data too
    assert uneven_cell > 20
    assert one_cell_many_rows > 20


def test_row_order_does_not_matter():
    """Permuting rows permutes advantages (grpo_first_row: if each trajectory keeps its row order)."""
    scores, uid, traj, agent = BATCHES[7]
    g = torch.Generator().manual_seed(0)
    for est, gbai in [(e, v) for e in estimator_names() for v in gbai_options(e)]:
        kw = dict(estimator=est, group_by_agent=gbai)
        base = compute_advantages(scores, uid, traj, agent, **kw)
        perm = torch.randperm(scores.numel(), generator=g)
        if est == "grpo_first_row" or (est in ("reference_2025_10", "3b556f2") and gbai is False):
            # shuffle whole trajectories; rows of one trajectory keep their relative order
            _, t_idx = torch.unique(traj, return_inverse=True)
            key = torch.rand(int(t_idx.max()) + 1, generator=g)
            perm = torch.argsort(key[t_idx], stable=True)
        out = compute_advantages(scores[perm], uid[perm], traj[perm], agent[perm], **kw)
        assert torch.allclose(out, base[perm], rtol=1e-6, atol=1e-6), (est, gbai)


# ------------------------------------------------------------------------------------------------
# hand-worked fixtures
# ------------------------------------------------------------------------------------------------

EPS = 1e-6
SOLVER, VERIFIER = 0, 1


def adv(scores, uid, traj, agent, **kw) -> list[float]:
    t = lambda v, d: torch.tensor(v, dtype=d)  # noqa: E731
    out = compute_advantages(t(scores, torch.float32), t(uid, torch.int64), t(traj, torch.int64), t(agent, torch.int64), **kw)
    return out.tolist()


# One uid, two trajectories. Trajectory 1 (R=1): the solver acts twice, the verifier once.
# Trajectory 2 (R=0): solver once, verifier once.
TWO_TRAJ = dict(
    scores=[1.0, 1.0, 1.0, 0.0, 0.0],
    uid=[0, 0, 0, 0, 0],
    traj=[1, 1, 1, 2, 2],
    agent=[SOLVER, VERIFIER, SOLVER, SOLVER, VERIFIER],
)


def test_drmas_action_weighting_and_unbiased_std():
    # solver rows (action-weighted): [1, 1, 0] -> mean 2/3,
    #   unbiased var = ((1/3)^2 + (1/3)^2 + (2/3)^2) / (3 - 1) = (6/9) / 2 = 1/3, std = 0.57735
    #   A(1) = (1/3) / (0.57735 + 1e-6) = 0.57735,  A(0) = -(2/3) / 0.57735 = -1.15470
    # verifier rows: [1, 0] -> mean 1/2, var = (1/4 + 1/4) / 1 = 1/2, std = 0.70711, A = +-0.70711
    # (trajectory-weighted, the solver's mean would be 1/2 and A(1) = +0.70711: action weighting matters)
    s_std, v_std = math.sqrt(1 / 3), math.sqrt(1 / 2)
    want = [(1 / 3) / (s_std + EPS), 0.5 / (v_std + EPS), (1 / 3) / (s_std + EPS), -(2 / 3) / (s_std + EPS), -0.5 / (v_std + EPS)]
    got = adv(**TWO_TRAJ, estimator="drmas")
    assert got == pytest.approx(want, rel=1e-6)
    assert got[0] == pytest.approx(0.57735, abs=1e-5) and got[3] == pytest.approx(-1.15470, abs=1e-5)


def test_grpo_trajectory_values():
    # v_1 = mean(1, 1, 1) = 1, v_2 = mean(0, 0) = 0 -> mean 1/2, unbiased std sqrt(1/2) = 0.70711
    # every row of trajectory 1 gets +0.5/0.70711 = +0.70711, every row of trajectory 2 -0.70711
    a = 0.5 / (math.sqrt(0.5) + EPS)
    assert adv(**TWO_TRAJ, estimator="grpo") == pytest.approx([a, a, a, -a, -a], rel=1e-6)


def test_grpo_trajectory_value_is_the_mean_of_its_rows():
    # traj 1 rows [1, 0.9] (verifier penalised 0.1) -> v_1 = 0.95; traj 2 rows [0, 0] -> v_2 = 0
    # mean 0.475, std = sqrt(2 * 0.475^2 / 1) = 0.67175; A_1 = 0.475/0.67175 = 0.70711
    got = adv([1.0, 0.9, 0.0, 0.0], [0] * 4, [1, 1, 2, 2], [0, 1, 0, 1], estimator="grpo")
    std = math.sqrt(2 * 0.475**2)
    assert got == pytest.approx([0.475 / (std + EPS)] * 2 + [-0.475 / (std + EPS)] * 2, rel=1e-6)


def test_unbiased_std_and_mean_only():
    # one agent, scores [0, 1, 2]: mean 1, unbiased std = sqrt((1 + 0 + 1) / 2) = 1
    # (the biased std would be sqrt(2/3) = 0.8165 and give +-1.2247)
    for est in ("drmas", "global_step"):
        assert adv([0.0, 1.0, 2.0], [0] * 3, [1, 2, 3], [0] * 3, estimator=est) == pytest.approx([-1 / (1 + EPS), 0.0, 1 / (1 + EPS)], rel=1e-7)
        assert adv([0.0, 1.0, 2.0], [0] * 3, [1, 2, 3], [0] * 3, estimator=est, norm_by_std=False) == [-1.0, 0.0, 1.0]


def test_eps_is_added_to_the_std():
    # scores [1, 0]: mean 0.5, std 0.70711; eps = 0.5 -> A = 0.5 / 1.20711 = 0.41421
    for est in ("drmas", "grpo"):
        got = adv([1.0, 0.0], [0, 0], [1, 2], [0, 0], estimator=est, eps=0.5)
        assert got == pytest.approx([0.41421, -0.41421], abs=1e-5)


def test_single_row_rule():
    # drmas: the verifier acts once in the whole group -> its statistics are over one value.
    # reference: mean 0, std 1 -> A = (0.9 - 0) / (1 + 1e-6) = 0.8999991;  zero: A = 0.
    # the solver's rows [1, 0] are a normal group: A = +-0.70711
    data = dict(scores=[1.0, 0.9, 0.0], uid=[0, 0, 0], traj=[1, 1, 2], agent=[SOLVER, VERIFIER, SOLVER])
    a = 0.5 / (math.sqrt(0.5) + EPS)
    assert adv(**data, estimator="drmas") == pytest.approx([a, 0.9 / (1 + EPS), -a], rel=1e-6)
    assert adv(**data, estimator="drmas", single_row="zero") == pytest.approx([a, 0.0, -a], rel=1e-6)
    assert adv(**data, estimator="drmas", norm_by_std=False) == pytest.approx([0.5, 0.9, -0.5], rel=1e-6)
    # grpo: a uid with one trajectory (rows [1, 0.9]) -> v = 0.95 -> reference A = 0.95 / (1 + 1e-6)
    one = dict(scores=[1.0, 0.9], uid=[5, 5], traj=[1, 1], agent=[SOLVER, VERIFIER])
    assert adv(**one, estimator="grpo") == pytest.approx([0.95 / (1 + EPS)] * 2, rel=1e-6)
    assert adv(**one, estimator="grpo", single_row="zero") == [0.0, 0.0]


def test_all_equal_group_is_exactly_zero():
    # scores [0.9, 0.9, 0.9]: numerator 0 and std 0 -> A = 0 / (0 + 1e-6) = 0, exactly
    for est in ("drmas", "grpo", "global_step", "grpo_row_score"):
        assert adv([0.9, 0.9, 0.9], [0] * 3, [1, 2, 3], [0] * 3, estimator=est) == [0.0, 0.0, 0.0]
    for est in ("agent_agent", "traj_traj", "agent_traj", "traj_agent"):
        for gbai in (True, False):
            assert adv([0.9, 0.9, 0.9], [0] * 3, [1, 2, 3], [0] * 3, estimator=est, group_by_agent=gbai) == [0.0] * 3
    # grpo with unequal rows but equal trajectory values: v = 0.5 for both -> A = 0
    assert adv([1.0, 0.0, 0.0, 1.0], [0] * 4, [1, 1, 2, 2], [0, 1, 0, 1], estimator="grpo") == [0.0] * 4


def test_grpo_first_row_pathology_and_std_floor():
    # three trajectories whose first rows all score 1 -> first-row mean 1, std 0.
    # trajectory 2's second row failed the format check: 1 - 0.1 = 0.9 (0.89999998 in float32)
    # A = (0.9 - 1) / (0 + 1e-6) = -1e5, as the reference really computes.
    data = dict(scores=[1.0, 1.0, 0.9, 1.0], uid=[0] * 4, traj=[1, 2, 2, 3], agent=[0, 0, 1, 0])
    got = adv(**data, estimator="grpo_first_row")
    assert got[0] == got[1] == got[3] == 0.0
    assert got[2] == pytest.approx(-1e5, rel=1e-5)
    # std_floor = 0.1 clamps the std: A = -0.1 / (0.1 + 1e-6) = -0.99999
    guarded = adv(**data, estimator="grpo_first_row", std_floor=0.1)
    assert guarded[2] == pytest.approx(-0.1 / (0.1 + EPS), rel=1e-6)
    # the first row is the lowest row index of the trajectory, not the smallest id or score
    reordered = dict(scores=[1.0, 0.9, 1.0, 1.0], uid=[0] * 4, traj=[1, 2, 2, 3], agent=[0, 1, 0, 0])
    # first rows now: traj1 1.0, traj2 0.9, traj3 1.0 -> mean 0.96667, std 0.057735
    m, s = 2.9 / 3, math.sqrt(2 * (0.1 / 3) ** 2 + (0.2 / 3) ** 2) / math.sqrt(2)
    assert adv(**reordered, estimator="grpo_first_row") == pytest.approx(
        [(1 - m) / (s + EPS), (0.9 - m) / (s + EPS), (1 - m) / (s + EPS), (1 - m) / (s + EPS)], rel=1e-5
    )


def test_mixed_estimators_hand_worked():
    # TWO_TRAJ: v = [1, 0] -> traj mean 0.5, traj std 0.70711; solver rows [1, 1, 0]: mean 2/3, std 0.57735
    # drmas_mean_only, solver row with score 1: (1 - 2/3) / 0.70711 = 0.47140
    # drmas_std_only,  solver row with score 1: (1 - 0.5) / 0.57735 = 0.86603
    # grpo_row_score,  solver row with score 0: (0 - 0.5) / 0.70711 = -0.70711
    assert adv(**TWO_TRAJ, estimator="drmas_mean_only")[0] == pytest.approx(0.47140, abs=1e-5)
    assert adv(**TWO_TRAJ, estimator="drmas_std_only")[0] == pytest.approx(0.86603, abs=1e-5)
    assert adv(**TWO_TRAJ, estimator="grpo_row_score")[3] == pytest.approx(-0.70711, abs=1e-5)
    # global_step: all 5 rows [1, 1, 1, 0, 0]: mean 0.6, var = (3 * 0.16 + 2 * 0.36) / 4 = 0.3
    assert adv(**TWO_TRAJ, estimator="global_step")[0] == pytest.approx(0.4 / (math.sqrt(0.3) + EPS), rel=1e-6)


def test_aliases_are_the_same_function():
    assert ESTIMATORS["master"] is ESTIMATORS["auto"]
    assert ESTIMATORS["3b556f2"] is ESTIMATORS["reference_2025_10"]  # the commit the reference vectors name it by


# One uid. Trajectory 1 (R=1): solver 1.0, solver 0.9 (format penalty), verifier 1.0.
# Trajectory 2 (R=0): solver 0.0, verifier 0.0.
PENALISED = dict(
    scores=[1.0, 0.9, 1.0, 0.0, 0.0],
    uid=[0] * 5,
    traj=[1, 1, 1, 2, 2],
    agent=[SOLVER, SOLVER, VERIFIER, SOLVER, VERIFIER],
)


def test_reference_names_by_agent_hand_worked():
    # group_by_agent=True, solver group: rows [1, 0.9, 0] -> mean 1.9/3, unbiased var
    #   = ((1 - m)^2 + (0.9 - m)^2 + m^2) / 2 = 0.30333, std 0.55076;
    #   cells (solver rows per trajectory): traj 1 -> (1 + 0.9)/2 = 0.95, traj 2 -> 0 -> mean 0.475,
    #   std sqrt(2 * 0.475^2) = 0.67175. The verifier has one row per cell: rows = cells = [1, 0].
    m = 1.9 / 3
    s_rows = math.sqrt(((1 - m) ** 2 + (0.9 - m) ** 2 + m**2) / 2)
    s_cells = math.sqrt(2 * 0.475**2)
    v = 0.5 / (math.sqrt(0.5) + EPS)  # the verifier: +-0.70711 under every estimator
    want = {
        # traj_traj: the cell average 0.95 is the numerator of both solver rows of trajectory 1
        "traj_traj": [0.475 / (s_cells + EPS)] * 2 + [v, -0.475 / (s_cells + EPS), -v],
        # agent_traj: the row's own score, the row-pool mean, the cell-pool std
        "agent_traj": [(1 - m) / (s_cells + EPS), (0.9 - m) / (s_cells + EPS), v, -m / (s_cells + EPS), -v],
        # traj_agent: the cell average, the cell-pool mean, the row-pool std
        "traj_agent": [0.475 / (s_rows + EPS)] * 2 + [v, -0.475 / (s_rows + EPS), -v],
        "agent_agent": [(1 - m) / (s_rows + EPS), (0.9 - m) / (s_rows + EPS), v, -m / (s_rows + EPS), -v],
    }
    for est, w in want.items():
        assert adv(**PENALISED, estimator=est, group_by_agent=True) == pytest.approx(w, rel=1e-6), est
    assert want["traj_traj"][0] == pytest.approx(0.70711, abs=1e-5)
    assert want["agent_traj"][1] == pytest.approx(0.39698, abs=1e-5)
    assert want["traj_agent"][0] == pytest.approx(0.86245, abs=1e-5)


def test_reference_names_by_uid_hand_worked():
    # group_by_agent=False, one group: rows [1, 0.9, 1, 0, 0] -> mean 0.58, unbiased var 1.128/4,
    #   std 0.53104; cells = trajectories: (1 + 0.9 + 1)/3 = 0.96667 and 0 -> mean 0.48333,
    #   std sqrt(2 * 0.48333^2) = 0.68354
    c1 = 2.9 / 3
    s_rows = math.sqrt(1.128 / 4)
    s_cells = math.sqrt(2 * (c1 / 2) ** 2)
    a = (c1 / 2) / (s_cells + EPS)
    assert adv(**PENALISED, estimator="traj_traj", group_by_agent=False) == pytest.approx([a, a, a, -a, -a], rel=1e-6)
    got = adv(**PENALISED, estimator="agent_traj", group_by_agent=False)
    assert got == pytest.approx([(x - 0.58) / (s_cells + EPS) for x in PENALISED["scores"]], rel=1e-6)
    assert got[1] == pytest.approx(0.46815, abs=1e-5)
    b = (c1 / 2) / (s_rows + EPS)
    assert adv(**PENALISED, estimator="traj_agent", group_by_agent=False) == pytest.approx([b, b, b, -b, -b], rel=1e-6)
    assert b == pytest.approx(0.91017, abs=1e-5)


def test_one_value_rule_is_per_pool():
    # one trajectory, the solver acts twice: rows [1, 0.9] (two values), cells [0.95] (one value)
    data = dict(scores=[1.0, 0.9], uid=[0, 0], traj=[1, 1], agent=[SOLVER, SOLVER])
    lone = float(np.float32(1.0) + np.float32(EPS))  # the reference's float32 std 1 plus eps
    # agent_traj: the row pool's mean 0.95, the cell pool's std 1 -> +-0.05 / 1.00000095
    got = adv(**data, estimator="agent_traj", group_by_agent=True)
    assert got == pytest.approx([0.05 / lone, -0.05 / lone], rel=1e-5)
    # traj_agent: the cell pool's mean 0, the row pool's std 0.070711 -> 0.95 / 0.070712 = 13.435
    got = adv(**data, estimator="traj_agent", group_by_agent=True)
    assert got == pytest.approx([0.95 / (math.sqrt(0.005) + EPS)] * 2, rel=1e-6)


def test_one_value_divisor_is_float32():
    # a lone row of score 1: A = 1 / float32(1 + 1e-6) = 1 / 1.00000095367 (the reference's
    # divisor), which is a different float32 than 1 / 1.000001
    lone = float(np.float32(1.0) + np.float32(EPS))
    assert lone == pytest.approx(1.00000095367, abs=1e-11)
    got = adv([1.0], [0], [1], [0], estimator="drmas")[0]
    assert got == float(np.float32(1.0 / lone))
    assert got != float(np.float32(1.0 / (1.0 + EPS)))


def test_reference_names_reduce_to_the_project_estimators():
    """REFERENCE.md 2c: by (uid, agent) agent_agent = auto = Dr. MAS; by uid agent_agent is the global
    step-level estimator and traj_traj = auto = GRPO; 3b556f2 is Dr. MAS / the first-row GRPO."""
    same = {
        True: {"agent_agent": "drmas", "auto": "drmas", "master": "drmas", "reference_2025_10": "drmas"},
        False: {"agent_agent": "global_step", "traj_traj": "grpo", "auto": "grpo", "master": "grpo",
                "reference_2025_10": "grpo_first_row"},
    }
    for b, (scores, uid, traj, agent) in enumerate(BATCHES[:60]):
        for gbai, pairs in same.items():
            for ref_name, ours in pairs.items():
                for norm in (True, False):
                    got = compute_advantages(scores, uid, traj, agent, estimator=ref_name, group_by_agent=gbai,
                                             norm_by_std=norm)
                    want = compute_advantages(scores, uid, traj, agent, estimator=ours, norm_by_std=norm)
                    assert torch.equal(got, want), (b, ref_name, gbai, norm)


def test_changed_names_differ_from_their_old_meaning():
    """The names that took the reference's meaning really mean something else than before."""
    for name in ("agent_traj", "traj_agent", "traj_traj"):
        old = adv(**PENALISED, estimator=RENAMED[name])
        for gbai in (True, False):
            assert adv(**PENALISED, estimator=name, group_by_agent=gbai) != pytest.approx(old, rel=1e-3), (name, gbai)


def test_reference_names_need_group_by_agent():
    scores, uid, traj, agent = BATCHES[0]
    for name in sorted(GROUP_INDEXED):
        with pytest.raises(ValueError, match="needs group_by_agent") as err:
            compute_advantages(scores, uid, traj, agent, estimator=name)
        if name in RENAMED:  # the message says where the old meaning went
            assert repr(RENAMED[name]) in str(err.value)
    for name in sorted(set(ESTIMATORS) - GROUP_INDEXED):
        for gbai in (True, False):
            with pytest.raises(ValueError, match="applies only to the reference's"):
                compute_advantages(scores, uid, traj, agent, estimator=name, group_by_agent=gbai)
    # also for an empty batch: the choice is checked before the data
    e = torch.zeros(0, dtype=torch.int64)
    with pytest.raises(ValueError, match="needs group_by_agent"):
        compute_advantages(torch.zeros(0), e, e, e, estimator="agent_traj")


def test_config_refuses_a_reference_name_without_group_by_agent():
    """An old recipe or --set naming a changed name fails with one line naming the old meaning; the
    reference names load with group_by_agent, the project's names refuse it."""
    from drmas_bench.types import UserError
    from drmas_trainer.config.train import load_config

    for name, old in RENAMED.items():
        with pytest.raises(UserError, match=f"needs group_by_agent.*{old}"):
            load_config("tiny", {"algo.estimator": name})
    with pytest.raises(UserError, match="applies only to the reference's"):
        load_config("tiny", {"algo.estimator": "drmas", "algo.group_by_agent": "false"})
    cfg = load_config("tiny", {"algo.estimator": "agent_traj", "algo.group_by_agent": "false"})
    assert (cfg.algo.estimator, cfg.algo.group_by_agent) == ("agent_traj", False)
    assert load_config("tiny").algo.group_by_agent is None  # the recipes name drmas: nothing to choose


# ------------------------------------------------------------------------------------------------
# dtype, determinism, errors, helpers
# ------------------------------------------------------------------------------------------------


def big_batch(n_uid: int = 2000, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n_traj = n_uid * 8
    per_traj = torch.randint(1, 9, (n_traj,), generator=g)
    traj = torch.repeat_interleave(torch.arange(n_traj) * 7 + 3, per_traj)
    uid = traj // 7 // 8
    agent = torch.randint(0, 3, (traj.numel(),), generator=g)
    reward = (torch.rand(n_traj, generator=g) < 0.4).float()
    scores = torch.repeat_interleave(reward, per_traj) - 0.1 * (torch.rand(traj.numel(), generator=g) < 0.1).float()
    perm = torch.randperm(traj.numel(), generator=g)
    return scores[perm], uid[perm], traj[perm], agent[perm]


def test_float32_out_and_deterministic():
    scores, uid, traj, agent = big_batch(600)  # ~21k rows
    for est in ("drmas", "grpo", "grpo_first_row", "global_step"):
        a = compute_advantages(scores, uid, traj, agent, estimator=est)
        b = compute_advantages(scores.clone(), uid.clone(), traj.clone(), agent.clone(), estimator=est)
        assert a.dtype == torch.float32 and a.shape == scores.shape
        assert torch.equal(a, b), est
        assert torch.isfinite(a).all()
    # float64 in -> still float32 out
    assert compute_advantages(scores.double(), uid, traj, agent).dtype == torch.float32


def test_deterministic_across_thread_counts():
    scores, uid, traj, agent = big_batch(1200)  # ~43k rows: above torch's parallel grain size
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = compute_advantages(scores, uid, traj, agent, estimator="drmas")
        torch.set_num_threads(max(2, threads))
        many = compute_advantages(scores, uid, traj, agent, estimator="drmas")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


def test_dense_and_sparse_ids_give_identical_results():
    """Compact ids (densified by counting) and ids spread over int64 (densified by sorting) agree."""
    scores, uid, traj, agent = big_batch(300)
    spread = (uid * 2**40 - 2**62, traj * 2**30 + 2**61, agent * 2**50 - 2**60)
    for est, gbai in [(e, v) for e in estimator_names() for v in gbai_options(e)]:
        a = compute_advantages(scores, uid, traj, agent, estimator=est, group_by_agent=gbai)
        b = compute_advantages(scores, *spread, estimator=est, group_by_agent=gbai)
        assert torch.equal(a, b), (est, gbai)


def test_unknown_estimator_lists_known_names():
    scores, uid, traj, agent = BATCHES[0]
    with pytest.raises(ValueError) as err:
        compute_advantages(scores, uid, traj, agent, estimator="dr_mas")
    for name in estimator_names():
        assert name in str(err.value)


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        (dict(single_row="nan"), ValueError),
        (dict(std_floor=-1.0), ValueError),
        (dict(scores=torch.tensor([1.0, float("nan")])), ValueError),
        (dict(scores=torch.tensor([1, 0])), TypeError),
        (dict(agent=torch.tensor([0.0, 1.0])), TypeError),
        (dict(uid=torch.tensor([0, 0, 0])), ValueError),
        (dict(uid=torch.tensor([0, 1]), traj=torch.tensor([4, 4]), estimator="grpo"), ValueError),
    ],
)
def test_bad_inputs(kwargs, exc):
    args = dict(scores=torch.tensor([1.0, 0.0]), uid=torch.tensor([0, 0]), traj=torch.tensor([1, 2]), agent=torch.tensor([0, 0]))
    args.update(kwargs)
    with pytest.raises(exc):
        compute_advantages(**args)


def test_empty_batch():
    e = torch.zeros(0, dtype=torch.int64)
    out = compute_advantages(torch.zeros(0), e, e, e)
    assert out.shape == (0,) and out.dtype == torch.float32


def test_registry_accepts_a_new_estimator():
    @register_estimator("test_step_mean_agent_std")
    def _est(r):
        from drmas_trainer.advantages import Terms

        return Terms(x=r.score, mean_from=r.by_uid.row_pool, std_from=r.by_uid_agent.row_pool)

    try:
        assert "test_step_mean_agent_std" in estimator_names()
        got = adv(**TWO_TRAJ, estimator="test_step_mean_agent_std")
        # row 0: (1 - 0.6) / solver std sqrt(1/3)
        assert got[0] == pytest.approx(0.4 / (math.sqrt(1 / 3) + EPS), rel=1e-6)
        with pytest.raises(ValueError):
            register_estimator("drmas")(_est)
    finally:
        ESTIMATORS.unregister("test_step_mean_agent_std")


def test_row_scores():
    valid = torch.tensor([True, False, True, False])
    got = row_scores(torch.tensor([1.0, 1.0, 0.0, 0.0]), valid, c_inv=0.1)
    assert got.dtype == torch.float32
    assert got.tolist() == pytest.approx([1.0, 0.9, 0.0, -0.1])
    by_traj = row_scores({7: 1.0, 9: 0.0}, valid, c_inv=0.01, traj=torch.tensor([7, 7, 9, 9]))
    assert by_traj.tolist() == pytest.approx([1.0, 0.99, 0.0, -0.01])
    with pytest.raises(ValueError):
        row_scores({7: 1.0}, valid, traj=torch.tensor([7, 7, 9, 9]))


def test_advantage_stats():
    a = torch.tensor([1.0, -1.0, 3.0, 0.5])
    stats = advantage_stats(a, torch.tensor([4, 4, 2, 4]))
    assert set(stats) == {2, 4}
    # agent 4: [1, -1, 0.5] -> mean 1/6, unbiased var = ((5/6)^2 + (7/6)^2 + (1/3)^2) / 2 = 1.0833
    assert stats[4]["mean"] == pytest.approx(1 / 6)
    assert stats[4]["std"] == pytest.approx(math.sqrt(((5 / 6) ** 2 + (7 / 6) ** 2 + (1 / 3) ** 2) / 2))
    assert stats[4]["abs_max"] == 1.0 and stats[4]["count"] == 3
    assert stats[2] == {"mean": 3.0, "std": 0.0, "abs_max": 3.0, "count": 1}


@pytest.mark.gpu
def test_cuda_inputs_give_cuda_output_equal_to_cpu():
    scores, uid, traj, agent = big_batch(100)
    cpu = compute_advantages(scores, uid, traj, agent)
    gpu = compute_advantages(scores.cuda(), uid.cuda(), traj.cuda(), agent.cuda())
    assert gpu.device.type == "cuda" and gpu.dtype == torch.float32
    assert torch.equal(gpu.cpu(), cpu)
