"""Rollout correction (trainer/rollout_correction.py), recomputed old log-probs, the token-in/token-out
check and reproducible sampling seeds.

Each correction and each metric is checked against a plain Python loop over rows and tokens on random
inputs whose padding holds garbage (NaN), then on the tiny recipe with a real mismatch: the engine in
bf16, the trainer in fp32."""

from __future__ import annotations

import asyncio
import json
import math
import random

import pytest
import torch

from drmas_bench.types import Completion, Request, Sampling, Task, Trajectory, Turn, UserError
from drmas_bench.workflows.base import Episode, get_workflow, sample_seed
from drmas_trainer.config.train import AgentConfig, load_config
from drmas_trainer.logprobs import pack_rows, token_logprobs
from drmas_trainer.losses import policy_loss
from drmas_trainer.rollout_correction import CORRECTIONS, correction_weights, mismatch_metrics, pad_lists
from drmas_trainer.trainer import make_rows
from drmas_trainer.worker import LossSettings, Row, WorkerGroup

torch.set_num_threads(1)
C = 2.0


def run(coro):
    return asyncio.run(coro)


def _random_batch(seed: int, B: int = 7, T: int = 9, spread: float = 0.6):
    """old / engine log-probs [B, T] with NaN on padding, the mask, and the real values per row."""
    g = torch.Generator().manual_seed(seed)
    lens = [int(x) for x in torch.randint(0, T + 1, (B,), generator=g)]
    lens[0] = T  # one full row
    lens[1] = 0  # one empty row
    old = torch.full((B, T), float("nan"), dtype=torch.float64)
    eng = torch.full((B, T), float("nan"), dtype=torch.float64)
    mask = torch.zeros((B, T), dtype=torch.bool)
    rows = []
    for b, n in enumerate(lens):
        e = (-torch.rand(n, generator=g, dtype=torch.float64) * 3).tolist()
        o = [x + float(torch.randn((), generator=g, dtype=torch.float64)) * spread for x in e]
        old[b, :n] = torch.tensor(o, dtype=torch.float64)
        eng[b, :n] = torch.tensor(e, dtype=torch.float64)
        mask[b, :n] = True
        rows.append((o, e))
    return old, eng, mask, rows


def _loop_weights(name: str, o: list[float], e: list[float], c: float) -> list[float]:
    """The reference: one row's weights, token by token."""
    lr = [a - b for a, b in zip(o, e)]
    if name == "none":
        return [1.0] * len(lr)
    if name == "tis_token":
        return [min(math.exp(x), c) for x in lr]
    if name == "mis_token":
        return [math.exp(x) if math.exp(x) <= c else 0.0 for x in lr]
    s = sum(lr)
    if name == "tis_seq":
        return [min(math.exp(s), c)] * len(lr)
    if name == "mis_seq":
        return [math.exp(s) if math.exp(s) <= c else 0.0] * len(lr)
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["none", "tis_token", "tis_seq", "mis_token", "mis_seq"])
def test_each_correction_matches_a_loop_reference(name):
    assert set(CORRECTIONS) == {"none", "tis_token", "tis_seq", "mis_token", "mis_seq"}
    for seed in range(4):
        old, eng, mask, rows = _random_batch(seed, spread=0.3 if name.endswith("seq") else 0.8)
        w = correction_weights(name, old, eng, mask, threshold=C)
        assert w.shape == old.shape and not w.requires_grad and torch.isfinite(w).all()
        assert (w[~mask] == 0).all()  # padding gets no weight, whatever it held
        for b, (o, e) in enumerate(rows):
            ref = _loop_weights(name, o, e, C)
            assert w[b, : len(o)].tolist() == pytest.approx(ref, rel=1e-6, abs=1e-7), (name, seed, b)
    # the inputs cross C both ways, so truncation and dropping were exercised
    old, eng, mask, rows = _random_batch(0, spread=0.8)
    ratios = [math.exp(a - b) for o, e in rows for a, b in zip(o, e)]
    assert any(r > C for r in ratios) and any(r < C for r in ratios)


def test_sequence_ratio_is_computed_in_log_space():
    # 400 tokens each with ratio e^0.1: the product e^40 overflows nothing, and is truncated to C
    old = torch.full((1, 400), -1.0, dtype=torch.float64)
    eng = torch.full((1, 400), -1.1, dtype=torch.float64)
    mask = torch.ones((1, 400), dtype=torch.bool)
    assert torch.allclose(correction_weights("tis_seq", old, eng, mask, C), torch.full((1, 400), C, dtype=torch.float32))
    assert (correction_weights("mis_seq", old, eng, mask, C) == 0).all()
    assert torch.allclose(correction_weights("mis_seq", eng, old, mask, C), torch.zeros(1, 400) + math.exp(-20.0))


