"""The newer reference versions' training metrics and losses against their own outputs
(../shared/reference_vectors: diagnostics.jsonl, loss_balance.jsonl, gspo.jsonl, kl_in_reward.jsonl).

Tolerances are the manifest's: relative 1e-6 for the float64 diagnostics, 1e-5 for the float32
losses and KL values (with a small absolute floor for values that are 0 up to rounding). Every case
of every rule must agree. Skips with a reason where the folder is absent (CI has it).
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from conftest import assert_all_agree, load_reference_cases

from drmas_trainer.adv_metrics import reference_adv_metrics
from drmas_trainer.loss_balance import agent_freq_weights
from drmas_trainer.losses import policy_loss
from drmas_trainer.rewards import kl_reward_step, make_kl_controller, row_scores

CONFIG = re.compile(r"^(?P<version>\w+)\[gbai=(?P<gbai>True|False),norm=(?P<norm>True|False)\]$")


def ids(values: list) -> torch.Tensor:
    """String ids -> integers in order of first appearance."""
    seen: dict = {}
    return torch.tensor([seen.setdefault(v, len(seen)) for v in values], dtype=torch.int64)


def close(a: float, b: float, rel: float, abs_: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def dicts_close(got: dict, want: dict, rel: float, abs_: float = 1e-9) -> bool:
    return sorted(got) == sorted(want) and all(close(got[k], want[k], rel, abs_) for k in want)


# ------------------------------------------------------------------------------- diagnostics.jsonl


@pytest.fixture(scope="module")
def diagnostics() -> list[dict]:
    return load_reference_cases("diagnostics.jsonl", "adv_metrics")


def _rows(case: dict):
    rows = case["input"]["rows"]
    names = list(dict.fromkeys(r[2] for r in rows))
    scores = row_scores(torch.tensor([float(r[3]) for r in rows]), torch.tensor([bool(r[4]) for r in rows]),
                        c_inv=case["input"]["c_inv"])
    agent = torch.tensor([names.index(r[2]) for r in rows])
    uid = ids([r[0] for r in rows])
    traj = ids([(r[0], r[1]) for r in rows])
    return scores, uid, traj, agent, names


def test_diagnostics_scores_are_the_reference_float32_scores(diagnostics):
    def check(c):
        got = _rows(c)[0].tolist()
        return got == c["reference"]["score"], got

    assert_all_agree("adv_metrics/score", diagnostics, check)


def test_every_diagnostics_batch_names_both_versions_four_configs(diagnostics):
    for c in diagnostics:
        configs = sorted(c["reference"]["metrics"])
        assert len(configs) == 8 and all(CONFIG.match(k) for k in configs)
        assert {CONFIG.match(k)["version"] for k in configs} == {"40f50a1", "755152e"}


@pytest.mark.parametrize("config", [f"{v}[gbai={g},norm={n}]" for v in ("40f50a1", "755152e")
                                    for g in ("True", "False") for n in ("True", "False")])
def test_adv_metrics_agree_with_the_reference(diagnostics, config):
    m = CONFIG.match(config)

    def check(c):
        scores, uid, traj, agent, names = _rows(c)
        got = reference_adv_metrics(scores, uid, traj, agent, names, group_by_agent=m["gbai"] == "True",
                                    version=m["version"], norm_by_std=m["norm"] == "True")
        return dicts_close(got, c["reference"]["metrics"][config], 1e-6), got

    assert_all_agree(f"adv_metrics/{config}", diagnostics, check)


# ------------------------------------------------------------------------------- loss_balance.jsonl


def test_loss_weights_agree_with_the_reference():
    cases = load_reference_cases("loss_balance.jsonl", "loss_weights")

    def check(c):
        rows = c["input"]["rows"]
        got = agent_freq_weights(ids([r[0] for r in rows]), ids([r[1] for r in rows])).tolist()
        return len(got) == len(c["reference"]) and all(close(g, w, 1e-6) for g, w in zip(got, c["reference"])), got

    assert_all_agree("loss_weights", cases, check)


def _loss_inputs(inp: dict):
    old = torch.tensor(inp["old_log_prob"], dtype=torch.float32)
    new = torch.tensor(inp["log_prob"], dtype=torch.float32)
    T = old.shape[1]
    mask = torch.arange(T)[None, :] < torch.tensor(inp["lengths"])[:, None]
    adv = torch.tensor(inp["advantages"], dtype=torch.float32)
    return new, old, adv, mask


LOSS_KEYS = ("pg_loss", "pg_clipfrac", "ppo_kl", "pg_clipfrac_lower")


def test_weighted_policy_loss_agrees_with_the_reference():
    cases = load_reference_cases("loss_balance.jsonl", "policy_loss/weighted")

    def check(c):
        inp = c["input"]
        logp, old, adv, mask = _loss_inputs(inp)
        w = agent_freq_weights(ids([r[0] for r in inp["rows"]]), ids([r[1] for r in inp["rows"]]))
        _, m = policy_loss(logp, old, adv, mask, mode="ppo", clip_low=0.2, clip_high=0.2, dual_clip=3.0,
                           agg=inp["loss_agg_mode"], pg_weights=w[:, None].expand_as(logp))
        got = {"loss_weights": w.tolist(), **{k: m[k] for k in LOSS_KEYS}}
        ok = all(close(g, r, 1e-5, 1e-7) for g, r in zip(got["loss_weights"], c["reference"]["loss_weights"]))
        ok = ok and all(close(got[k], c["reference"][k], 1e-5, 1e-7) for k in LOSS_KEYS)
        return ok, got

    assert_all_agree("policy_loss/weighted", cases, check)


# ------------------------------------------------------------------------------- gspo.jsonl


def test_gspo_loss_at_clip_0_2_agrees_with_the_reference():
    cases = load_reference_cases("gspo.jsonl", "policy_loss/gspo")

    def check(c):
        logp, old, adv, mask = _loss_inputs(c["input"])
        _, m = policy_loss(logp, old, adv, mask, mode="gspo", clip_low=0.2, clip_high=0.2, agg="seq-mean-token-mean")
        got = {k: m[k] for k in LOSS_KEYS}
        return all(close(got[k], c["reference"][k], 1e-5, 1e-7) for k in LOSS_KEYS), got

    assert_all_agree("policy_loss/gspo", cases, check)


# ------------------------------------------------------------------------------- kl_in_reward.jsonl


def _pad(rows: list[list[float]], T: int) -> torch.Tensor:
    return torch.tensor([r + [0.0] * (T - len(r)) for r in rows], dtype=torch.float32)


#: k3 / low_var_kl is exp(d) - d - 1 of float32 numbers near 1: its absolute resolution is a few ulp(1)
#: (1.2e-7 each) whatever its size, and float32 exp implementations differ by an ulp (numpy's and
#: torch's vectorised ones give 3.3498e-5 and 3.3617e-5 for d = -0.0082; float64 gives 3.3528e-5),
#: so a KL of 3e-5 agrees to ~4e-3 relative at best: the relative 1e-5 holds above an absolute 5e-7
KL_ABS = 5e-7


def test_kl_in_reward_agrees_with_the_reference():
    cases = load_reference_cases("kl_in_reward.jsonl", "kl_in_reward")

    def check(c):
        k = c["input"]["kl_ctrl"]
        ctrl = make_kl_controller(k["type"], k["kl_coef"], k.get("target_kl", 0.1), k.get("horizon", 10000))
        got, ok = [], True
        for step, want in zip(c["input"]["steps"], c["reference"]["steps"]):
            old = torch.tensor(step["old_log_probs"], dtype=torch.float32)
            ref = torch.tensor(step["ref_log_prob"], dtype=torch.float32)
            B, T = old.shape
            lengths = torch.tensor(step["lengths"])
            mask = torch.arange(T)[None, :] < lengths[:, None]
            scores = torch.zeros(B, T, dtype=torch.float32)
            scores[torch.arange(B), lengths - 1] = torch.tensor(step["rewards"], dtype=torch.float32)
            rewards, current_kl, beta = kl_reward_step(ctrl, scores, old, ref, mask, c["input"]["kl_penalty"])
            g = {"beta": beta, "current_kl": current_kl, "token_level_rewards": rewards.tolist(), "value_after": ctrl.value}
            got.append(g)
            ok = ok and close(beta, want["beta"], 1e-6) and close(current_kl, want["current_kl"], 1e-5, KL_ABS)
            ok = ok and close(ctrl.value, want["value_after"], 1e-6)
            ok = ok and all(close(a, b, 1e-5, KL_ABS) for ra, rb in zip(g["token_level_rewards"], want["token_level_rewards"])
                            for a, b in zip(ra, rb))
        return ok and len(got) == len(c["reference"]["steps"]), got

    assert_all_agree("kl_in_reward", cases, check)
