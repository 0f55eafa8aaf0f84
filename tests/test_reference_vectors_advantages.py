"""Our estimators against the reference's own advantages (../shared/reference_vectors/advantages.jsonl).

Each case is one batch of rows ``[uid, traj, agent, R, valid]`` in batch order with ``c_inv``; the
reference gives every row's float32 score and, per advantage name, every row's advantage. A name
reads ``[ablation:]ESTIMATOR[gbai=..,norm=..]``: ESTIMATOR is the reference's name (``master``,
``3b556f2``, or the ablation branch's ``adv_estimator`` value), which is also ours, ``gbai`` its
``group_by_agent_id`` and ``norm`` its ``norm_adv_by_std_in_grpo``. Every batch, every name and every
row must agree to a relative 1e-6 (the manifest's tolerance; ours are float32, the reference's
float64 on float32 scores). Skips with a reason where the folder is absent (CI has it).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from conftest import assert_all_agree, load_reference_cases
from drmas_trainer.advantages import compute_advantages
from drmas_trainer.rewards import row_scores

VERSIONS = {
    "master": ["gbai=False,norm=False", "gbai=False,norm=True", "gbai=True,norm=False", "gbai=True,norm=True"],
    "3b556f2": ["gbai=False", "gbai=True"],
}
ABLATIONS = ["auto", "agent_agent", "traj_traj", "agent_traj", "traj_agent"]
NAMES = sorted(
    [f"{v}[{o}]" for v, opts in VERSIONS.items() for o in opts]
    + [f"ablation:{e}[{o}]" for e in ABLATIONS for o in VERSIONS["master"]]
)
NAME = re.compile(r"^(?:ablation:)?(?P<est>\w+)\[gbai=(?P<gbai>True|False)(?:,norm=(?P<norm>True|False))?\]$")


@pytest.fixture(scope="module")
def cases() -> list[dict]:
    return load_reference_cases("advantages.jsonl", "advantages")


def batch(case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scores, uid, traj, agent) of one case; string ids become integers in order of appearance."""
    rows = case["input"]["rows"]

    def ids(col: int) -> torch.Tensor:
        seen: dict[str, int] = {}
        return torch.tensor([seen.setdefault(r[col], len(seen)) for r in rows], dtype=torch.int64)

    reward = torch.tensor([float(r[3]) for r in rows])
    valid = torch.tensor([bool(r[4]) for r in rows])
    return row_scores(reward, valid, c_inv=case["input"]["c_inv"]), ids(0), ids(1), ids(2)


def close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(math.isclose(g, w, rel_tol=1e-6, abs_tol=1e-12) for g, w in zip(got, want))


def test_every_batch_names_the_same_estimators(cases):
    assert len(cases) == 120
    for c in cases:
        assert sorted(c["reference"]["advantages"]) == NAMES


def test_row_scores_are_the_reference_float32_scores(cases):
    """R - c_inv * (1 - valid), rounded to float32 as the reference stores it: equal, not close."""
    def check(c):
        got = batch(c)[0].tolist()
        return got == c["reference"]["score"], got

    assert_all_agree("advantages/score", cases, check)


@pytest.mark.parametrize("name", NAMES)
def test_advantages_agree_with_the_reference(cases, name):
    m = NAME.match(name)
    assert m, name
    kw = dict(estimator=m["est"], group_by_agent=m["gbai"] == "True", norm_by_std=m["norm"] != "False")

    def check(c):
        got = compute_advantages(*batch(c), **kw).tolist()
        return close(got, c["reference"]["advantages"][name]), got

    assert_all_agree(f"advantages/{name}", cases, check)