def _loop_metrics(rows, name: str, c: float) -> dict[str, float]:
    toks = [(a, b) for o, e in rows for a, b in zip(o, e)]
    seqs = [(o, e) for o, e in rows if o]
    n = len(toks)
    lr = [a - b for a, b in toks]
    diffs = [sum(e) / len(e) - sum(o) / len(o) for o, e in seqs]
    if name.endswith("_seq"):
        ratios = [math.exp(sum(o) - sum(e)) for o, e in seqs]
    else:
        ratios = [math.exp(x) for x in lr]
    weights = [w for o, e in seqs for w in _loop_weights(name, o, e, c)]
    return {
        "kl": sum(-x for x in lr) / n,
        "k3_kl": sum(math.exp(x) - x - 1 for x in lr) / n,
        "log_ppl_diff": sum(diffs) / len(diffs),
        "log_ppl_abs_diff": sum(abs(d) for d in diffs) / len(diffs),
        "rollout_is_mean": sum(ratios) / len(ratios),
        "rollout_is_max": max(ratios),
        "rollout_is_ratio_fraction_high": sum(r > c for r in ratios) / len(ratios),
        "rollout_is_ratio_fraction_low": sum(r < 1 / c for r in ratios) / len(ratios),
        "rollout_rs_masked_fraction": (sum(w == 0 for w in weights) / n) if name.startswith("mis") else 0.0,
        "tokens": float(n),
        "seqs": float(len(seqs)),
    }


@pytest.mark.parametrize("name", ["none", "tis_token", "tis_seq", "mis_token", "mis_seq"])
def test_mismatch_metrics_match_a_loop_reference_and_ignore_padding(name):
    for seed in range(3):
        old, eng, mask, rows = _random_batch(10 + seed, spread=0.3 if name.endswith("seq") else 0.8)
        got = mismatch_metrics(old, eng, mask, name, C)
        ref = _loop_metrics(rows, name, C)
        assert got.keys() == ref.keys()
        for k in ref:
            assert got[k] == pytest.approx(ref[k], rel=1e-9, abs=1e-12), (name, seed, k)
        # more padding (columns of garbage, an all-padding row) changes nothing
        B, T = old.shape
        wide = lambda x, fill: torch.cat([torch.cat([x, torch.full((B, 5), fill, dtype=x.dtype)], 1),  # noqa: E731
                                         torch.full((1, T + 5), fill, dtype=x.dtype)], 0)
        padded = mismatch_metrics(wide(old, 7.0), wide(eng, -9.0), wide(mask, False), name, C)
        assert padded.keys() == got.keys()
        assert all(padded[k] == pytest.approx(got[k], rel=1e-12, abs=1e-15) for k in got)  # sums in another order
    assert mismatch_metrics(old[:0], eng[:0], mask[:0], name, C) == {}


def test_pg_weights_scale_each_tokens_policy_gradient_loss():
    """policy_loss(pg_weights=w) against a loop: token-mean of w_t * PPO-clip loss_t (dual clip 3)."""
    g = torch.Generator().manual_seed(3)
    old, eng, mask, rows = _random_batch(5, spread=0.5)
    logp = (old.nan_to_num(0.0) + torch.randn(old.shape, generator=g, dtype=torch.float64) * 0.3).float()
    logp.requires_grad_(True)
    adv = torch.randn(old.shape[0], generator=g)
    w = correction_weights("tis_token", old, eng, mask, C)
    loss, _ = policy_loss(logp, old.nan_to_num(0.0).float(), adv, mask, pg_weights=w)
    total, n = 0.0, 0
    for b in range(old.shape[0]):
        for t in range(int(mask[b].sum())):
            r = math.exp(float(logp[b, t].detach()) - float(old[b, t]))
            a = float(adv[b])
            l_tok = max(-a * r, -a * min(max(r, 0.8), 1.2))
            if a < 0:
                l_tok = min(l_tok, -a * 3.0)
            total += float(w[b, t]) * l_tok
            n += 1
    assert float(loss.detach()) == pytest.approx(total / n, rel=1e-5)
    unweighted, _ = policy_loss(logp, old.nan_to_num(0.0).float(), adv, mask)
    assert float(unweighted.detach()) != pytest.approx(float(loss.detach()), rel=1e-3)
    # weight 0 (a dropped token) removes that token's gradient and no other
    loss.backward()
    before = logp.grad.clone()
    b, t = [int(i) for i in (before != 0).nonzero()[0]]
    w2 = w.clone()
    w2[b, t] = 0.0
    logp.grad = None
    policy_loss(logp, old.nan_to_num(0.0).float(), adv, mask, pg_weights=w2)[0].backward()
    assert float(logp.grad[b, t]) == 0.0
    keep = torch.ones_like(mask)
    keep[b, t] = False
    assert torch.equal(logp.grad[keep], before[keep])


