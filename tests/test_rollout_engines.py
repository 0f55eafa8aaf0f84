"""The trainer's rollout engines (drmas_trainer.rollout_engines): all awake, or adopted by a pool that
keeps awake what a memory budget allows and holds them asleep for the update.

The orchestration tests run REAL worker groups (tiny-random policies, real updates, the real
``engine_wake`` / ``engine_sleep`` / ``sync_weights``) whose rollout engine is swapped for
``FakeWeightsEngine`` (tests/fake_engines.py, a FAKE: it generates nothing, every completion carries
a digest of the weights it was last synced with, and its ledger fails the test the moment the
awake engines break the budget). A simulated 3-group search rollout (verifier -> searcher ->
verifier -> answerer per episode, episodes concurrent) runs two training steps all awake and
pooled: the completions must be the same, with weights the update produced, and the counts must
show one sync per group per step against the reference's one per batched call. The slow tests run
the tiny recipe itself, in process and on Ray with logical GPUs.
"""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace

import pytest
import torch
from fake_engines import FakeWeightsEngine, Ledger

from drmas_bench.types import Request, Sampling, UserError
from drmas_trainer import metric_names as mn
from drmas_trainer.config.train import AgentConfig, load_config
from drmas_trainer.rollout_engines import (
    AWAKE,
    POOLED,
    Budget,
    RolloutEngines,
    budget_from_plan,
    choose,
    engine_metrics,
    gpu_sets,
    reference_syncs,
)
from drmas_trainer.rows import Row
from drmas_trainer.worker import WorkerGroup

torch.set_num_threads(1)
SEARCH = ("verifier", "searcher", "answerer")
EPISODE = ("verifier", "searcher", "verifier", "answerer")  # the verifier asks again after the search
FP = 100  # bytes each fake engine claims awake


# ----------------------------------------------------------------------------------------- pure parts


def test_choose_awake_or_pooled():
    two_on_one = [[FP, FP]]
    assert choose("auto", two_on_one, Budget(source="no CUDA device")) == (AWAKE, "auto: no CUDA device")
    assert choose("auto", two_on_one, Budget(models=1))[0] == POOLED
    assert choose("auto", two_on_one, Budget(models=2))[0] == AWAKE
    assert choose("auto", two_on_one, Budget(bytes=199))[0] == POOLED
    assert choose("auto", [[FP], [FP]], Budget(bytes=100))[0] == AWAKE  # one engine per GPU fits each
    assert choose("awake", two_on_one, Budget(models=1))[0] == AWAKE  # asked for: as asked
    assert choose("pooled", two_on_one, Budget())[0] == POOLED


def test_gpu_sets_from_ray_gpu_ids():
    infos = [{"name": "a", "ray_gpu_ids": ["0"]}, {"name": "b", "ray_gpu_ids": ["1"]},
             {"name": "c", "ray_gpu_ids": ["0"]}, {"name": "d"}]
    assert gpu_sets(infos, use_ray=True) == [["a", "c"], ["b"], ["d"]]
    assert gpu_sets(infos, use_ray=False) == [["a", "b", "c", "d"]]


def test_reference_syncs_count_batched_calls_and_engine_metrics_are_deltas():
    def traj(*agents):
        return SimpleNamespace(turns=[SimpleNamespace(agent=a) for a in agents])

    # the reference batches agent a's k-th call over every episode: (v,0) (s,0) (v,1) (a,0) -> 4
    assert reference_syncs([traj(*EPISODE), traj("verifier", "answerer"), traj(*EPISODE)]) == 4
    assert reference_syncs([]) == 0
    before = {"v": {"syncs": 1, "wakes": 0, "sleeps": 0, "generate_calls": 5}}
    after = {"v": {"syncs": 2, "wakes": 3, "sleeps": 3, "generate_calls": 9}, "s": {"syncs": 1}}
    m = engine_metrics(before, after)
    assert m[mn.WEIGHT_SYNCS] == 2 and m[mn.wg("v", mn.WEIGHT_SYNCS)] == 1 and m[mn.wg("s", mn.WEIGHT_SYNCS)] == 1
    assert m[mn.ENGINE_WAKES] == 3 and m[mn.GENERATE_CALLS] == 4


