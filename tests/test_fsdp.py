"""Sharded worker groups (trainer/fsdp*.py): an update with 2 and 4 gloo ranks (FSDP2 over CPU
processes) equals the single-process WorkerGroup update on the same rows, for every policy-loss
mode and aggregation, shared and LoRA groups and the CPU-offloaded optimiser; the optimiser state
saved per rank resumes with another rank count.

Tolerance, relative to the update's own move: after two AdamW steps (lr 1e-3) the sharded
parameters differ from the single-process ones by at most REL_MOVE (2 %) of how far the
single-process update moved them (:func:`_gap`: both distances as norms over all parameters). The
data-parallel sums run in another order, so the float32 gradients differ in their last bits, and
AdamW divides each gradient by its own running scale, so a parameter whose gradient nearly cancels
(two agents' terms in a shared group) moves by a visibly different fraction of lr, and by how much
depends on the machine's float kernels: an absolute limit of 2e-5 failed `shared-two-agents` with 2
ranks on an AMD EPYC machine (5.23e-5 apart, within 0.6 % of the step there). AdamW's weights alone
would not show a wrong loss scale (the update is scale-free), so the pre-clip gradient norms
(global and per agent) must agree to 1e-4 relative, the loss likewise.
The multi-process runs start real processes (each imports torch and transformers): slow tier; the
row split and padding are checked in the fast tier without processes.
"""

from __future__ import annotations

import asyncio
import copy
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from drmas_bench.models import resolve_model
from drmas_trainer.config.train import AgentConfig, LoraConfig
from drmas_trainer.fsdp.sharding import spawn_ranks
from drmas_trainer.fsdp.worker import ShardedWorkerGroup
from drmas_trainer.optim import local
from drmas_trainer.worker import LossSettings, Row, WorkerGroup

REL_MOVE = 0.02  # the sharded weights' distance from the single-process ones / the update's own move
LR = 1e-3

#: name -> (agents, group settings, loss settings, LoRA)
CASES: dict[str, tuple[tuple[str, ...], dict, LossSettings, bool]] = {
    "ppo-token-mean": (("solver",), {}, LossSettings(), False),
    "ppo-seq-mean-token-mean": (("solver",), {}, LossSettings(agg="seq-mean-token-mean"), False),
    "ppo-seq-mean-token-sum": (("solver",), {}, LossSettings(agg="seq-mean-token-sum"), False),
    "gspo": (("solver",), {}, LossSettings(mode="gspo"), False),
    "ppo-entropy-clipped": (("solver",), {"grad_clip": 1e-3}, LossSettings(entropy_coef=0.01, dual_clip=None), False),
    "shared-two-agents": (("solver", "checker"), {}, LossSettings(), False),
    "offload-cpu": (("solver",), {"optimizer_offload": "cpu"}, LossSettings(), False),
    "lora-shared-base": (("solver", "checker"), {}, LossSettings(), True),
}


def _path() -> str:
    got = resolve_model("tiny-random")
    return str(getattr(got, "path", got))


def _rows(agents: tuple[str, ...], seed: int) -> list[Row]:
    rng = random.Random(seed)
    out = []
    for k in range(13):
        P, R = rng.randint(3, 9), rng.randint(1, 7)
        out.append(Row(agents[k % len(agents)], [rng.randint(5, 200) for _ in range(P)],
                       [rng.randint(5, 200) for _ in range(R)], [0.0] * R, rng.uniform(-1, 1),
                       is_weights=[rng.uniform(0.5, 1.5) for _ in range(R)] if k % 3 == 0 else None))
    return out


def _kwargs(case: str) -> tuple[list[str], AgentConfig, dict]:
    agents, settings, _, use_lora = CASES[case]
    s = AgentConfig(lr=LR, micro_batch_size=2, **settings)
    extra: dict = {}
    if use_lora:
        s = s.model_copy(update={"lora": LoraConfig(rank=4, alpha=8)})
        extra = {"adapters": {a: s for a in agents}, "adapter_of": {a: a for a in agents}}
    return list(agents), s, extra