def test_pad_lists():
    x, m = pad_lists([[1.0, 2.0], [], [3.0]])
    assert x.tolist() == [[1.0, 2.0], [0.0, 0.0], [3.0, 0.0]] and m.tolist() == [[True, True], [False, False], [True, False]]


# ------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("override, needle", [
    ({"rollout.correction": "tis_token", "rollout.old_logprobs": "engine"}, "correction tis_token needs old_logprobs: recompute"),
    ({"rollout.correction": "is_token"}, "unknown rollout correction 'is_token'"),
    ({"rollout.correction_threshold": 0.5}, "rollout.correction_threshold"),
    ({"rollout.old_logprobs": "both"}, "rollout.old_logprobs"),
    ({"rollout.max_token_mismatch": 2}, "rollout.max_token_mismatch"),
])
def test_bad_rollout_settings_are_one_line(override, needle):
    with pytest.raises(UserError) as e:
        load_config("tiny", override)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_defaults():
    r = load_config("tiny", {"rollout.correction": "none"}).rollout
    assert r.old_logprobs == "recompute" and r.correction_threshold == 2.0 and r.max_token_mismatch == 0.01
    assert load_config("tiny").rollout.correction == "tis_token"  # the CI recipe runs the correction


# ------------------------------------------------------------------------------------------ worker


@pytest.fixture(scope="module")
def tiny_path() -> str:
    from drmas_bench.models import resolve_model

    got = resolve_model("tiny-random")
    return str(getattr(got, "path", got))


def _wg(tiny_path: str, **settings) -> WorkerGroup:
    s = AgentConfig(**{"lr": 1e-3, "micro_batch_size": 3, **settings})
    return WorkerGroup("solver", ["solver"], s, tiny_path, device="cpu")


def _rows(n: int, seed: int) -> list[Row]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = torch.randint(3, 2000, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g).tolist()
        r = torch.randint(3, 2000, (int(torch.randint(0, 7, (1,), generator=g)),), generator=g).tolist()
        out.append(Row("solver", p, r, [-1.0] * len(r), 1.0 if i % 2 else -1.0))
    return out