def test_plan_budget_of_the_search_recipe():
    """The 7B search recipe on 8 GPUs (its groups sharded, colocated): three engines at 0.35 of a GPU
    do not fit one 80 GiB GPU beside the resident shards, while the tiny recipe's do (auto keeps them
    awake); a GPU the resident states fill alone leaves no budget."""
    from drmas_trainer.config.groups import plan_worker_groups
    from drmas_trainer.forecast.memory import memory_plan
    from drmas_trainer.forecast.shapes import model_shape

    cfg = load_config("search_qwen2.5_7b")
    groups = plan_worker_groups(cfg, SEARCH)
    shapes = {n: model_shape(str(g.settings.model)) for n, g in groups.items()}
    plan = memory_plan(cfg, groups, shapes, gpu_gib=80, gpus=8)
    b = budget_from_plan(plan)
    assert set(b.footprints) == set(SEARCH) and b.bytes is not None
    assert b.bytes == min(r.budget for r in plan.rollouts)  # the plan's own budget, not a second reckoning
    fps = [[b.footprints[n] for n in names] for names in plan.gpus]
    assert choose("auto", fps, b)[0] == POOLED
    assert plan.gpus == [list(SEARCH)] and 0 < b.bytes < sum(b.footprints.values())
    whole = load_config("search_qwen2.5_7b", {"fsdp.ranks": 1, "agent_defaults.optimizer_offload": "none"})
    assert budget_from_plan(memory_plan(whole, plan_worker_groups(whole, SEARCH), shapes, gpu_gib=80)).bytes < 0  # unsharded: no room
    tiny = load_config("tiny")
    tgroups = plan_worker_groups(tiny, ("solver", "checker"))
    tplan = memory_plan(tiny, tgroups, {n: model_shape("tiny-random") for n in tgroups}, gpu_gib=80)
    fit = budget_from_plan(tplan)
    assert choose("auto", [[fit.footprints[n] for n in names] for names in tplan.gpus], fit)[0] == AWAKE


def test_config_refuses_two_budgets():
    with pytest.raises(UserError, match="engine_budget_gib or rollout.engines_awake"):
        load_config("tiny", {"rollout": {"engine_budget_gib": 10, "engines_awake": 1}})


# ----------------------------------------------------------------------------------------- a simulated search rollout


@pytest.fixture(scope="module")
def tiny_path() -> str:
    from drmas_bench.models import resolve_model

    got = resolve_model("tiny-random")
    return str(getattr(got, "path", got))


async def _workers(tiny_path: str, ledger: Ledger, keeps: bool) -> dict[str, WorkerGroup]:
    ws = {}
    for n in SEARCH:
        w = WorkerGroup(n, [n], AgentConfig(lr=1e-2, micro_batch_size=4), tiny_path, device="cpu")
        w.engine = FakeWeightsEngine(n, FP, ledger, keeps_weights_asleep=keeps)  # the FAKE rollout engine
        await w.sync_weights()  # as start_engine does: the engine gets the policy's weights
        ws[n] = w
    return ws


def _rows(agent: str, step: int) -> list[Row]:
    g = torch.Generator().manual_seed(step * 7 + SEARCH.index(agent))
    return [Row(agent, torch.randint(3, 2000, (6,), generator=g).tolist(), torch.randint(3, 2000, (3,), generator=g).tolist(),
                [-7.0] * 3, 1.0 if i % 2 else -1.0) for i in range(4)]


async def _steps(tiny_path: str, overrides: dict, *, keeps: bool = True, budget: int | None = None, n_steps: int = 2,
                 episodes: int = 6) -> tuple[list[list[list[str]]], list[dict], Ledger, str]:
    """``n_steps`` training steps of the simulated search team: rollouts through the engines' views,
    then a real update of every group on fixed rows; returns (completions per step and episode,
    each step's metrics, the ledger, the mode)."""
    ledger = Ledger(budget=None)
    workers = await _workers(tiny_path, ledger, keeps)
    cfg = load_config("tiny", {"rollout": overrides})
    engines = await RolloutEngines.start(cfg, workers, [{"name": n} for n in workers], {}, use_ray=False)
    ledger.budget, ledger.peak = budget, ledger.resident  # the budget holds from here (the ledger checks every wake)
    views = engines.views()
    texts, records = [], []
    try:
        for step in range(1, n_steps + 1):
            c0 = await engines.counters()
            await engines.before_rollout()

            async def episode(i: int) -> tuple[list[str], SimpleNamespace]:
                text, out, turns = f"question {i}", [], []
                for k, agent in enumerate(EPISODE):
                    req = Request(agent, [{"role": "user", "content": text}], Sampling(seed=1000 * step + 10 * i + k))
                    [c] = await views[agent].generate([req])
                    out.append(c.text)
                    turns.append(SimpleNamespace(agent=agent))
                    text = c.text[-40:]
                    await asyncio.sleep(0.001 * (i % 3))  # a retrieval pause of varying length
                return out, SimpleNamespace(turns=turns)

            done = await asyncio.gather(*(episode(i) for i in range(episodes)))
            await engines.after_rollout()
            for n, w in workers.items():
                out = await w.update(_rows(n, step), seed=step)
                assert out["optimizer_steps"] == 1
            await engines.after_update()
            rec = engine_metrics(c0, await engines.counters())
            rec[mn.REFERENCE_SYNCS] = reference_syncs(t for _, t in done)
            texts.append([o for o, _ in done])
            records.append(rec)
    finally:
        await engines.close()
        for w in workers.values():
            await w.close()
    return texts, records, ledger, engines.mode