def _gap(one: dict[str, torch.Tensor], many: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> float:
    """||many - one|| / ||one - before|| over all parameters: how far a sharded update's weights are
    from the single-process update's, as a share of that update's own move."""
    def norm(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
        return math.sqrt(sum(float((a[k].double() - b[k].double()).square().sum()) for k in a))

    move = norm(one, before)
    assert move > 0, "the update did not move the weights"
    return norm(many, one) / move


def _name(agents: list[str]) -> str:
    return agents[0] if len(agents) == 1 else "shared"


def _with_old_logprobs(case: str) -> list[Row]:
    """The case's rows with the initial policy's own log-probs as old ones, nudged so ratios move."""
    agents, s, extra = _kwargs(case)
    wg = WorkerGroup(_name(agents), agents, s, _path(), device="cpu", **extra)
    rows = _rows(CASES[case][0], seed=len(case))
    lp = wg._old_logprobs(rows)
    rng = random.Random(1)
    for r, x in zip(rows, lp):
        r.old_logprobs = [v + rng.uniform(-0.05, 0.05) for v in x]
    return rows


def _update(wg: WorkerGroup, case: str, rows: list[Row]) -> tuple[dict, dict[str, torch.Tensor]]:
    out = asyncio.run(wg.update(copy.deepcopy(rows), loss=CASES[case][2], mini_batches=2, seed=3))
    return out, {k: wg._full(v).detach().clone() for k, v in wg.policy.state_dict().items()}


def _rank_cases(rank: int, world: int, cases: list[str], rows: dict[str, list[Row]], folder: str) -> dict:
    """Every case on this rank (a fresh group each); rank 0 returns the metrics and weights. Two
    ranks also checkpoint the RESUME_CASES after their update and update once more ("after:");
    four ranks resume from that checkpoint and make the same update ("resumed:")."""
    got = {}
    for case in cases:
        agents, s, extra = _kwargs(case)
        wg = ShardedWorkerGroup(_name(agents), agents, s, _path(), rank=rank, world=world, init_method="",
                                device="cpu", **extra)
        if case in SCORE_CASES:  # old and reference log-probs, rows split over the ranks
            scored = asyncio.run(wg.score_rows(copy.deepcopy(rows[case]), reference=True))
            ref = getattr(wg, "_reference_sharded", None)  # full weights: the frozen copy, sharded too
            if ref is not None:
                scored["reference_numel"] = [sum(wg._full(p).numel() for p in ref.parameters()),
                                             sum(local(p).numel() for p in ref.parameters())]
            got[f"scored:{case}"] = scored if rank == 0 else None
        out, state = _update(wg, case, rows[case])
        got[case] = (out, state) if rank == 0 else None
        if world == 2 and case in RESUME_CASES:  # one of them into a file:// URL: staged, uploaded per rank
            where = Path(folder, case).as_uri() if case == URL_CASE else f"{folder}/{case}"
            asyncio.run(wg.save(f"{where}/model", f"{where}/optim.pt"))
            after = _update(wg, case, rows[case])
            got[f"after:{case}"] = after if rank == 0 else None
    for case in RESUME_CASES if world == 4 else ():
        agents, s, extra = _kwargs(case)
        where = Path(folder, case).as_uri() if case == URL_CASE else f"{folder}/{case}"
        wg = ShardedWorkerGroup(_name(agents), agents, s, f"{where}/model", rank=rank, world=world,
                                init_method="", device="cpu", **extra)
        asyncio.run(wg.load_optimizer(f"{where}/optim.pt"))
        resumed = _update(wg, case, rows[case])
        got[f"resumed:{case}"] = resumed if rank == 0 else None
    return got


def _single(case: str, rows: list[Row]) -> tuple[dict, dict[str, torch.Tensor]]:
    agents, s, extra = _kwargs(case)
    return _update(WorkerGroup(_name(agents), agents, s, _path(), device="cpu", **extra), case, rows)


#: cases whose old and reference log-probs (KL in the reward) are compared too
SCORE_CASES = ("ppo-token-mean", "lora-shared-base")
#: cases whose 2-rank checkpoint is resumed by 4 ranks and by one process
RESUME_CASES = ("ppo-token-mean", "offload-cpu", "lora-shared-base")
#: the resume case saved into and resumed from a file:// URL (an fsspec checkpoint root)
URL_CASE = "offload-cpu"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """One process per case, then every case in 2 and in 4 gloo processes (starting them is most of
    the time: about 40 s and 80 s on a loaded 2-core machine)."""
    folder = tmp_path_factory.mktemp("fsdp")
    rows = {c: _with_old_logprobs(c) for c in CASES}
    single = {c: _single(c, rows[c]) for c in CASES}
    sharded = {w: spawn_ranks(_rank_cases, w, list(CASES), rows, str(folder))[0] for w in (2, 4)}
    return {"single": single, "sharded": sharded, "folder": folder, "rows": rows}


def _compare(one: tuple[dict, dict], many: tuple[dict, dict], before: dict[str, torch.Tensor],
             token_level: bool) -> None:
    (m1, w1), (mn, wn) = one, many
    assert m1["optimizer_steps"] == mn["optimizer_steps"] == 2 and mn["skipped_steps"] == 0
    gap = _gap(w1, wn, before)
    print(f"gap {gap:.4%} of the update's move")  # shown with -s: the figure docs/trainer.md quotes
    assert gap <= REL_MOVE, f"{gap:.2%} of the update's move apart"
    assert mn["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)  # a wrong loss scale shows here
    for a, v in m1["agent_grad_norm"].items():
        assert mn["agent_grad_norm"][a] == pytest.approx(v, rel=1e-4)
    # the loss is exact under any split; the other metrics are per-micro-batch token means, averaged
    # with the micro-batches' loss weights: exact for token-mean, split-dependent for the seq-mean modes
    for k in ("loss", "pg_loss", "ratio_max") + (("pg_clipfrac", "ppo_kl", "entropy") if token_level else ()):
        assert mn[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_sharded_update_equals_the_single_process_update(runs, case, world):
    single, sharded = runs["single"][case], runs["sharded"][world][case]
    # the step did move the weights, by about lr per step (AdamW): the gap is a share of a real move
    agents, s, extra = _kwargs(case)
    before = WorkerGroup(_name(agents), agents, s, _path(), device="cpu", **extra).policy.state_dict()
    assert max(float((single[1][k] - before[k]).abs().max()) for k in before) > 0.5 * LR
    _compare(single, sharded, before, CASES[case][2].token_level)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", SCORE_CASES)
def test_sharded_old_and_reference_logprobs_equal_the_single_process_ones(runs, case, world):
    agents, s, extra = _kwargs(case)
    one = WorkerGroup(_name(agents), agents, s, _path(), device="cpu", **extra)
    want = asyncio.run(one.score_rows(copy.deepcopy(runs["rows"][case]), reference=True))
    got = runs["sharded"][world][f"scored:{case}"]
    for key in ("logprobs", "ref_logprobs"):
        assert [len(x) for x in got[key]] == [len(x) for x in want[key]]
        diff = max(abs(a - b) for x, y in zip(got[key], want[key]) for a, b in zip(x, y))
        assert diff <= 1e-5, (key, diff)
    assert got["mismatch"] == want["mismatch"]
    if not CASES[case][3]:  # full weights: each rank holds its 1/world share of the frozen reference copy
        full, mine = got["reference_numel"]
        assert mine <= full / world * 1.1, (mine, full)


# ----------------------------------------------------------------------------------------- fast: the split


def _sharer(rank: int, world: int, mbs: int) -> SimpleNamespace:
    return SimpleNamespace(rank=rank, world=world, settings=SimpleNamespace(micro_batch_size=mbs))


@pytest.mark.parametrize("n,world,mbs", [(0, 2, 2), (1, 4, 2), (7, 2, 2), (13, 4, 3), (5, 4, 1), (9, 3, 8)])
def test_every_rank_runs_as_many_micro_batches_and_the_real_ones_cover_each_row_once(n, world, mbs):
    items = list(range(n))
    shares = [ShardedWorkerGroup._share(_sharer(r, world, mbs), items) for r in range(world)]
    assert len({len(s) for s in shares}) == 1  # the same number of forwards and backwards on every rank
    real = [x for s in shares for micro, ok in s if ok for x in micro]
    assert sorted(real) == items
    for s in shares:
        assert all(len(micro) <= mbs for micro, _ in s)
        assert all(micro == items[:1] for micro, ok in s if not ok)  # padding: one real row, weight 0
    # the plain loop: contiguous pieces, ceil(len / mbs) micro-batches each
    per_rank = [sum(1 for _, ok in s if ok) for s in shares]
    sizes = [len(items) // world + (1 if r < len(items) % world else 0) for r in range(world)]
    assert per_rank == [math.ceil(k / mbs) for k in sizes]


# ----------------------------------------------------------------------------------------- the plan on N GPUs


def _plan(recipe: str, gib: float, gpus: int, **overrides):
    from drmas_bench.workflows.base import get_workflow
    from drmas_trainer.config.train import load_config
    from drmas_trainer.config.groups import plan_worker_groups
    from drmas_trainer.forecast.memory import memory_plan
    from drmas_trainer.forecast.shapes import model_shape

    cfg = load_config(recipe, overrides)
    groups = plan_worker_groups(cfg, get_workflow(cfg.workflow).agents)
    return memory_plan(cfg, groups, {n: model_shape(str(g.settings.model)) for n, g in groups.items()},
                       gpu_gib=gib, use_ray=True, gpus=gpus)


def test_the_plan_shards_a_groups_training_state_over_the_gpus():
    from drmas_trainer.forecast.memory import format_plan

    # the paper row's recipe as it was before it followed the reference: unsharded, AdamW on the GPU
    adamw_on_gpu = {"fsdp.ranks": 1, "agent_defaults.optimizer_offload": "none",
                    "agent_defaults.engine_options": {"mem_fraction_static": 0.35}}
    one, eight = _plan("math_qwen3_4b", 79, 1, **adamw_on_gpu), _plan("math_qwen3_4b", 79, 8, **adamw_on_gpu)
    a = {k: v for k, v in one.groups[0].resident.items()}
    b = {k.removesuffix(" / 8"): v for k, v in eight.groups[0].resident.items()}
    assert b["weights fp32"] == -(-a["weights fp32"] // 8) and b["optimizer adamw"] == -(-a["optimizer adamw"] // 8)
    assert "gathered root (embeddings, head)" in eight.groups[0].update
    assert eight.fits and not one.fits  # 2 x Qwen3-4B: one GPU per group does not fit 80 GB, 8 shared GPUs do
    text = format_plan(eight)
    assert "colocated" in text and "update solver" in text and "update verifier" in text  # groups take turns


def test_the_plan_shards_the_frozen_reference_copy_of_kl_in_the_reward():
    """With KL in the reward a full-weight group keeps a frozen reference copy; sharded over 8 GPUs
    each holds 1/8 of it (drmas_trainer.fsdp.worker shards it like the policy), not all of it."""
    one, eight = _plan("math_qwen3_4b_adaptive_kl", 141, 1), _plan("math_qwen3_4b_adaptive_kl", 79, 8)
    whole = one.groups[0].resident["reference policy bf16 (frozen)"]
    assert whole == 2 * one.groups[0].shape.params  # bf16
    assert eight.groups[0].resident["reference policy bf16 (frozen) / 8"] == -(-whole // 8)
    assert not any(k == "reference policy bf16 (frozen)" for k in eight.groups[0].resident)


def test_sharded_groups_without_ray_are_refused_before_the_run_folder_exists(tmp_path):
    from drmas_bench.types import UserError
    from drmas_trainer.config.train import load_config
    from drmas_trainer.trainer import train

    with pytest.raises(UserError, match="--ray"):
        train(load_config("tiny", {"fsdp.ranks": 2}), tmp_path / "run", use_ray=False, progress=False)
    assert not (tmp_path / "run").exists()


def test_a_plan_that_does_not_fit_says_why_and_what_would():
    from drmas_trainer.forecast.memory import format_plan

    # engines that never sleep: three at 0.35 of the GPU beside the training state
    awake = {"agent_defaults.sleep_engine": False, "agent_defaults.engine_options": {"mem_fraction_static": 0.35}}
    plan = _plan("search_qwen2.5_7b", 79, 8, **awake)
    assert not plan.fits
    why = [ln for ln in format_plan(plan).splitlines() if ln.startswith("why: ")]
    assert why[0].startswith("why: rollout") and "3 engine(s) that do not sleep" in why[0]
    frac = min(float(ln.rsplit("<= ", 1)[1].split()[0]) for ln in why if "<= " in ln)
    assert _plan("search_qwen2.5_7b", 79, 8, **{**awake, "agent_defaults.engine_options": {"mem_fraction_static": frac}}).fits
    # sleeping engines share the rollout under a budget; one that alone does not fit says so
    huge = _plan("search_qwen2.5_7b", 79, 8, **{"agent_defaults.engine_options": {"mem_fraction_static": 0.95}})
    assert not huge.fits and huge.rollouts[0].awake == 0
    line = next(ln for ln in format_plan(huge).splitlines() if ln.startswith("why: rollout"))
    assert "not even one engine fits" in line
    frac = float(line.rsplit("<= ", 1)[1])
    assert _plan("search_qwen2.5_7b", 79, 8, **{"agent_defaults.engine_options": {"mem_fraction_static": frac}}).fits


# ----------------------------------------------------------------------------------------- the trainer, end to end
# The trainer's run with 2 gloo ranks per group as Ray actors (bands, validation on the ranks' engines
# equal to `eval --model`, resumed by 2 ranks and by one process, evaluated) is the heterogeneous
# team's: tests/test_hetero.py::test_tiny_hetero_with_two_ranks_per_group_into_a_url_root.


# ----------------------------------------------------------------------------------------- checkpoints


@pytest.mark.slow
@pytest.mark.parametrize("case", RESUME_CASES)
def test_a_sharded_checkpoint_resumes_with_another_rank_count(runs, case):
    """2 ranks save (model folder + per-rank optimiser shards); 4 ranks and one process resume from
    it: their next update is the one the 2 ranks made after saving (same tolerance as above)."""
    folder, rows = runs["folder"], runs["rows"]
    assert (folder / case / "optim.dcp" / "__1_0.distcp").is_file()  # URL_CASE: uploaded by rank 1 itself
    assert (folder / case / "optim.dcp" / ".metadata").is_file()
    agents, s, extra = _kwargs(case)
    one = WorkerGroup(_name(agents), agents, s, str(folder / case / "model"), device="cpu", **extra)
    saved = {k: v.detach().clone() for k, v in one.policy.state_dict().items()}
    asyncio.run(one.load_optimizer(str(folder / case / "optim.pt")))
    assert one.optimizer_steps == 2
    two = runs["sharded"][2][f"after:{case}"]
    for other in (runs["sharded"][4][f"resumed:{case}"], _update(one, case, rows[case])):
        gap = _gap(two[1], other[1], saved)
        assert gap <= REL_MOVE, f"{gap:.2%} of the update's move apart"
        assert other[0]["grad_norm"] == pytest.approx(two[0]["grad_norm"], rel=1e-4)
        assert other[0]["optimizer_steps"] == 2 and other[0]["lr"] == pytest.approx(two[0]["lr"])
