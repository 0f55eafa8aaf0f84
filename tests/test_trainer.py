"""Unit tests of the reference trainer: config, worker groups, row splitting, worker updates
(loss decreases, exact gradient accumulation, per-agent grad norms), NaN skipping, checkpoints."""

from __future__ import annotations

import asyncio
import copy
import math
from pathlib import Path

import pytest
import torch
import yaml

from drmas_bench.agents.team import team_from_dict
from drmas_bench.types import Completion, Request, Sampling, Task, Trajectory, Turn, UserError
from drmas_trainer import checkpoint as ckpt_io
from drmas_trainer.config.train import AgentConfig, load_config, parse_override
from drmas_trainer.config.groups import plan_worker_groups
from drmas_trainer.logprobs import pack_rows, token_logprobs
from drmas_trainer.losses import policy_loss
from drmas_trainer.saving import checkpoint_team
from drmas_trainer.trainer import make_rows, next_prompts
from drmas_trainer.worker import LossSettings, Row, WorkerGroup

torch.set_num_threads(1)
TOY_AGENTS = ("solver", "checker")


def run(coro):
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------------ config


def test_tiny_recipe_loads_and_coerces():
    cfg = load_config("tiny")
    assert cfg.workflow == "toy" and cfg.recipe == "tiny"
    assert isinstance(cfg.agent_defaults["lr"], float)
    cfg = load_config("tiny", {"algo.estimator": "grpo", "steps": 3, "agent_defaults.lr": "1e-4"})
    assert cfg.algo.estimator == "grpo" and cfg.steps == 3
    plan = plan_worker_groups(cfg, TOY_AGENTS)
    assert plan["solver"].settings.lr == 1e-4  # a YAML-1.1 string "1e-4" becomes a float


@pytest.mark.parametrize("override,needle", [
    ({"bogus": 1}, "bogus"),
    ({"algo.lrr": 1}, "lrr"),
    ({"agents": {"solver": {"learning_rate": 1}}}, "learning_rate"),
    ({"agent_defaults.lrate": 1}, "lrate"),
    ({"algo.estimator": "nope"}, "nope"),
    ({"rollout.n": "many"}, "rollout.n"),
])
def test_unknown_or_bad_config_keys_are_named(override, needle):
    with pytest.raises(UserError, match=needle):
        load_config("tiny", override)