@pytest.mark.parametrize("awake,keeps", [(1, True), (2, True), (1, False)],
                         ids=["one-awake", "two-awake", "one-awake-weights-dropped"])
def test_pooled_search_rollout_equals_all_awake_with_fewer_syncs(tiny_path, awake, keeps):
    ref_texts, ref_recs, ref_ledger, mode = asyncio.run(_steps(tiny_path, {"engines": "awake"}, keeps=keeps))
    assert mode == AWAKE and ref_ledger.peak == 3 * FP
    texts, recs, ledger, mode = asyncio.run(_steps(tiny_path, {"engines": "auto", "engines_awake": awake}, keeps=keeps,
                                                   budget=awake * FP))
    assert mode == POOLED
    assert texts == ref_texts  # the same completions, from the same weights (each carries their digest)
    versions = [{t.split("|")[1] for ep in step for t in ep} for step in texts]
    assert len(versions[0]) == 1 and "initial" not in versions[0]  # step 1: the start's sync (one model, three copies)
    assert len(versions[1]) == 3 and versions[0].isdisjoint(versions[1])  # step 2: each group's own update
    assert ledger.peak <= awake * FP  # never more engines awake than the budget (the ledger checked each wake)
    for r, ref in zip(recs, ref_recs):
        assert r[mn.REFERENCE_SYNCS] == ref[mn.REFERENCE_SYNCS] == 4  # v, s, v again, a: four batched calls
        assert ref[mn.WEIGHT_SYNCS] == 3 and ref[mn.ENGINE_WAKES] == 0  # all awake: one sync per group, after its update
        assert r[mn.GENERATE_CALLS] == ref[mn.GENERATE_CALLS] == 6 * 4
        assert r[mn.ENGINE_WAKES] >= 3 and r[mn.ENGINE_SLEEPS] >= 3  # every group woke for the step, slept for the update
    if keeps:  # a wake restores the engine's own weights: one sync per group per step, at its first wake
        assert [r[mn.WEIGHT_SYNCS] for r in recs] == [0, 3]
    else:  # every wake after a sleep that dropped the weights syncs them again
        assert all(r[mn.WEIGHT_SYNCS] == r[mn.ENGINE_WAKES] for r in recs)
    print(f"\nsimulated search, 6 episodes, engines_awake {awake}, keeps weights {keeps}: per step "
          + "; ".join(f"syncs {r[mn.WEIGHT_SYNCS]} wakes {r[mn.ENGINE_WAKES]} sleeps {r[mn.ENGINE_SLEEPS]} "
                      f"(all awake: syncs {ref[mn.WEIGHT_SYNCS]} wakes {ref[mn.ENGINE_WAKES]}; reference "
                      f"{r[mn.REFERENCE_SYNCS]})" for r, ref in zip(recs, ref_recs)))
    if keeps:  # fewer syncs than the reference's one per batched call
        assert all(r[mn.WEIGHT_SYNCS] < r[mn.REFERENCE_SYNCS] for r in recs)
    else:  # one engine at a time, v s v a: as many as the reference's, never more
        assert all(r[mn.WEIGHT_SYNCS] <= r[mn.REFERENCE_SYNCS] for r in recs)


def test_a_stale_engine_is_synced_before_it_serves(tiny_path):
    """Whoever wakes the engine (the pool, or a direct generate after an update), the policy's new
    weights reach it first; an update with no optimiser step leaves it fresh."""
    async def main():
        ledger = Ledger(budget=None)
        w = (await _workers(tiny_path, ledger, True))["verifier"]
        req = Request("verifier", [{"role": "user", "content": "x"}], Sampling(seed=1))
        v0 = (await w.generate([req]))[0].text.split("|")[1]
        await w.engine_sleep()
        await w.update(_rows("verifier", 1), seed=1)
        v1 = (await w.generate([req]))[0].text.split("|")[1]  # asleep and stale: woken and synced
        assert v1 != v0 and w.engine_counters["syncs"] == 2
        await w.engine_sleep()
        await w.engine_wake()  # fresh: a plain wake, no sync
        assert w.engine_counters["syncs"] == 2 and w.engine_counters["wakes"] == 2
        await w.close()

    asyncio.run(main())