def test_recompute_is_the_policys_own_logprobs_and_starts_the_update_at_ratio_1(tiny_path):
    wg = _wg(tiny_path)
    rows = _rows(8, seed=0)
    got = run(wg.score_rows(rows, recompute=True))
    full = [r for r in rows if r.response_ids]
    b = pack_rows([r.prompt_ids for r in full], [r.response_ids for r in full], wg.pad_id)
    with torch.no_grad():
        lp, _ = token_logprobs(wg.policy, b)
    k = 0
    for r, mine in zip(rows, got["logprobs"]):
        assert len(mine) == len(r.response_ids)
        if r.response_ids:
            assert mine == pytest.approx(lp[k, : len(r.response_ids)].tolist(), abs=1e-5)
            k += 1
    assert got["mismatch"] == [None] * len(rows)  # rows without text are not checked
    for r, mine in zip(rows, got["logprobs"]):
        r.old_logprobs = mine
    out = run(wg.update(rows, loss=LossSettings()))
    assert abs(out["ppo_kl"]) < 1e-6 and out["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert run(wg.score_rows(rows, recompute=False))["logprobs"] is None


def test_update_applies_the_rows_correction_weights(tiny_path):
    rows = _rows(6, seed=1)
    wg = _wg(tiny_path, grad_clip=1e9)
    for r, lp in zip(rows, run(wg.score_rows(rows))["logprobs"]):
        r.old_logprobs = lp
    grads = []
    for weights in (None, 1.0, 0.0):
        wg = _wg(tiny_path, grad_clip=1e9)
        for r in rows:
            r.is_weights = None if weights is None else [weights] * len(r.response_ids)
        seen = []
        wg.optimizer.step = lambda: seen.append(torch.cat([p.grad.flatten() for p in wg.params if p.grad is not None]))
        run(wg.update(rows, loss=LossSettings()))
        grads.append(seen[0] if seen else None)
    assert torch.equal(grads[0], grads[1])  # all-ones weights = no weights
    assert grads[2] is None or float(grads[2].abs().max()) == 0.0  # every token dropped: no policy gradient


# ------------------------------------------------------------------------------------------ token-in/token-out


def _completion(tok, text: str, ids: list[int]) -> Completion:
    return Completion(text=text, token_ids=ids, prompt_ids=[1, 2, 3], logprobs=[-1.0] * len(ids))


def _traj(task: Task, c: Completion) -> Trajectory:
    req = Request("solver", [{"role": "user", "content": task.question}])
    return Trajectory(task=task, sample_idx=0, turns=[Turn("solver", "solver", 0, req, c)], reward=1.0)


def test_rows_keep_the_engines_ids_not_a_retokenisation(tiny_path):
    wg = _wg(tiny_path)
    tok = wg.tokenizer
    text = "<answer>17</answer>"
    canonical = tok(text, add_special_tokens=False)["input_ids"]
    split = [i for ch in text for i in tok(ch, add_special_tokens=False)["input_ids"]]  # one piece per character
    assert split != canonical and tok.decode(split, skip_special_tokens=True) == text
    task = Task("t@0", "toy", "What is 9 + 8?", ["17"])
    rb = make_rows([_traj(task, _completion(tok, text, split))], [task], ("solver",))
    assert rb["rows"][0].response_ids == split and rb["rows"][0].prompt_ids == [1, 2, 3]
    assert run(wg.score_rows(rb["rows"], recompute=False))["mismatch"] == [None]  # same text: not a mismatch
    # ids that do not give back the text are one
    wrong = canonical[:2] + [canonical[3]] + canonical[3:]
    rb = make_rows([_traj(task, _completion(tok, text, wrong))], [task], ("solver",))
    [m] = run(wg.score_rows(rb["rows"], recompute=False))["mismatch"]
    assert m == {"row": 0, "position": 2, "engine_id": canonical[3], "text_id": canonical[2]}


class _Relabel:
    """An engine double around the real hf engine: the solver's replies come back with ids that do
    not decode to their text (the first response token replaced)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, requests):
        out = await self.inner.generate(requests)
        for r, c in zip(requests, out):
            if r.agent == "solver" and c.token_ids:
                c.token_ids = [(c.token_ids[0] + 7) % 1000 + 10] + c.token_ids[1:]
        return out


def _shrunk(**extra):
    o = {"steps": 1, "sft.steps": 0, "sft.agent_steps": {}, "rollout.prompts_per_step": 4, "rollout.n": 4,
         "algo.mini_batches": 1, "save_every": 0, "val.before_train": False, "val.every": 0}
    o.update(extra)
    return load_config("tiny", o)


@pytest.mark.slow
def test_a_run_stops_when_the_engines_ids_do_not_match_its_text(tmp_path, monkeypatch):
    from drmas_trainer import worker
    from drmas_trainer.trainer import train

    real = worker.host_engine  # the worker group's own reference: it imports host_engine at its top
    monkeypatch.setattr(worker, "host_engine", lambda *a, **k: _Relabel(real(*a, **k)))
    with pytest.raises(UserError) as e:
        train(_shrunk(), tmp_path / "run", use_ray=False, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "worker group solver" in msg and "agent solver, response token 0" in msg
    assert "rollout.max_token_mismatch" in msg
    assert (tmp_path / "run" / "ckpt" / "step_0" / "COMPLETE").exists()  # the work before it is kept
    # a threshold above the share lets it run, and the count is logged
    cfg = _shrunk(**{"rollout.max_token_mismatch": 1.0})
    train(cfg, tmp_path / "run2", use_ray=False, progress=False)
    rec = json.loads((tmp_path / "run2" / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["wg/solver/rollout/token_mismatch"] >= 1 and rec["wg/checker/rollout/token_mismatch"] == 0
    assert rec["rollout/token_mismatch"] == rec["wg/solver/rollout/token_mismatch"]


# ------------------------------------------------------------------------------------------ a real mismatch


def _one_step(tmp_path, name, **extra) -> dict:
    from drmas_trainer.trainer import train

    cfg = _shrunk(**{"agent_defaults.engine_options": {"max_batch": 64, "dtype": "bfloat16"}, **extra})
    train(cfg, tmp_path / name, use_ray=False, progress=False)
    return json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.slow
def test_bf16_engine_fp32_trainer_mismatch_is_measured_and_recompute_removes_the_ratio_bias(tmp_path):
    rec = _one_step(tmp_path, "recompute", **{"rollout.correction": "tis_token"})
    for a in ("solver", "checker"):
        assert abs(rec[f"agent/{a}/rollout_corr/log_ppl_diff"]) > 1e-5 or rec[f"agent/{a}/rollout_corr/log_ppl_abs_diff"] > 1e-5
        assert rec[f"agent/{a}/rollout_corr/k3_kl"] > 1e-8
        assert rec[f"wg/{a}/rollout_corr/k3_kl"] == rec[f"agent/{a}/rollout_corr/k3_kl"]  # one agent per group
    assert rec["rollout_corr/log_ppl_abs_diff"] > 1e-5
    # one mini-batch, measured before its optimiser step: old = the policy itself, ratio 1
    assert abs(rec["actor/ppo_kl"]) < 1e-6
    for g in ("solver", "checker"):
        assert rec[f"wg/{g}/actor/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    # with the engine's log-probs as old, the same first ratio is off by the engine/trainer gap
    eng = _one_step(tmp_path, "engine", **{"rollout.old_logprobs": "engine", "rollout.correction": "none"})
    assert abs(eng["actor/ppo_kl"]) > 1e-5
    assert not any(k.startswith("rollout_corr/") for k in eng)
    assert max(abs(eng[f"wg/{g}/actor/ratio_mean"] - 1.0) for g in ("solver", "checker")) > 1e-5


# ------------------------------------------------------------------------------------------ seeds


def test_sample_seed_is_a_pure_63_bit_function_of_its_parts():
    parts = (0, 3, "toy:q1@5", 2, "solver", 1)
    s = sample_seed(*parts)
    assert s == sample_seed(*parts) and 0 <= s < 2**63
    for i in range(len(parts)):
        changed = list(parts)
        changed[i] = changed[i] + 1 if isinstance(changed[i], int) else changed[i] + "x"
        assert sample_seed(*changed) != s, i
    siblings = {sample_seed(0, 3, "toy:q1@5", k, "solver", 0) for k in range(64)}
    assert len(siblings) == 64


class _Recorder:
    """A backend double: records each request's seed, answers the toy workflow's formats."""

    def __init__(self):
        self.seeds: list[tuple[int, str, int]] = []

    def worker_group(self, agent):
        return agent

    def sampling(self, agent):
        return Sampling(temperature=1.0)

    async def generate(self, agent, request):
        self.seeds.append(request.sampling.seed)
        text = "<answer>3</answer>" if agent == "solver" else "<verdict>reject</verdict>"
        return Completion(text=text)


def test_grpo_siblings_and_turns_get_distinct_seeds():
    wf = get_workflow("toy")
    rec = _Recorder()
    task = Task("q@0", "toy", "What is 1 + 2?", ["3"])

    async def go():
        for k in range(8):
            ep = Episode(task, k, rec, wf.agents, seed=0, training_step=4)
            await wf.fn(ep)

    run(go())
    assert len(rec.seeds) > 8 and len(set(rec.seeds)) == len(rec.seeds)
    again = _Recorder()
    ep = Episode(task, 0, again, wf.agents, seed=0, training_step=4)
    run(wf.fn(ep))
    assert again.seeds == rec.seeds[: len(again.seeds)]


def _curves(path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out.append({k: v for k, v in r.items() if not k.startswith(("timing_s/", "cpu_s/")) and not k.endswith("timing_s/update_actor")})
    return out


@pytest.mark.slow
def test_same_seed_runs_are_identical_and_another_seed_differs(tmp_path):
    from drmas_trainer.trainer import train

    o = {"steps": 2, "sft.steps": 0, "sft.agent_steps": {}, "rollout.prompts_per_step": 3, "rollout.n": 3, "save_every": 0,
         "val.before_train": False, "val.every": 0}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        train(load_config("tiny", {**o, "seed": seed}), tmp_path / name, use_ray=False, progress=False)
    a, b, c = (_curves(tmp_path / n / "metrics.jsonl") for n in "abc")
    assert a == b
    assert [r["tasks"] for r in a] == [r["tasks"] for r in c]  # the same prompts (data.seed) ...
    assert a != c  # ... sampled differently