def test_recipe_path_and_override_parsing(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("workflow: toy\nsteps: 2\nwhatever: 1\n")
    with pytest.raises(UserError, match="whatever"):
        load_config(str(p))
    with pytest.raises(UserError, match="unknown recipe"):
        load_config("no-such-recipe")
    assert parse_override("algo.clip_low=0.1") == ("algo.clip_low", 0.1)
    with pytest.raises(UserError):
        parse_override("novalue")


def test_paper_recipes_load():
    for name, n_groups_math in (("math_qwen3_4b", 2), ("math_qwen3_4b_shared", 1)):
        cfg = load_config(name)
        assert len(plan_worker_groups(cfg, ("solver", "verifier"))) == n_groups_math
        assert cfg.rollout.prompts_per_step == 32 and cfg.rollout.n == 8
    cfg = load_config("search_qwen2.5_7b")
    assert len(plan_worker_groups(cfg, ("verifier", "searcher", "answerer"))) == 3
    assert cfg.algo.mini_batches == 5 and cfg.algo.entropy_coef == 0.001 and cfg.algo.c_inv == 0.01


# ------------------------------------------------------------------------------------------ grouping


def test_shared_vs_nonshared_grouping():
    cfg = load_config("tiny")
    plan = plan_worker_groups(cfg, TOY_AGENTS)
    assert {n: g.agents for n, g in plan.items()} == {"solver": ["solver"], "checker": ["checker"]}
    shared = plan_worker_groups(load_config("tiny", {"shared": True}), TOY_AGENTS)
    assert {n: g.agents for n, g in shared.items()} == {"shared": ["solver", "checker"]}
    explicit = plan_worker_groups(load_config("tiny", {"agents": {"solver": {"wg": "pool"}, "checker": {"wg": "pool"}}}),
                                  TOY_AGENTS)
    assert list(explicit) == ["pool"]


def test_shared_group_must_agree_on_settings():
    with pytest.raises(UserError, match="lr"):
        plan_worker_groups(load_config("tiny", {"shared": True, "agents": {"checker": {"lr": 0.5}}}), TOY_AGENTS)
    with pytest.raises(UserError, match="micro_batch_size"):
        plan_worker_groups(load_config("tiny", {"shared": True, "agents": {"solver": {"micro_batch_size": 3}}}), TOY_AGENTS)
    # per-agent sampling is not a group setting
    plan = plan_worker_groups(load_config("tiny", {"shared": True, "agents": {"checker": {"sampling": {"temperature": 0.5}}}}),
                              TOY_AGENTS)
    assert list(plan) == ["shared"]
    with pytest.raises(UserError, match="unknown agent"):
        plan_worker_groups(load_config("tiny", {"agents": {"judge": {"lr": 1.0}}}), TOY_AGENTS)


def _turn(agent: str, wg: str, step: int, n_resp: int, valid: bool = True) -> Turn:
    c = Completion(text="x", token_ids=list(range(5, 5 + n_resp)), prompt_ids=[1, 2, 3],
                   logprobs=[-1.0] * n_resp, completion_tokens=n_resp)
    return Turn(agent, wg, step, Request(agent, []), c, valid)


def test_rows_split_by_worker_group():
    batch = [Task(f"q@{i}", "toy", "What is 1 + 1?", ["2"]) for i in range(2)]
    trajs = []
    for i, task in enumerate(batch):
        for s in range(2):
            turns = [_turn("solver", "wgA", 0, 3), _turn("checker", "wgB", 1, 2, valid=s == 0)]
            if s == 1:
                turns.append(_turn("solver", "wgA", 2, 4))
            trajs.append(Trajectory(task, s, turns, reward=float(s)))
    rb = make_rows(trajs, batch, TOY_AGENTS)
    assert len(rb["rows"]) == 10
    assert rb["uid"].tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert rb["traj"].tolist() == [0, 0, 1, 1, 1, 2, 2, 3, 3, 3]
    assert rb["agent"].tolist() == [0, 1, 0, 1, 0, 0, 1, 0, 1, 0]
    by_wg = {wg: [r.agent for r, g in zip(rb["rows"], rb["wg"]) if g == wg] for wg in ("wgA", "wgB")}
    assert by_wg == {"wgA": ["solver"] * 6, "wgB": ["checker"] * 4}
    assert rb["valid"].tolist().count(False) == 2
    # a turn without log-probs is an error, not a silent zero
    trajs[0].turns[0].completion.logprobs = None
    with pytest.raises(UserError, match="log-probs"):
        make_rows(trajs, batch, TOY_AGENTS)


def test_data_cursor_sequence_is_deterministic():
    from drmas_bench.suites.toy.benchmarks import make_toy_tasks

    cfg = load_config("tiny")
    tasks = make_toy_tasks(10, seed=0)
    a = [t.id for t in next_prompts(tasks, 0, 25, cfg.data)]
    b = [t.id for k in range(5) for t in next_prompts(tasks, 5 * k, 5, cfg.data)]
    assert a == b and len(set(a)) == 25  # run-unique ids even when a task comes back next epoch
    first_epoch = sorted(t.meta["source_id"] for t in next_prompts(tasks, 0, 10, cfg.data))
    assert first_epoch == sorted(t.id for t in tasks)


# ------------------------------------------------------------------------------------------ worker


@pytest.fixture(scope="module")
def tiny_path() -> str:
    from drmas_bench.models import resolve_model

    got = resolve_model("tiny-random")
    return str(getattr(got, "path", got))


def _rows(agent: str, n: int, seed: int, adv_sign: float | None = None) -> list[Row]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        p = torch.randint(3, 2000, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g).tolist()
        r = torch.randint(3, 2000, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
        adv = adv_sign if adv_sign is not None else (1.0 if i % 2 == 0 else -1.0)
        rows.append(Row(agent, p, r, [0.0] * len(r), adv))
    return rows


def _with_current_logprobs(wg: WorkerGroup, rows: list[Row]) -> list[Row]:
    b = pack_rows([r.prompt_ids for r in rows], [r.response_ids for r in rows], wg.pad_id)
    with torch.no_grad():
        lp, _ = token_logprobs(wg.policy, b)
    return [Row(r.agent, r.prompt_ids, r.response_ids, lp[i, : len(r.response_ids)].tolist(), r.advantage)
            for i, r in enumerate(rows)]


def _surrogate(wg: WorkerGroup, rows: list[Row]) -> float:
    b = pack_rows([r.prompt_ids for r in rows], [r.response_ids for r in rows], wg.pad_id)
    old = torch.zeros_like(b["mask"], dtype=torch.float32)
    for i, r in enumerate(rows):
        old[i, : len(r.old_logprobs)] = torch.tensor(r.old_logprobs)
    with torch.no_grad():
        lp, _ = token_logprobs(wg.policy, b)
        loss, _ = policy_loss(lp, old, torch.tensor([r.advantage for r in rows]), b["mask"])
    return float(loss)


def _wg(tiny_path: str, agents=("solver",), **settings) -> WorkerGroup:
    s = AgentConfig(**{"lr": 1e-3, "micro_batch_size": 4, **settings})
    return WorkerGroup(agents[0] if len(agents) == 1 else "shared", list(agents), s, tiny_path, device="cpu")


def test_worker_update_reduces_loss_on_fixed_batch(tiny_path):
    wg = _wg(tiny_path)
    rows = _with_current_logprobs(wg, _rows("solver", 12, seed=0))
    before = _surrogate(wg, rows)
    n_tok = sum(len(r.response_ids) for r in rows)
    assert before == pytest.approx(-sum(r.advantage * len(r.response_ids) for r in rows) / n_tok, abs=1e-5)  # ratio 1
    out = [run(wg.update(rows, epochs=1, mini_batches=1, loss=LossSettings())) for _ in range(3)]
    after = _surrogate(wg, rows)
    assert after < before - 1e-3, (before, after)
    assert all(o["optimizer_steps"] == 1 and o["skipped_steps"] == 0 for o in out)
    assert math.isfinite(out[0]["grad_norm"]) and out[0]["agent_grad_norm"]["solver"] == out[0]["grad_norm"]
    assert 0.0 <= out[-1]["pg_clipfrac"] <= 1.0 and "ppo_kl" in out[-1] and "entropy" in out[-1]


@pytest.mark.parametrize("loss", [LossSettings(), LossSettings(mode="gspo")])
def test_gradient_accumulation_is_exact(tiny_path, loss):
    rows = _rows("solver", 7, seed=1)
    grads = []
    for mbs in (7, 2, 1):  # one micro-batch, uneven micro-batches, one row each
        wg = _wg(tiny_path, micro_batch_size=mbs, grad_clip=1e9)
        rows_lp = _with_current_logprobs(wg, rows)
        seen = []
        wg.optimizer.step = lambda: seen.append(torch.cat([p.grad.flatten() for p in wg.params if p.grad is not None]))
        run(wg.update(rows_lp, loss=loss))
        grads.append(seen[0])
    scale = grads[0].abs().max()
    assert scale > 0
    for g in grads[1:]:
        assert torch.allclose(g, grads[0], atol=1e-5 * float(scale), rtol=1e-4)


def test_shared_group_per_agent_grad_norms_are_exact(tiny_path):
    wg = _wg(tiny_path, agents=("solver", "checker"), micro_batch_size=3, grad_clip=1e9)
    rows = _with_current_logprobs(wg, _rows("solver", 5, seed=2) + _rows("checker", 4, seed=3))
    expected = {}
    for agent in ("solver", "checker"):  # the gradient of each agent's own token-mean loss, directly
        mine = [r for r in rows if r.agent == agent]
        b = pack_rows([r.prompt_ids for r in mine], [r.response_ids for r in mine], wg.pad_id)
        old = torch.zeros_like(b["mask"], dtype=torch.float32)
        for i, r in enumerate(mine):
            old[i, : len(r.old_logprobs)] = torch.tensor(r.old_logprobs)
        wg.policy.zero_grad()
        lp, _ = token_logprobs(wg.policy, b)
        policy_loss(lp, old, torch.tensor([r.advantage for r in mine]), b["mask"])[0].backward()
        expected[agent] = math.sqrt(sum(float(p.grad.double().square().sum()) for p in wg.params if p.grad is not None))
    wg.policy.zero_grad()
    out = run(wg.update(rows, loss=LossSettings()))
    for agent in ("solver", "checker"):
        assert out["agent_grad_norm"][agent] == pytest.approx(expected[agent], rel=1e-4)
    assert out["grad_norm"] < expected["solver"] + expected["checker"] + 1e-6


def test_nan_loss_or_gradient_skips_the_step(tiny_path, tmp_path):
    wg = _wg(tiny_path)
    before = [p.detach().clone() for p in wg.policy.parameters()]
    rows = _with_current_logprobs(wg, _rows("solver", 6, seed=4))
    bad = copy.deepcopy(rows)
    bad[2].advantage = float("nan")
    out = run(wg.update(bad, loss=LossSettings()))
    assert out["skipped_steps"] == 1 and out["optimizer_steps"] == 0 and wg.skipped_steps == 1
    assert all(torch.equal(a, p) for a, p in zip(before, wg.policy.parameters()))
    assert not wg.optimizer.state  # AdamW never stepped
    # a NaN gradient (finite loss) is caught too
    hook = wg.params[0].register_hook(lambda g: g * float("nan"))
    out = run(wg.update(rows, loss=LossSettings()))
    hook.remove()
    assert out["skipped_steps"] == 1 and wg.skipped_steps == 2
    assert all(torch.equal(a, p) for a, p in zip(before, wg.policy.parameters()))
    # a healthy batch afterwards steps normally
    assert run(wg.update(rows, loss=LossSettings()))["optimizer_steps"] == 1
    # non-finite weights never reach a checkpoint
    with torch.no_grad():
        wg.params[0].view(-1)[0] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        run(wg.save(str(tmp_path / "m"), str(tmp_path / "o.pt")))
    assert not (tmp_path / "m" / "model.safetensors").exists()


def test_token_logprobs_match_the_engine(tiny_path):
    wg = _wg(tiny_path)
    reqs = [Request("solver", [{"role": "user", "content": f"What is {i} + 2?"}],
                    Sampling(temperature=1.0, top_p=1.0, max_new_tokens=6, seed=i), want_logprobs=True) for i in range(4)]

    async def go():
        await wg.start_engine()
        try:
            return await wg.generate(reqs)
        finally:
            await wg.close()

    comps = run(go())
    b = pack_rows([c.prompt_ids for c in comps], [c.token_ids for c in comps], wg.pad_id)
    with torch.no_grad():
        lp, _ = token_logprobs(wg.policy, b)
    for i, c in enumerate(comps):
        assert torch.allclose(lp[i, : len(c.token_ids)], torch.tensor(c.logprobs), atol=1e-4)


# ------------------------------------------------------------------------------------------ checkpoints


def test_checkpoint_round_trip_weights_and_optimizer(tiny_path, tmp_path):
    wg = _wg(tiny_path)
    rows = _with_current_logprobs(wg, _rows("solver", 6, seed=5))
    run(wg.update(rows, loss=LossSettings()))
    run(wg.save(str(tmp_path / "m"), str(tmp_path / "o.pt")))
    assert (tmp_path / "m" / "model.safetensors").is_file()
    back = WorkerGroup("solver", ["solver"], wg.settings, str(tmp_path / "m"), device="cpu")
    run(back.load_optimizer(str(tmp_path / "o.pt")))
    for (n1, p1), (n2, p2) in zip(wg.policy.named_parameters(), back.policy.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    s1, s2 = wg.optimizer.state_dict(), back.optimizer.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for k in s1["state"]:
        for key, v in s1["state"][k].items():
            assert torch.equal(v, s2["state"][k][key]), (k, key)
    assert back.optimizer_steps == 1
    # the next step is identical from both
    run(wg.update(rows, loss=LossSettings()))
    run(back.update(rows, loss=LossSettings()))
    for p1, p2 in zip(wg.policy.parameters(), back.policy.parameters()):
        assert torch.allclose(p1, p2, atol=1e-7)


def test_half_written_checkpoints_are_ignored(tmp_path):
    root = tmp_path / "ckpt"
    tmp = ckpt_io.begin(root, 1)
    (tmp / "team.yaml").write_text("x")
    ckpt_io.commit(tmp, root, 1)
    assert ckpt_io.latest_checkpoint(root)[0] == 1
    assert (root / "latest").resolve() == (root / "step_1").resolve()
    # a kill while writing step 2: the temp dir has no marker and is never used
    tmp2 = ckpt_io.begin(root, 2)
    (tmp2 / "team.yaml").write_text("half")
    # a step folder without the marker (copied half-way) is ignored as well
    (root / "step_3" / "models").mkdir(parents=True)
    assert ckpt_io.latest_checkpoint(root)[0] == 1
    removed = ckpt_io.clean_partial(root)
    assert {p.name for p in removed} == {tmp2.name, "step_3"}
    assert ckpt_io.latest_checkpoint(root)[0] == 1
    for k in (2, 3, 4):
        ckpt_io.commit(ckpt_io.begin(root, k), root, k)
    ckpt_io.prune(root, keep_last=2)
    assert [s for s, _ in ckpt_io.complete_checkpoints(root)] == [3, 4]
    assert (root / "latest").resolve().name == "step_4"


def test_checkpoint_team_yaml_loads_through_team_from_dict(tmp_path):
    from drmas_bench.workflows import get_workflow

    wf = get_workflow("toy")
    for shared in (False, True):
        cfg = load_config("tiny", {"shared": shared, "agents": {"checker": {"sampling": {"max_new_tokens": 11}}}})
        plan = plan_worker_groups(cfg, wf.agents)
        d = checkpoint_team(cfg, plan, wf, step=4)
        base = tmp_path / f"s{shared}"
        for g in plan:
            (base / "models" / g).mkdir(parents=True)
        (base / "team.yaml").write_text(yaml.safe_dump(d))
        team = team_from_dict(yaml.safe_load((base / "team.yaml").read_text()), wf.agents, "toy", base_dir=base)
        assert set(team.agents) == {"solver", "checker"}
        assert len(team.worker_groups) == (1 if shared else 2)
        for g in team.worker_groups.values():
            assert Path(g.model) == base / "models" / g.name
        assert team.agent_sampling["checker"] == {"max_new_tokens": 11}
        assert team.sampling == {"max_new_tokens": cfg.rollout.max_new_tokens}


def test_bf16_compute_keeps_fp32_master_weights(tiny_path):
    wg = _wg(tiny_path, dtype="bfloat16", lr=1e-6)
    assert all(p.dtype == torch.float32 for p in wg.policy.parameters())
    before = [p.detach().clone() for p in wg.params]
    rows = _with_current_logprobs(wg, _rows("solver", 4, seed=6))
    out = run(wg.update(rows, loss=LossSettings()))
    assert out["optimizer_steps"] == 1
    # an lr-1e-6 step survives in the fp32 weights (it would round away in bf16 weights)
    assert any(not torch.equal(a, p) for a, p in zip(before, wg.params))
    assert all(t.dtype == torch.bfloat16 for _, t in wg.named_weights())