# ----------------------------------------------------------------------------------------- the tiny recipe, real engines

MICRO = ["sft.steps=60", "sft.batch_size=8", "rollout.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=6",
         "data.size=40", "agent_defaults.micro_batch_size=16", "steps=2",
         "val.before_train=false", "val.every=0"]  # the steps' own counts: no validation between them


def _records(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _same_run(a: list[dict], b: list[dict]) -> None:
    """Every metric but timings and the engine counters is the same: rollouts, rewards, gradients. The
    engine's own log-probs (``rollout_corr/*``, the engine-trainer gap) come from its bf16 batched
    forward, whose last bits depend on which requests a batch held (timing): equal to 1e-5."""
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        keys = {k for k in set(x) | set(y) if "timing_s" not in k and not k.startswith("cpu_s/") and not k.startswith("rollout/") and "/rollout/" not in k}
        gap = {k for k in keys if "rollout_corr/" in k}
        assert {k: x.get(k) for k in keys - gap} == {k: y.get(k) for k in keys - gap}
        assert {k: x.get(k) for k in gap} == pytest.approx({k: y.get(k) for k in gap}, abs=1e-5)
        assert x[mn.SCORE] == y[mn.SCORE] and math.isfinite(x[mn.GRAD_NORM]) and x[mn.GRAD_NORM] > 0  # weights moved


def _train(run, extra: list[str], use_ray: bool = False) -> list[dict]:
    from drmas_trainer.config.train import parse_override
    from drmas_trainer.trainer import train

    cfg = load_config("tiny", dict(parse_override(s) for s in MICRO + extra))
    train(cfg, run, use_ray=use_ray, progress=False)
    return _records(run)


@pytest.mark.slow
def test_tiny_recipe_pooled_in_process_and_on_ray_equals_all_awake(tmp_path):
    """The micro tiny recipe, 2 steps, three ways: all awake in process (today's layout), pooled in
    process with one engine awake at a time, pooled on Ray with both groups' actors on one logical
    GPU (the pool in the driver adopts engines that live in the actors)."""
    awake = _train(tmp_path / "awake", ["rollout.engines=awake"])
    # the other two start from the awake run's warm-started team (its ckpt/step_0) rather than
    # training the same warm start again: the same weights, the same RL steps
    warm = tmp_path / "awake" / "ckpt" / "step_0" / "models"
    same_start = ["sft.steps=0", "sft.agent_steps={}", f"agents.solver.model={warm / 'solver'}",
                  f"agents.checker.model={warm / 'checker'}"]
    pooled = _train(tmp_path / "pooled", ["rollout.engines_awake=1", *same_start])  # auto: two engines, a budget of one: pooled
    _same_run(awake, pooled)
    assert [r[mn.ENGINES_POOLED] for r in pooled] == [1, 1] and [r[mn.ENGINES_POOLED] for r in awake] == [0, 0]
    assert [r[mn.WEIGHT_SYNCS] for r in awake] == [2, 2] and [r[mn.ENGINE_WAKES] for r in awake] == [0, 0]
    assert [r[mn.WEIGHT_SYNCS] for r in pooled] == [0, 2]  # step 1 runs on the start's weights
    assert all(r[mn.ENGINE_WAKES] >= 2 and r[mn.WEIGHT_SYNCS] <= r[mn.REFERENCE_SYNCS] for r in pooled)
    info = json.loads((tmp_path / "pooled" / "workers.json").read_text())
    assert info["rollout_engines"]["mode"] == "pooled" and "engines_awake 1" in info["rollout_engines"]["why"]

    pytest.importorskip("ray")
    from drmas_trainer.ray_workers import init_ray, shutdown_ray

    assert init_ray(num_cpus=2, num_gpus=1)  # one logical GPU: both groups' actors on it
    try:
        on_ray = _train(tmp_path / "ray", ["rollout.engines_awake=1", "ray.gpus_per_worker=0.5", *same_start], use_ray=True)
    finally:
        shutdown_ray()
    _same_run(awake, on_ray)
    info = json.loads((tmp_path / "ray" / "workers.json").read_text())
    assert info["ray"] is True and info["rollout_engines"]["mode"] == "pooled"
    assert len({tuple(g["ray_gpu_ids"]) for g in info["worker_groups"]}) == 1
    assert [r[mn.WEIGHT_SYNCS] for r in on_ray] == [0, 2] and all(r[mn.ENGINE_WAKES] >= 2 for r in on_ray)
