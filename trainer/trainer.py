"""The reference trainer: agent-wise GRPO (Dr. MAS) on a single controller. Read it top-down.

    from drmas_trainer.config.train import load_config
    from drmas_trainer.trainer import train
    summary = train(load_config("tiny"), "runs/tiny")          # or: drmas-bench train --recipe tiny

One iteration (``step``)::

    prompts   P tasks from the shuffled training set (the data cursor advances by P)
    rollouts  the harness workflow runs n episodes per prompt with the worker groups' engines,
              recording prompt/response token ids and the engines' log-probs; the engines stay
              awake, or a pool keeps awake what the memory budget allows and holds them asleep
              for the update (rollout.engines; rollout_engines.py)
    old logp  rows split by worker group; each group checks its rows' ids against their text and
              recomputes their log-probs (the "old" policy; rollout.old_logprobs; scoring.py), with
              use_kl_in_reward also the reference policy's (reference_policy.py), then the rollout
              correction's weights (rollout_correction.py) and the engine-vs-trainer metrics
    rewards   graders fill R per trajectory; row score = R - c_inv * (1 - valid), minus
              beta * sum_t KL_t with use_kl_in_reward (rewards.py: kl_penalty, fixed/adaptive beta)
    advantage compute_advantages(scores, uid, traj, agent, estimator) per row (drmas, grpo, ...), the
              reference's adv_std / adv_norm / adv_diag metrics (adv_metrics.py), and with
              balance_loss_by_agent_freq each row's loss weight (loss_balance.py)
    update    each group runs its PPO/GSPO epochs and mini-batches on its rows
    sync      each group copies its new weights into its rollout engine (pooled: at its next wake)
    save      every save_every steps: RUN/ckpt/step_K (atomic; see checkpoint.py)
    log       one JSON line in RUN/metrics.jsonl (+ TensorBoard when installed): the step's metrics, its
              workload (workload_log.py: episodes, prompt and response tokens per generate call) and its
              phases' seconds under verl's timer names (metric_names.PHASES)

Before step 1 an optional supervised warm start (``sft:``, toy only) is saved as ``ckpt/step_0``.
``resume=True`` restarts from the newest complete checkpoint (weights, optimiser state, RNG, step,
data cursor; metrics cut back to that step): a killed run continues where its last checkpoint was.

Worker groups run in this process (``use_ray=False``) or as Ray actors (``use_ray=True``), both
exposing the async methods of :class:`~drmas_trainer.worker.WorkerGroup`. :func:`train` checks and
locks the run directory, :func:`_train` is the iteration above; around it: ``prepare.py`` (tasks,
retriever, rollout team, worker groups, warm start), ``saving.py`` (a checkpoint of the run, and
resuming from one) and ``runlog.py`` (``metrics.jsonl``, ``config.yaml``, the summary).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib.util
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from drmas_bench.files import inside
from drmas_bench.run_dir import RunLock, make_run_dir, write_error_log
from drmas_bench.runner import EpisodeRun, TeamRuntime, run_episodes
from drmas_bench.types import Task, Trajectory, UserError
from drmas_bench.workflows.base import WORKFLOWS, WorkflowSpec, check_workflow_options, derive_seed, get_workflow
from drmas_trainer import checkpoint as ckpt_io
from drmas_trainer import metric_names, workload_log
from drmas_trainer.adv_metrics import pools_by_agent, reference_adv_metrics
from drmas_trainer.advantages import compute_advantages
from drmas_trainer.config.groups import plan_worker_groups
from drmas_trainer.config.train import TrainConfig
from drmas_trainer.fsdp.ray_group import check_sharded
from drmas_trainer.loss_balance import row_loss_weights
from drmas_trainer.phase_clock import PhaseClock
from drmas_trainer.prepare import (
    load_train_tasks,
    rollout_retriever,
    rollout_sampling,
    rollout_team,
    start_workers,
    warm_start,
)
from drmas_trainer.ray_workers import init_ray, shutdown_ray
from drmas_trainer.rewards import KLController, row_scores
from drmas_trainer.rollout_engines import RolloutEngines, engine_metrics, reference_syncs
from drmas_trainer.runlog import (
    CKPT_CACHE,
    METRICS,
    RUN_FILES,
    MetricsLog,
    check_run_config,
    clear_run,
    json_line,
    never_updated,
    read_metrics,
    step_metrics,
    summarize,
)
from drmas_trainer.saving import local_checkpoint, save_checkpoint
from drmas_trainer.scoring import check_tokens, correct_rows, kl_penalised_scores, start_kl_controller
from drmas_trainer.trackers import check_tracker
from drmas_trainer.val_checks import check_val
from drmas_trainer.validation import Validator, logged_history
from drmas_trainer.worker import LossSettings, Row

logger = logging.getLogger(__name__)


# ================================================================================= the training loop


def train(cfg: TrainConfig, out: str | os.PathLike, *, resume: bool = False, fresh: bool = False, use_ray: bool | None = None,
          progress: bool = True) -> dict[str, Any]:
    """Run (or resume) training into run directory ``out``; returns a summary dict.

    Args:
        cfg: the configuration (``load_config``).
        out: the run directory (``metrics.jsonl``, ``config.yaml``, ``ckpt/``).
        resume: continue from the newest complete checkpoint in ``out/ckpt`` (none: start afresh).
        fresh: first delete what a previous run left in ``out`` (under the run dir's lock).
        use_ray: worker groups as Ray actors (True), in this process (False), or None: Ray when a
            CUDA GPU is present and ray is installed, else in process.
        progress: show a progress bar.
    """

    # everything that can be checked is checked before the run directory exists: names and settings,
    # workflow options, the training tasks, the retriever (a server that is down fails here)
    wf = get_workflow(cfg.workflow)
    plan_worker_groups(cfg, wf.agents)
    check_workflow_options(wf, cfg.workflow_options)
    check_val(cfg, wf)  # keep_best against the names validation logs; the benchmarks' grading family
    check_tracker(cfg.tracker)
    tasks = load_train_tasks(cfg)
    retriever = rollout_retriever(cfg, wf)
    ckpt_io.resolve_root(Path(out), cfg.ckpt_root)  # a URL whose fsspec backend is missing fails here
    use_ray = torch.cuda.is_available() and _has_ray() if use_ray is None else use_ray
    check_sharded(cfg, use_ray)  # fsdp.ranks > 1 without --ray: refused before the run folder exists
    with RunLock(make_run_dir(out)):  # one trainer per run directory, from before anything is deleted
        for name in RUN_FILES + (CKPT_CACHE,):  # a planted symlink must not redirect a write outside the run dir
            inside(out, Path(out) / name)
        if fresh:
            clear_run(Path(out))
            ckpt_io.clear(ckpt_io.resolve_root(Path(out), cfg.ckpt_root))
        try:
            return asyncio.run(_train(cfg, Path(out), tasks, retriever, resume=resume, use_ray=use_ray, progress=progress))
        except (UserError, KeyboardInterrupt):
            raise
        except Exception as e:  # a bug: its traceback goes to RUN/error.log (the CLI prints one line)
            e.traceback_log = write_error_log(out, e)  # where it went: a temporary file when the disk is full
            raise


def refuse_unrunnable(cfg: TrainConfig, wf: Any, n_tasks: int) -> None:
    """One line for a recipe that cannot run on these tasks and this workflow, before anything starts."""
    if cfg.rollout.prompts_per_step > n_tasks:
        raise UserError(f"rollout.prompts_per_step ({cfg.rollout.prompts_per_step}) exceeds the {n_tasks} training tasks")
    if (cfg.sft.steps or any(cfg.sft.agent_steps.values())) and wf.sft is None:
        with_sft = [name for name, spec in WORKFLOWS.items() if spec.sft is not None]
        raise UserError(f"the sft warm start has examples for {', '.join(with_sft)} only; set sft.steps: 0 "
                        f"for workflow {cfg.workflow!r}")


async def _train(cfg: TrainConfig, run: Path, tasks: list, retriever: Any, *, resume: bool, use_ray: bool | None,
                 progress: bool) -> dict[str, Any]:
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    wf = get_workflow(cfg.workflow)
    plan = plan_worker_groups(cfg, wf.agents)
    n_steps = total_steps(cfg, len(tasks))
    refuse_unrunnable(cfg, wf, len(tasks))

    # --- the run directory: config, latest checkpoint, metrics --------------------------------
    use_ray = torch.cuda.is_available() and _has_ray() if use_ray is None else use_ray
    found, resume_from, state = open_run(cfg, run, resume, use_ray)
    metrics = MetricsLog(run, state["step"], tracker=cfg.tracker, config=cfg.to_dict(), restore=state.get("record"))

    # --- worker groups (in process or Ray actors), their engines --------------------------------
    ray_started = False
    if use_ray:
        ray_started = init_ray(cfg.ray.num_cpus, cfg.ray.num_gpus, cfg.ray.address, cfg.ray.ship_code)
    workers: dict[str, Any] = {}
    engines: RolloutEngines | None = None
    try:
        # the start before step 1 takes a minute on a CPU: say what it is doing
        t_start = time.perf_counter()
        logger.info(f"[train] starting {len(plan)} worker group(s) ({', '.join(plan)}): loading models, optimisers "
                    f"and rollout engines{' as Ray actors' if use_ray else ''}"
                    + (f", from checkpoint step {found[0]}" if found else ""))
        await start_workers(cfg, plan, resume_from, use_ray, workers)
        infos = await asyncio.gather(*(w.info() for w in workers.values()))
        engines = await RolloutEngines.start(cfg, workers, infos, plan, bool(use_ray))  # awake or pooled (it logs why)
        (run / "workers.json").write_text(json.dumps({"ray": bool(use_ray), "worker_groups": infos,
                                                      "rollout_engines": engines.describe()}, indent=1))
        runtime = TeamRuntime(rollout_team(cfg, plan, wf), engines.views(), rollout_sampling(cfg))

        # --- step 0: the supervised warm start, saved as the untrained team ---------------------
        logger.info(f"[train] worker groups ready in {time.perf_counter() - t_start:.0f} s")
        if not found:
            await step_zero(cfg, run, plan, workers, wf)
        logger.info(f"[train] {n_steps - int(state['step'])} RL step(s) to go, {cfg.rollout.prompts_per_step} prompts x "
                    f"{cfg.rollout.n} episodes each")

        # --- RL iterations ------------------------------------------------------------------------
        history = logged_history(read_metrics(run))
        val = Validator(cfg, run, plan, wf, workers, retriever, history, engines) if cfg.val.active else None
        lp = Loop(cfg, plan, wf, runtime, retriever, workers, kl_ctrl=start_kl_controller(cfg, run, int(state["step"])),
                  engines=engines, val=val)
        if lp.val is not None and cfg.val.before_train and state["step"] == 0 and 0 not in history:
            metrics.write({"step": 0, **await lp.val.validate(0)})  # ckpt/step_0 before RL; again if a stop cut its line
            await lp.val.keep_best(0, True, None)
        return await rl_loop(lp, run, tasks, state, n_steps, metrics, progress)
    finally:
        if engines is not None:
            await engines.close()
        for w in workers.values():
            try:
                await w.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        metrics.close()
        if ray_started:
            shutdown_ray()


# ================================================================================= the loop's pieces, in order


def open_run(cfg: TrainConfig, run: Path, resume: bool, use_ray: bool) -> tuple[Any, Any, dict[str, Any]]:
    """The run directory's newest checkpoint, if any (refused without ``resume``), with its config
    checked against ``cfg`` and its RNG restored: (found (step, path) or None, the folder the worker
    groups load from or None, the loop's state: step, cursor, skipped_total)."""
    ckpt_root = ckpt_io.resolve_root(run, cfg.ckpt_root)
    found = ckpt_io.latest_checkpoint(ckpt_root)
    if found and not resume:
        raise UserError(f"{run if cfg.ckpt_root is None else ckpt_root} already holds checkpoints (latest step {found[0]}); "
                        f"pass --resume to continue "
                        f"it, --fresh to discard it, or choose another --out")
    check_run_config(run, cfg, resuming=found is not None)
    ckpt_io.clean_partial(ckpt_root)
    local, resume_from = local_checkpoint(run, found[1], use_ray) if found else (None, None)
    state = ckpt_io.read_state(local) if local else {"step": 0, "cursor": 0, "skipped_total": 0}
    if local:
        ckpt_io.load_rng(local / "rng.pt")
        random.setstate(_tuplify(state["python_rng"]))
    return found, resume_from, state


async def step_zero(cfg: TrainConfig, run: Path, plan: dict[str, Any], workers: dict[str, Any], wf: WorkflowSpec) -> None:
    """Before step 1 of a new run: the supervised warm start (when the recipe has one), then the team
    saved as ``ckpt/step_0``, the untrained team RL starts from."""
    if cfg.sft.steps or any(cfg.sft.agent_steps.values()):
        t_sft = time.perf_counter()
        logger.info(f"[train] supervised warm start (sft): {cfg.sft.steps} steps per agent"
                    + (" (" + ", ".join(f"{a}: {k}" for a, k in cfg.sft.agent_steps.items()) + ")"
                       if cfg.sft.agent_steps else "")
                    + f", batch {cfg.sft.batch_size}, on generated {cfg.workflow} examples")
        sft_info = await warm_start(cfg, plan, workers)
        logger.info(f"[train] warm start done in {time.perf_counter() - t_sft:.0f} s")
        (run / "sft.json").write_text(json_line(sft_info, indent=1))
        failed = {n: i["sft_aborted"] for n, i in sft_info.items() if i.get("sft_aborted")}
        if failed:
            raise UserError("the sft warm start stopped: " + "; ".join(f"worker group {n}: {why}" for n, why in failed.items())
                            + f"; lower sft.lr or check the model (details in {run / 'sft.json'})")
    logger.info("[train] saving the team before RL as ckpt/step_0")
    await save_checkpoint(run, cfg, plan, workers, wf, step=0, cursor=0, skipped_total=0)


async def rl_loop(lp: "Loop", run: Path, tasks: list[Task], state: dict[str, Any], n_steps: int, metrics: MetricsLog,
                  progress: bool) -> dict[str, Any]:
    """The RL iterations from the state's step to ``n_steps``: each logged, checkpointed every
    ``save_every`` steps and at the last; returns the run's summary."""
    from tqdm import tqdm

    cfg = lp.cfg
    step0, cursor, skipped_total = int(state["step"]), int(state["cursor"]), int(state["skipped_total"])
    bar = tqdm(total=n_steps, initial=step0, desc=f"train {cfg.algo.estimator}", unit="step",
               disable=not progress, dynamic_ncols=True, file=sys.stderr)
    for step in range(step0 + 1, n_steps + 1):
        t_step, cpu_step = time.perf_counter(), time.process_time()
        # 1. prompts: the next P tasks of the shuffled training set
        batch = next_prompts(tasks, cursor, cfg.rollout.prompts_per_step, cfg.data)
        cursor_before, cursor = cursor, cursor + len(batch)
        # 2.-6. rollouts, old log-probs, scores, advantages, updates, sync
        record = await rl_step(lp, batch, step, cursor_before)
        if lp.val is not None and lp.val.due(step, n_steps):  # validation on the engines as synced (RUN/val/step_N)
            record.update(await lp.val.validate(step))
        record[metric_names.SKIPPED_STEPS_TOTAL] = skipped_total = skipped_total + record[metric_names.SKIPPED_STEPS]
        # 7. checkpoint (and with val.keep_best the best validation's, kept beside latest), timed for the log
        save = functools.partial(save_checkpoint, run, cfg, lp.plan, lp.workers, lp.wf, step=step, cursor=cursor,
                                 skipped_total=skipped_total, record=record)
        saved = step == n_steps or bool(cfg.save_every and step % cfg.save_every == 0)
        clock = PhaseClock()
        if saved:
            await save(keep=lp.val.kept() if lp.val else ())
        if lp.val is not None:
            await lp.val.keep_best(step, saved, save)
        # 8. log: after the save so that the step's record holds its seconds (verl's order); the checkpoint
        #    carries the record without them, which a resume logs where a stop came between the two
        clock.stop(metric_names.TIME_SAVE)
        record.update({**clock.record, metric_names.TIME_STEP: time.perf_counter() - t_step,
                       metric_names.cpu(metric_names.TIME_STEP): time.process_time() - cpu_step})
        metrics.write(record)
        bar.set_postfix(reward=f"{record[metric_names.SCORE]:.3f}", refresh=False)
        bar.update(1)
    bar.close()
    summary = summarize(run, n_steps)
    if lp.val is not None:
        summary["val_best"] = lp.val.best()
    stuck = never_updated(read_metrics(run), list(lp.plan))
    if stuck:
        raise UserError(f"no optimizer step was applied for worker group(s) {', '.join(stuck)}: every update was "
                        f"skipped as non-finite (loss or gradient) in {summary['steps']} step(s); the metrics are in "
                        f"{run / METRICS}; check the lr, algo.eps / algo.std_floor and the data")
    return summary




def total_steps(cfg: TrainConfig, n_tasks: int) -> int:
    if cfg.epochs is not None:
        return max(1, math.ceil(cfg.epochs * n_tasks / cfg.rollout.prompts_per_step))
    return cfg.steps


def next_prompts(tasks: list[Task], cursor: int, k: int, data: Any) -> list[Task]:
    """Tasks number cursor .. cursor+k-1 of the endless sequence "epoch 0 shuffled, epoch 1
    shuffled, ..." (epoch e shuffled with seed (data.seed, e)). Each gets a run-unique id
    ``<id>@<position>`` so that a task met twice has its own episodes and sampling seeds."""
    out = []
    orders: dict[int, list[int]] = {}
    for i in range(cursor, cursor + k):
        epoch, j = divmod(i, len(tasks))
        if epoch not in orders:
            order = list(range(len(tasks)))
            if data.shuffle:
                random.Random(derive_seed(data.seed, "epoch", epoch)).shuffle(order)
            orders[epoch] = order
        t = tasks[orders[epoch][j]]
        out.append(dataclasses.replace(t, id=f"{t.id}@{i}", meta={**t.meta, "source_id": t.id}))
    return out


@dataclass
class Loop:
    """What every iteration uses: the config, the worker groups and their plan, the workflow, the
    rollout team, the retriever, and the KL controller (None without KL in the reward). ``observe``,
    when set, is called once per step, after the update, with what the step trained on: the rows of
    :func:`make_rows` (each Row as its worker group got it: advantage, loss weights, old log-probs),
    ``scores`` (after any KL penalty), ``adv`` and ``updates`` (per worker group); tests/test_switches.py
    checks every training switch through it."""

    cfg: TrainConfig
    plan: dict[str, Any]
    wf: WorkflowSpec
    runtime: TeamRuntime
    retriever: Any
    workers: dict[str, Any]
    kl_ctrl: KLController | None = None
    observe: Callable[[dict[str, Any]], None] | None = None
    engines: RolloutEngines | None = None  # awake or pooled (None: awake)
    val: Validator | None = None  # validation during training (val.every / val.before_train)

    @property
    def loss(self) -> LossSettings:
        a = self.cfg.algo
        return LossSettings(mode=a.loss, clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip, agg=a.agg,
                            entropy_coef=a.entropy_coef)


async def rl_step(lp: Loop, batch: list[Task], step: int, cursor: int) -> dict[str, Any]:
    """Steps 2-6 of one iteration on ``batch``; returns the step's record (without the step total)."""
    cfg, names = lp.cfg, list(lp.plan)
    engines = lp.engines or RolloutEngines("awake", lp.workers, "")
    # 2. rollouts: n episodes per prompt through the harness workflow, with the engines' log-probs;
    #    pooled engines wake under the budget, then are held asleep for steps 3-5
    counters0 = await engines.counters()
    clock = PhaseClock()
    await engines.before_rollout()
    trajs = await rollout(batch, cfg, lp.runtime, lp.wf, lp.retriever, step=step)
    await engines.after_rollout()
    clock.stop(metric_names.TIME_GEN)
    rb = make_rows(trajs, batch, lp.wf.agents)
    by_wg = {wg: [r for r, g in zip(rb["rows"], rb["wg"]) if g == wg] for wg in names}

    # 3. old log-probs and the token check: each group scores its own rows with its current policy
    #    (rollout.old_logprobs: recompute), and with the reference policy for KL in the reward; then the
    #    rollout correction's weights and the engine-vs-trainer metrics; too many rows whose ids do not
    #    match their text stop the run (before this step updates anything)
    clock.start()
    recompute = cfg.rollout.old_logprobs == "recompute"
    scored = dict(zip(names, await asyncio.gather(*(
        lp.workers[wg].score_rows(by_wg[wg], recompute=recompute, **({"reference": True} if lp.kl_ctrl else {}))
        for wg in names))))
    extra = check_tokens(by_wg, scored, cfg.rollout.max_token_mismatch, step)
    extra.update(correct_rows(by_wg, scored, cfg.rollout))
    clock.stop(metric_names.TIME_OLD_LOGPROB)

    # 4. rewards -> row scores (- the KL penalty) -> advantages and their metrics -> loss weights
    scores = row_scores(rb["reward"], rb["valid"], c_inv=cfg.algo.c_inv)
    if lp.kl_ctrl is not None:
        scores, kl_record = kl_penalised_scores(lp.kl_ctrl, cfg.algo.kl_penalty, rb["rows"], by_wg, scored, scores)
        extra.update(kl_record)
    adv = set_advantages(cfg, rb, scores, lp.wf.agents, extra)

    # 5. update each worker group on its own rows
    clock.start()
    results = await asyncio.gather(*(
        lp.workers[wg].update(by_wg[wg], epochs=cfg.algo.ppo_epochs, mini_batches=cfg.algo.mini_batches,
                              loss=lp.loss, seed=derive_seed(cfg.seed, "update", step, wg))
        for wg in names))
    updates = dict(zip(names, results))
    clock.stop(metric_names.TIME_UPDATE)
    if lp.observe is not None:
        lp.observe({**rb, "scores": scores, "adv": adv, "updates": updates})

    # 6. sync the rollout engines with the new weights (pooled: each at its next wake)
    clock.start()
    await engines.after_update()
    clock.stop(metric_names.TIME_SYNC)

    record = step_metrics(step, cursor, batch, trajs, rb, scores, adv, updates, lp.wf.agents, lp.plan)
    record.update(extra)
    record.update(engine_metrics(counters0, await engines.counters()))
    record[metric_names.REFERENCE_SYNCS] = reference_syncs(trajs)
    record[metric_names.ENGINES_POOLED] = int(engines.mode == "pooled")
    record[metric_names.SKIPPED_STEPS] = sum(u["skipped_steps"] for u in updates.values())
    record.update(workload_log.step_metrics(trajs, {a: g for g, p in lp.plan.items() for a in p.agents}))
    record.update(clock.record)
    return record


def set_advantages(cfg: TrainConfig, rb: dict[str, Any], scores: torch.Tensor, agents: tuple[str, ...],
                   record: dict[str, Any]) -> torch.Tensor:
    """Each row's advantage (statistics from this batch only) and, with ``balance_loss_by_agent_freq``,
    its loss weight folded into its per-token policy-gradient weights; the advantage metrics with the
    reference's names (``algo.adv_metrics``) go into ``record``. Returns the [N] advantages."""
    a = cfg.algo
    adv = compute_advantages(scores, rb["uid"], rb["traj"], rb["agent"], estimator=a.estimator, norm_by_std=a.norm_by_std,
                             eps=a.eps, single_row=a.single_row, std_floor=a.std_floor, group_by_agent=a.group_by_agent)
    for row, v in zip(rb["rows"], adv.tolist()):
        row.advantage = v
    record.update(reference_adv_metrics(scores, rb["uid"], rb["traj"], rb["agent"], agents, version=a.adv_metrics,
                                        group_by_agent=pools_by_agent(a.estimator, a.group_by_agent), adv=adv.double()))
    weights = row_loss_weights("agent_freq" if a.balance_loss_by_agent_freq else "none", rb["uid"], rb["agent"])
    if weights is not None:
        for row, w in zip(rb["rows"], weights.tolist()):
            n = len(row.response_ids)
            row.is_weights = [w] * n if row.is_weights is None else [v * w for v in row.is_weights]
    return adv


async def rollout(batch: list[Task], cfg: TrainConfig, runtime: TeamRuntime, wf: WorkflowSpec,
                  retriever: Any = None, step: int = 0) -> list[Trajectory]:
    """n graded episodes per prompt, in (prompt, sample) order, with token ids and log-probs; every
    call's sampling seed is ``sample_seed(cfg.seed, step, prompt, sample, agent, turn)``."""
    got: list[Trajectory] = []
    await run_episodes(batch, cfg.rollout.n, EpisodeRun(
        runtime, wf, seed=cfg.seed, step=step, retriever=retriever, workflow_options=dict(cfg.workflow_options),
        concurrency=cfg.rollout.concurrency, flush_every=len(batch) * cfg.rollout.n, progress=False,
        want_logprobs=True, on_finished=got.extend))
    pos = {t.id: i for i, t in enumerate(batch)}
    got.sort(key=lambda t: (pos[t.task.id], t.sample_idx))
    return got


def make_rows(trajs: list[Trajectory], batch: list[Task], agents: tuple[str, ...]) -> dict[str, Any]:
    """One training row per agent call: ids for the advantage statistics (uid = prompt, traj,
    agent), the row's trajectory reward and validity, its worker group and its tokens."""
    pos = {t.id: i for i, t in enumerate(batch)}
    agent_id = {a: i for i, a in enumerate(agents)}
    rows, wg, uid, traj, agent, reward, valid = [], [], [], [], [], [], []
    for ti, t in enumerate(trajs):
        for turn in t.turns:
            c = turn.completion
            if c.token_ids and (c.logprobs is None or len(c.logprobs) != len(c.token_ids)):
                raise UserError(f"worker group {turn.wg}: its engine returned no log-probs for the response "
                                f"tokens; the trainer needs them (old policy)")
            # token-in/token-out: the row holds the engine's own ids (never a re-tokenisation of c.text)
            rows.append(Row(turn.agent, list(c.prompt_ids), list(c.token_ids), list(c.logprobs or []), 0.0, text=c.text))
            wg.append(turn.wg)
            uid.append(pos[t.task.id])
            traj.append(ti)
            agent.append(agent_id[turn.agent])
            reward.append(float(t.reward))
            valid.append(bool(turn.valid))
    if not rows:
        raise UserError("the rollouts produced no agent calls")
    return {"rows": rows, "wg": wg, "uid": torch.tensor(uid), "traj": torch.tensor(traj),
            "agent": torch.tensor(agent), "reward": torch.tensor(reward, dtype=torch.float64),
            "valid": torch.tensor(valid)}


def _has_ray() -> bool:
    return importlib.util.find_spec("ray") is not None


def _tuplify(x: Any) -> Any:
    """``random.getstate()`` as JSON gave it back (lists) -> the tuples ``random.setstate`` takes."""
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x
