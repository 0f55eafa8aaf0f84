"""Every training switch proven inside a step: for each one (loss balance, KL in the reward and its
adaptive controller, the no-std ablation, per-agent grad clip, GSPO, the adv-metrics versions) one
real training step (``drmas_trainer.trainer.rl_step``) runs with it on and with it off from the same
state, and the difference it must make (the weights in the loss, the scores and advantages, the
clip, the logged names) is checked against a plain computation written here.

What is real: the toy workflow and its grading, the trainer's step (rows, old log-probs, reference
log-probs, scores, advantages, updates, sync), two worker groups of the tiny-random model with their
AdamW. What is fake: the rollout engine, :class:`FakeScriptedEngine`, which answers each call with
one of a few scripted texts chosen by the call's sampling seed, so that rewards, validity and the
number of calls per agent vary (a tiny-random model's samples are all invalid, all scores equal,
all advantages 0). What is observed: ``Loop.observe`` (the rows, scores, advantages and updates the
step used), the step's record, and the optimiser's public step pre-hook (the gradient it steps on).
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import Counter, defaultdict
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from drmas_bench.models.loading import load_causal_lm
from drmas_bench.runner import TeamRuntime
from drmas_bench.types import Completion, Request
from drmas_bench.workflows.base import derive_seed, get_workflow
from drmas_trainer import metric_names
from drmas_trainer.config.groups import plan_worker_groups
from drmas_trainer.config.train import load_config
from drmas_trainer.logprobs import pack_rows, token_logprobs
from drmas_trainer.prepare import load_train_tasks, rollout_sampling, rollout_team
from drmas_trainer.scoring import start_kl_controller
from drmas_trainer.trainer import Loop, next_prompts, rl_step
from drmas_trainer.worker import WorkerGroup

# one small step: 4 prompts x 4 episodes, one optimiser step per group, no warm start, no rollout
# correction (the rows' loss weights are the switches' own), no grad clip unless a test sets one
BASE = {"sft.steps": 0, "sft.agent_steps": {}, "data.size": 40, "rollout.prompts_per_step": 4, "rollout.n": 4,
        "rollout.max_new_tokens": 12, "rollout.correction": "none", "algo.mini_batches": 1,
        "agent_defaults.micro_batch_size": 64, "agent_defaults.grad_clip": 0, "agent_defaults.engine_options": {}}
EPS = 1e-6  # algo.eps


# ------------------------------------------------------------------------------------------ the fake engine


class FakeScriptedEngine:
    """A fake rollout engine: each call's reply is one of a few scripted texts, picked by the call's
    sampling seed (deterministic, so two runs from one state see the same episodes). Solver: the
    right sum, a wrong one, or no answer tag; checker: approve, reject (the solver then acts again)
    or no verdict. Token ids are the group's tokenizer's (they decode back to the text, as the
    trainer's token check requires); log-probs are 0 (the trainer recomputes the old ones)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.is_awake = True
        self.synced = 0

    def footprint_bytes(self) -> int:
        return 0  # no weights of its own: the rollout keeps it awake (nothing to budget)

    def reply(self, req: Request) -> str:
        k = (req.sampling.seed or 0) % 5
        user = req.messages[-1]["content"]
        a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", user).groups())
        if req.agent == "solver":
            return [f"<answer>{a + b}</answer>", f"<answer>{a + b + 1}</answer>", f"I think {a + b}",
                    f"<answer>{a + b}</answer> sure", f"<answer>{a + b + 2}</answer>"][k]
        return ["<verdict>approve</verdict>", "<verdict>reject</verdict>", "hmm", "<verdict>reject</verdict>",
                "<verdict>approve</verdict> yes"][k]

    async def generate(self, requests: list[Request]) -> list[Completion]:
        out = []
        for req in requests:
            text = self.reply(req)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            prompt = self.tokenizer(" ".join(m["content"] for m in req.messages), add_special_tokens=False)["input_ids"]
            out.append(Completion(text, list(ids), list(prompt[-24:]), [0.0] * len(ids), prompt_tokens=min(24, len(prompt)),
                                  completion_tokens=len(ids)))
        return out

    async def update_weights(self, weights: Any) -> None:
        for _ in weights:
            pass
        self.synced += 1

    async def update_adapter(self, name: str, config: Any, tensors: Any) -> None:
        self.synced += 1

    async def wake(self) -> None:
        self.is_awake = True

    async def sleep(self) -> None:
        self.is_awake = False

    async def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------ one step


@pytest.fixture(scope="module")
def tiny_path() -> str:
    from drmas_bench.models import resolve_model

    got = resolve_model("tiny-random")
    return str(getattr(got, "path", got))


def moved(wg: WorkerGroup) -> None:
    """The same seeded nudge of every weight in every run: the policy is no longer the reference
    (the recipe's model), so KL in the reward has something to measure."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in wg.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def watch(wg: WorkerGroup, seen: list[dict[str, Any]], keep_weights: bool = False) -> None:
    """Record the gradient each optimiser steps on (torch's public step pre-hook): per worker group,
    or per LoRA adapter (each has its own optimiser), flat, under ``grads[name]`` (the step's last);
    ``keep_weights``: also, per optimiser step, (its gradient, the policy's weights it stepped from)
    under ``history[name]``."""
    opts = getattr(wg.optimizer, "optimizers", None) or {wg.name: wg.optimizer}
    for key, opt in opts.items():
        params = [p for group in opt.param_groups for p in group["params"]]

        def grab(o: Any, args: Any, kwargs: Any, key: str = key, params: list = params) -> None:
            grads = [p.grad.detach().flatten().clone() for p in params if p.grad is not None]
            if grads:
                seen[-1]["grads"][key] = torch.cat(grads)
            if keep_weights:
                weights = {n: p.detach().clone() for n, p in wg.policy.named_parameters()}
                seen[-1].setdefault("history", {}).setdefault(key, []).append((torch.cat(grads), weights))
        opt.register_step_pre_hook(grab)


def steps(tiny_path: str, tmp_path: Any, n: int = 1, recipe: str = "tiny", keep_weights: bool = False,
          **over: Any) -> list[dict[str, Any]]:
    """``n`` training steps of ``recipe`` (BASE + ``over``) from the same starting state every
    time; per step: what ``Loop.observe`` saw, the step's record, and each group's (LoRA: each
    adapter's) gradient as its optimiser stepped on it (``grads[name]``, flat; ``keep_weights``:
    every optimiser step's gradient and starting weights, ``history[name]``)."""
    cfg = load_config(recipe, {**BASE, **over})
    wf = get_workflow(cfg.workflow)
    plan = plan_worker_groups(cfg, wf.agents)
    workers: dict[str, WorkerGroup] = {}
    seen: list[dict[str, Any]] = []
    for name, g in plan.items():
        lora = dict(adapters=dict(g.adapters), adapter_of=dict(g.adapter_of)) if g.lora else {}
        wg = workers[name] = WorkerGroup(name, g.agents, g.settings, tiny_path, device="cpu",
                                         seed=derive_seed(cfg.seed, "wg", name), torch_threads=1, **lora)
        moved(wg)
        wg.engine = FakeScriptedEngine(wg.tokenizer)
        watch(wg, seen, keep_weights)
    runtime = TeamRuntime(rollout_team(cfg, plan, wf), workers, rollout_sampling(cfg))
    lp = Loop(cfg, plan, wf, runtime, None, workers, kl_ctrl=start_kl_controller(cfg, tmp_path, 0),
              observe=lambda obs: seen[-1].update(obs))
    tasks = load_train_tasks(cfg)
    P = cfg.rollout.prompts_per_step
    for step in range(1, n + 1):
        seen.append({"grads": {}})
        batch = next_prompts(tasks, (step - 1) * P, P, cfg.data)
        seen[-1]["record"] = asyncio.run(rl_step(lp, batch, step, (step - 1) * P))
    return seen


@pytest.fixture(scope="module")
def base(tiny_path, tmp_path_factory) -> dict[str, Any]:
    """The step with every switch off (the recipe's defaults, grad clip off)."""
    return steps(tiny_path, tmp_path_factory.mktemp("base"))[0]


# ------------------------------------------------------------------------------------------ plain computations


def plain_scores(obs: dict[str, Any], c_inv: float = 0.1) -> list[float]:
    return [float(torch.tensor(r - c_inv * (1.0 - float(v)), dtype=torch.float32))
            for r, v in zip(obs["reward"].tolist(), obs["valid"].tolist())]


def pools(obs: dict[str, Any]) -> dict[tuple[int, int], list[int]]:
    """(uid, agent) -> the row indices of that agent in that prompt group."""
    out: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (u, a) in enumerate(zip(obs["uid"].tolist(), obs["agent"].tolist())):
        out[(u, a)].append(i)
    return out


def plain_drmas(scores: list[float], obs: dict[str, Any], norm_by_std: bool = True) -> list[float]:
    """Dr. MAS advantages by loops: per (uid, agent) mean and unbiased std (one row: 0 and 1)."""
    adv = [0.0] * len(scores)
    for idx in pools(obs).values():
        xs = [scores[i] for i in idx]
        if len(xs) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(xs) / len(xs)
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
        for i in idx:
            adv[i] = (scores[i] - mean) / (std + EPS) if norm_by_std else scores[i] - mean
    return adv


def plain_balance(obs: dict[str, Any]) -> list[float]:
    """1 / (rows of the row's (uid, agent)), divided by its batch mean."""
    n = Counter(zip(obs["uid"].tolist(), obs["agent"].tolist()))
    raw = [1.0 / n[(u, a)] for u, a in zip(obs["uid"].tolist(), obs["agent"].tolist())]
    return [w / (sum(raw) / len(raw)) for w in raw]


def weights(obs: dict[str, Any]) -> list[float]:
    """Each row's loss weight as its worker group got it (one value per row; None: no weights)."""
    out = []
    for r in obs["rows"]:
        if r.is_weights is None:
            out.append(1.0)
        else:
            assert len(set(r.is_weights)) == 1, "a row's tokens carry one weight"
            out.append(r.is_weights[0])
    return out


def plain_pg_loss(obs: dict[str, Any], wg: str, mode: str = "ppo", w: list[float] | None = None) -> float:
    """A group's policy loss at ratio 1 (its first optimiser step, old log-probs recomputed):
    ppo token-mean of -w*A; gspo the mean over rows of -A (seq-mean-token-mean)."""
    idx = [i for i, r in enumerate(obs["rows"]) if obs["wg"][i] == wg and r.response_ids]
    w = w or [1.0] * len(obs["rows"])
    A = [obs["rows"][i].advantage for i in idx]
    n = [len(obs["rows"][i].response_ids) for i in idx]
    if mode == "gspo":
        return -sum(A) / len(A)
    return -sum(w[i] * a * k for i, a, k in zip(idx, A, n)) / sum(n)


def close(a: list[float], b: list[float], tol: float = 1e-5) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def test_the_fixed_step_has_what_the_switches_need(base):
    """The scripted episodes give what every check below needs: rewards and validity that vary
    within prompt groups, (prompt, agent) pools of several sizes, nonzero advantages, both groups updated."""
    obs = base
    assert 0 < float(obs["reward"].mean()) < 1 and 0 < float(obs["valid"].float().mean()) < 1
    assert len({len(v) for v in pools(obs).values()}) > 1  # agents act a varying number of times per prompt
    assert max(abs(a) for a in obs["adv"].tolist()) > 0.5
    assert set(obs["grads"]) == set(obs["updates"]) == {"solver", "checker"}
    assert all(u["optimizer_steps"] == 1 for u in obs["updates"].values())
    # every switch off: the recipe's scores and advantages, no loss weights
    assert close(obs["scores"].tolist(), plain_scores(obs))
    assert close(obs["adv"].tolist(), plain_drmas(plain_scores(obs), obs), 1e-4)
    assert weights(obs) == [1.0] * len(obs["rows"])
    assert [r.advantage for r in obs["rows"]] == obs["adv"].tolist()
    for wg in ("solver", "checker"):
        assert obs["updates"][wg]["pg_loss"] == pytest.approx(plain_pg_loss(obs, wg), abs=1e-5)


def test_the_step_record_carries_its_workload_and_phase_timers(base):
    """Each generate call's figures (call index = the row's position in its episode) and each
    group's tokens, counted by hand from the rows the step trained on; every phase timed, wall and CPU."""
    rec, calls, pos = base["record"], {}, {}
    for row, t in zip(base["rows"], base["traj"].tolist()):
        i = pos[t] = pos.get(t, -1) + 1
        calls.setdefault((i, row.agent), []).append((len(row.prompt_ids), len(row.response_ids)))
    assert rec[metric_names.WL_EPISODES] == len(set(base["traj"].tolist()))
    for (i, a), xs in calls.items():
        assert rec[metric_names.call(a, i, metric_names.WL_EPISODES)] == len(xs)
        assert rec[metric_names.call(a, i, metric_names.WL_PROMPT)] == pytest.approx(sum(p for p, _ in xs) / len(xs))
        assert rec[metric_names.call(a, i, metric_names.WL_RESPONSE_MAX)] == max(r for _, r in xs)
    for g in ("solver", "checker"):
        rows = [r for r, wg in zip(base["rows"], base["wg"]) if wg == g]
        assert rec[metric_names.wg(g, metric_names.WL_RESPONSE_TOKENS)] == sum(len(r.response_ids) for r in rows)
    for k in (metric_names.TIME_GEN, metric_names.TIME_OLD_LOGPROB, metric_names.TIME_UPDATE, metric_names.TIME_SYNC):
        assert rec[k] >= 0 and rec[metric_names.cpu(k)] >= 0


# ------------------------------------------------------------------------------------------ the switches


def test_loss_balance_weights_each_row_in_the_loss(base, tiny_path, tmp_path):
    on = steps(tiny_path, tmp_path, **{"algo.balance_loss_by_agent_freq": True})[0]
    assert on["adv"].tolist() == base["adv"].tolist()  # same episodes, same advantages: only the loss changes
    w = plain_balance(on)
    assert len(set(round(x, 6) for x in w)) > 1  # the agents' call counts differ, so the weights do
    assert close(weights(on), w)
    for wg in ("solver", "checker"):
        got, off = on["updates"][wg]["pg_loss"], base["updates"][wg]["pg_loss"]
        assert got == pytest.approx(plain_pg_loss(on, wg, w=w), abs=1e-5)
        assert off == pytest.approx(plain_pg_loss(base, wg), abs=1e-5)
    assert not torch.allclose(on["grads"]["solver"], base["grads"]["solver"])


def test_the_no_std_ablation_centres_without_scaling(base, tiny_path, tmp_path):
    on = steps(tiny_path, tmp_path, **{"algo.norm_by_std": False})[0]
    assert on["scores"].tolist() == base["scores"].tolist()
    want = plain_drmas(plain_scores(on), on, norm_by_std=False)
    assert close(on["adv"].tolist(), want) and close([r.advantage for r in on["rows"]], want)
    assert not close(base["adv"].tolist(), want)  # with std: a different advantage
    for wg in ("solver", "checker"):
        assert on["updates"][wg]["pg_loss"] == pytest.approx(plain_pg_loss(on, wg), abs=1e-5)


def plain_grad(tiny_path: str, obs: dict[str, Any], wg: str, mode: str) -> torch.Tensor:
    """The gradient of a group's first step at ratio 1, from the starting weights, by autograd on the
    plain objective: ppo -sum_i A_i sum_t logp_it / (all tokens); gspo -mean_i A_i mean_t logp_it."""
    group = WorkerGroup(wg, [wg], plan_worker_groups(load_config("tiny", BASE), ("solver", "checker"))[wg].settings,
                        tiny_path, device="cpu")
    moved(group)
    rows = [r for i, r in enumerate(obs["rows"]) if obs["wg"][i] == wg and r.response_ids]
    batch = pack_rows([r.prompt_ids for r in rows], [r.response_ids for r in rows], group.pad_id)
    logp, _ = token_logprobs(group.policy, batch)
    A = torch.tensor([r.advantage for r in rows])
    per_row = (logp * batch["mask"]).sum(dim=-1)
    n = batch["mask"].sum(dim=-1)
    loss = -(A * per_row).sum() / n.sum() if mode == "ppo" else -(A * per_row / n).mean()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in group.params if p.grad is not None])


def plain_gspo_after_an_update(tiny_path: str, obs: dict[str, Any], wg: str, lo: float = 3e-4,
                               hi: float = 4e-4) -> tuple[float, torch.Tensor, float, torch.Tensor]:
    """A group's second optimiser step of a GSPO step with two epochs, by a plain loop over its rows
    (REFERENCE.md section 1): the log-probs at the weights that step started from (after the first
    update) against the old ones (at the weights the first started from); per row the sequence ratio
    ``s = exp(mean_t(logp_t - old_t))``, its loss ``max(-A s, -A clip(s, 1 - lo, 1 + hi))``, the mean
    over rows, and its gradient by autograd. Also the same with the per-token ratio (clipped per
    token, averaged over the row's tokens): what a token-level GSPO would give. (loss, grad, token
    loss, token grad)."""
    (_, start), (_, after) = obs["history"][wg][:2]
    group = WorkerGroup(wg, [wg], plan_worker_groups(load_config("tiny", BASE), ("solver", "checker"))[wg].settings,
                        tiny_path, device="cpu")
    rows = [r for i, r in enumerate(obs["rows"]) if obs["wg"][i] == wg and r.response_ids]
    batch = pack_rows([r.prompt_ids for r in rows], [r.response_ids for r in rows], group.pad_id)

    def logp_at(weights: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            for n, p in group.policy.named_parameters():
                p.copy_(weights[n])
        return token_logprobs(group.policy, batch)[0]

    with torch.no_grad():
        old = logp_at(start)
    logp = logp_at(after)
    seq, tok = [], []
    for i, r in enumerate(rows):
        valid = batch["mask"][i].bool()
        diff = logp[i][valid] - old[i][valid]
        a = r.advantage
        s = torch.exp(diff.mean())
        seq.append(torch.maximum(-a * s, -a * s.clamp(1 - lo, 1 + hi)))
        ratio = torch.exp(diff)
        tok.append(torch.maximum(-a * ratio, -a * ratio.clamp(1 - lo, 1 + hi)).mean())
    params = [p for p in group.params if p.requires_grad]
    out = []
    for loss in (torch.stack(seq).mean(), torch.stack(tok).mean()):
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        out += [float(loss.detach()), torch.cat([g.flatten() for g in grads if g is not None])]
    return out[0], out[1], out[2], out[3]


def test_gspo_is_the_loss_the_groups_train_with(base, tiny_path, tmp_path):
    """Two epochs over the step's rows: the first optimiser step at ratio 1 (where the sequence and
    the per-token ratio agree), the second after an update, where the log-probs moved unevenly across
    a row's tokens and the two differ; each step's loss and gradient are the sequence-level ones."""
    on = steps(tiny_path, tmp_path, keep_weights=True, **{"algo.loss": "gspo", "algo.ppo_epochs": 2})[0]
    assert on["adv"].tolist() == base["adv"].tolist()
    for wg in ("solver", "checker"):
        assert on["updates"][wg]["optimizer_steps"] == 2 and len(on["history"][wg]) == 2
        assert base["updates"][wg]["pg_loss"] == pytest.approx(plain_pg_loss(base, wg, "ppo"), abs=1e-5)
        # the first step: the sequence-level objective's gradient (rows of different lengths: it
        # differs from the token-level PPO one)
        first = on["history"][wg][0][0]
        gspo, ppo = plain_grad(tiny_path, on, wg, "gspo"), plain_grad(tiny_path, base, wg, "ppo")
        scale = float(ppo.abs().max())
        assert float((gspo - ppo).abs().max()) > 0.05 * scale
        assert torch.allclose(first, gspo, rtol=1e-3, atol=1e-4 * scale)
        assert torch.allclose(base["grads"][wg], ppo, rtol=1e-3, atol=1e-4 * scale)
        # the second step, after the first update: the sequence ratio, not the per-token one
        loss2, grad2, tok_loss2, tok_grad2 = plain_gspo_after_an_update(tiny_path, on, wg)
        g_scale = float(grad2.abs().max())
        assert g_scale > 0 and float((grad2 - tok_grad2).abs().max()) > 0.05 * g_scale  # the two ratios differ here
        assert abs(loss2 - tok_loss2) > 1e-3 * max(abs(loss2), 1e-3), (loss2, tok_loss2)
        second = on["history"][wg][1][0]
        assert torch.allclose(second, grad2, rtol=1e-3, atol=1e-4 * g_scale)
        # the update's logged pg_loss is the mean over its two steps (the first at ratio 1)
        assert on["updates"][wg]["pg_loss"] == pytest.approx((plain_pg_loss(on, wg, "gspo") + loss2) / 2, abs=1e-5)


def test_per_agent_grad_clip_scales_each_groups_gradient_to_its_own_bound(base, tiny_path, tmp_path):
    norms = {wg: float(g.double().norm()) for wg, g in base["grads"].items()}
    clip = {"solver": 0.5 * norms["solver"], "checker": 0.25 * norms["checker"]}
    on = steps(tiny_path, tmp_path, **{f"agents.{a}.grad_clip": c for a, c in clip.items()})[0]
    for wg, g in base["grads"].items():
        assert on["updates"][wg]["grad_norm"] == pytest.approx(norms[wg], rel=1e-5)  # logged before the clip
        assert base["updates"][wg]["grad_norm"] == pytest.approx(norms[wg], rel=1e-5)
        want = g * (clip[wg] / (norms[wg] + 1e-6))  # torch's clip_grad_norm_
        assert torch.allclose(on["grads"][wg], want, rtol=1e-4, atol=1e-7 * norms[wg])
        assert float(on["grads"][wg].double().norm()) == pytest.approx(clip[wg], rel=1e-4)


def test_per_agent_grad_clip_of_lora_adapters_in_one_group(tiny_path, tmp_path):
    """shared_base: one worker group, an adapter per agent, each clipped to its own agent's bound."""
    off = steps(tiny_path, tmp_path, recipe="tiny_lora")[0]
    assert set(off["grads"]) == {"solver", "checker"} and list(off["updates"]) == ["shared"]
    norms = {a: float(g.double().norm()) for a, g in off["grads"].items()}
    clip = {"solver": 0.5 * norms["solver"], "checker": 0.25 * norms["checker"]}
    on = steps(tiny_path, tmp_path, recipe="tiny_lora", **{f"agents.{a}.grad_clip": c for a, c in clip.items()})[0]
    total = math.sqrt(sum(v * v for v in norms.values()))
    assert on["updates"]["shared"]["grad_norm"] == pytest.approx(total, rel=1e-4)  # over all adapters, before the clip
    for a, g in off["grads"].items():
        assert torch.allclose(on["grads"][a], g * (clip[a] / (norms[a] + 1e-6)), rtol=1e-4, atol=1e-7 * norms[a])


def test_kl_in_the_reward_and_its_adaptive_controller(base, tiny_path, tmp_path):
    kl = {"algo.use_kl_in_reward": True, "algo.kl_penalty": "low_var_kl", "algo.kl_ctrl.type": "adaptive",
          "algo.kl_ctrl.kl_coef": 0.2, "algo.kl_ctrl.target_kl": 1e-4, "algo.kl_ctrl.horizon": 100}
    s1, s2 = steps(tiny_path, tmp_path, n=2, **kl)
    on = s1
    # the reference policy is the recipe's model (before the nudge): its log-probs, here, plainly
    ref = load_causal_lm(tiny_path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(tiny_path)
    rows = on["rows"]
    batch = pack_rows([r.prompt_ids for r in rows], [r.response_ids for r in rows],
                      tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    with torch.no_grad():
        ref_lp, _ = token_logprobs(ref, batch)
    penalty, per_row = [], []
    for b, r in enumerate(rows):
        old = torch.tensor(r.old_logprobs, dtype=torch.float32)
        d = (ref_lp[b, : len(old)].float() - old).clamp(-20, 20)
        k3 = (torch.exp(d) - d - 1).clamp(-10, 10)  # low_var_kl per token
        penalty.append(float(k3.sum()))
        per_row.append(float(k3.sum()) / len(old))
    beta = 0.2
    scores = [x - beta * p for x, p in zip(plain_scores(on), penalty)]
    assert max(beta * p for p in penalty) > 1e-3  # the nudged policy is measurably away from the reference
    assert close(on["scores"].tolist(), scores, 1e-4)
    assert close(on["adv"].tolist(), plain_drmas(on["scores"].tolist(), on), 1e-4)
    assert not close(on["adv"].tolist(), plain_drmas(plain_scores(on), on), 1e-3)
    rec = on["record"]
    current = sum(per_row) / len(per_row)
    assert rec[metric_names.REWARD_KL] == pytest.approx(current, rel=1e-4)
    assert rec[metric_names.REWARD_KL_COEFF] == beta
    err = min(max(current / 1e-4 - 1.0, -0.2), 0.2)
    nxt = beta * (1 + err * len(rows) / 100)
    assert rec[metric_names.REWARD_KL_COEFF_NEXT] == pytest.approx(nxt, rel=1e-9) and nxt != beta
    # the next step penalises with the value the controller left
    assert s2["record"][metric_names.REWARD_KL_COEFF] == pytest.approx(nxt, rel=1e-12)
    # without the switch: the plain scores and no KL record
    assert close(base["scores"].tolist(), plain_scores(base))
    assert metric_names.REWARD_KL not in base["record"]


def plain_adv_metrics(obs: dict[str, Any], names: tuple[str, ...] = ("solver", "checker")) -> dict[str, float]:
    """A few of each family, by loops: adv_norm abs_max and adv_std mean per agent (the (uid,
    agent) pools' std, one row: 1), adv_diag mean_gap_mean (each pool's mean minus its uid's mean of
    trajectory means)."""
    adv, x = obs["adv"].tolist(), obs["scores"].double().tolist()
    uid, agent, traj = obs["uid"].tolist(), obs["agent"].tolist(), obs["traj"].tolist()
    out: dict[str, float] = {}
    by_traj: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for i in range(len(x)):
        by_traj[uid[i]][traj[i]].append(x[i])
    mu = {}
    for u, ts in by_traj.items():
        means = [sum(v) / len(v) for v in ts.values()]
        mu[u] = sum(means) / len(means) if len(means) > 1 else 0.0
    for k, a in enumerate(names):
        mine = [i for i in range(len(x)) if agent[i] == k]
        out[f"adv_norm/{a}/abs_max"] = max(abs(adv[i]) for i in mine)
        stds, gaps = [], []
        for (u, ak), idx in pools(obs).items():
            if ak != k:
                continue
            xs = [x[i] for i in idx]
            m = sum(xs) / len(xs) if len(xs) > 1 else 0.0
            stds.append(math.sqrt(sum((v - m) ** 2 for v in xs) / (len(xs) - 1)) if len(xs) > 1 else 1.0)
            gaps.append(m - mu[u])
        out[f"adv_std/{a}/mean"] = sum(stds) / len(stds)
        out[f"adv_diag/{a}/mean_gap_mean"] = sum(gaps) / len(gaps)
    return out


@pytest.mark.parametrize("version", ["755152e", "none"])
def test_adv_metrics_versions_log_their_families(base, tiny_path, tmp_path, version):
    plain = plain_adv_metrics(base)
    for k, v in plain.items():  # 40f50a1, the default: all three families
        assert base["record"][k] == pytest.approx(v, rel=1e-6, abs=1e-9), k
    on = steps(tiny_path, tmp_path, **{"algo.adv_metrics": version})[0]
    got = {k for k in on["record"] if k.split("/")[0] in ("adv_std", "adv_norm", "adv_diag")}
    if version == "none":
        assert got == set()
    else:  # 755152e: adv_std and adv_norm, no adv_diag
        assert {k.split("/")[0] for k in got} == {"adv_std", "adv_norm"}
        for k, v in plain.items():
            if not k.startswith("adv_diag"):
                assert on["record"][k] == pytest.approx(v, rel=1e-6, abs=1e-9), k
    assert on["adv"].tolist() == base["adv"].tolist()  # metrics only: the training is the same
