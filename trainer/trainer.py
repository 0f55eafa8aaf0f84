"""The reference trainer: agent-wise GRPO (Dr. MAS) on a single controller. Read it top-down.

    from drmas_trainer.config import load_config
    from drmas_trainer.trainer import train
    summary = train(load_config("tiny"), "runs/tiny")          # or: drmas-bench train --recipe tiny

One iteration (``step``)::

    prompts   P tasks from the shuffled training set (the data cursor advances by P)
    rollouts  the harness workflow runs n episodes per prompt with the worker groups' engines,
              recording prompt/response token ids and the engines' log-probs (the "old" policy)
    rewards   graders fill R per trajectory; row score = R - c_inv * (1 - valid)
    advantage compute_advantages(scores, uid, traj, agent, estimator) per row (drmas, grpo, ...)
    update    rows split by worker group; each group runs its PPO/GSPO epochs and mini-batches
    sync      each group copies its new weights into its rollout engine
    log       one JSON line in RUN/metrics.jsonl (+ TensorBoard when installed)
    save      every save_every steps: RUN/ckpt/step_K (atomic; see checkpoint.py)

Before step 1 an optional supervised warm start (``sft:``, toy only) runs and is saved as
``ckpt/step_0``, the "untrained" team RL starts from. ``resume=True`` restarts from the newest
complete checkpoint: weights, optimiser state, RNG, step and data cursor, and the metrics file is
cut back to that step, so a killed run continues exactly where its last checkpoint left it.

Worker groups run in this process (``use_ray=False``) or as Ray actors (``use_ray=True``); the loop
is the same code: both expose the async methods of :class:`~drmas_trainer.worker.WorkerGroup`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from drmas_bench.agents.team import TeamSpec, WorkerGroupSpec, team_from_dict
from drmas_bench.retrievers import open_retriever
from drmas_bench.runner import TeamRuntime, run_episodes
from drmas_bench.types import Sampling, Task, Trajectory, UserError
from drmas_bench.workflows.base import WorkflowSpec, check_workflow_options, derive_seed, get_workflow
from drmas_trainer import checkpoint as ckpt_io
from drmas_trainer import metric_names as N
from drmas_trainer.advantages import advantage_stats, compute_advantages, row_scores
from drmas_trainer.config import TrainConfig, WorkerGroupPlan, plan_worker_groups
from drmas_trainer.moment_factor import second_moment_factors
from drmas_trainer.trackers import check_tracker
from drmas_trainer.worker import LossSettings, Row

METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
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
    from drmas_bench.store import RunLock, inside, make_run_dir, write_error_log

    # everything that can be checked is checked before the run directory exists: names and settings,
    # workflow options, the training tasks, the retriever (a server that is down fails here)
    wf = get_workflow(cfg.workflow)
    plan_worker_groups(cfg, wf.agents)
    check_workflow_options(wf, cfg.workflow_options)
    check_tracker(cfg.tracker)
    tasks = load_train_tasks(cfg)
    retriever = _load_retriever(cfg, wf)
    ckpt_io.resolve_root(Path(out), cfg.ckpt_root)  # a URL whose fsspec backend is missing fails here
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


RUN_FILES = ("metrics.jsonl", "config.yaml", "sft.json", "workers.json", "error.log", "curves.png")
CKPT_CACHE = ".ckpt-cache"  # RUN/.ckpt-cache/step_K: the checkpoint a resume from a URL root downloaded
DRIVER_FILES = ("team.yaml", "trainer_state.json", "rng.pt")  # what the driver itself reads of a checkpoint


def clear_run(run: Path) -> None:
    """``--fresh``: remove what a previous run left in ``run`` (checkpoints, logs, TensorBoard)."""
    for p in ("ckpt", "tb", CKPT_CACHE) + RUN_FILES:
        q = run / p
        if q.is_dir() and not q.is_symlink():
            shutil.rmtree(q)
        elif q.exists() or q.is_symlink():
            q.unlink()


async def _train(cfg: TrainConfig, run: Path, tasks: list, retriever: Any, *, resume: bool, use_ray: bool | None,
                 progress: bool) -> dict[str, Any]:
    from tqdm import tqdm

    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    wf = get_workflow(cfg.workflow)
    plan = plan_worker_groups(cfg, wf.agents)
    n_steps = total_steps(cfg, len(tasks))
    if cfg.rollout.prompts_per_step > len(tasks):
        raise UserError(f"rollout.prompts_per_step ({cfg.rollout.prompts_per_step}) exceeds the {len(tasks)} training tasks")
    if (cfg.sft.steps or any(cfg.sft.agent_steps.values())) and cfg.workflow != "toy":
        raise UserError(f"the sft warm start generates toy examples only; set sft.steps: 0 for workflow {cfg.workflow!r}")

    # --- the run directory: config, latest checkpoint, metrics --------------------------------
    ckpt_root = ckpt_io.resolve_root(run, cfg.ckpt_root)
    found = ckpt_io.latest_checkpoint(ckpt_root)
    if found and not resume:
        raise UserError(f"{run if cfg.ckpt_root is None else ckpt_root} already holds checkpoints (latest step {found[0]}); "
                        f"pass --resume to continue "
                        f"it, --fresh to discard it, or choose another --out")
    check_run_config(run, cfg, resuming=found is not None)
    ckpt_io.clean_partial(ckpt_root)
    if use_ray is None:
        use_ray = torch.cuda.is_available() and _has_ray()
    local, resume_from = local_checkpoint(run, found[1], use_ray) if found else (None, None)
    state = ckpt_io.read_state(local) if local else {"step": 0, "cursor": 0, "skipped_total": 0}
    if local:
        ckpt_io.load_rng(local / "rng.pt")
        random.setstate(_tuplify(state["python_rng"]))
    metrics = MetricsLog(run, keep_until=state["step"], tracker=cfg.tracker, config=cfg.to_dict())

    # --- worker groups (in process or Ray actors), their engines --------------------------------
    ray_started = False
    if use_ray:
        from drmas_trainer.ray_workers import init_ray

        ray_started = init_ray(cfg.ray.num_cpus, cfg.ray.num_gpus, cfg.ray.address, cfg.ray.ship_code)
    workers: dict[str, Any] = {}
    try:
        # the start before step 1 takes a minute on a CPU: say what it is doing
        t_start = time.perf_counter()
        logger.info(f"[train] starting {len(plan)} worker group(s) ({', '.join(plan)}): loading models, optimisers "
                    f"and rollout engines{' as Ray actors' if use_ray else ''}"
                    + (f", from checkpoint step {found[0]}" if found else ""))
        await start_workers(cfg, plan, resume_from, use_ray, workers)
        infos = await asyncio.gather(*(w.info() for w in workers.values()))
        (run / "workers.json").write_text(json.dumps({"ray": bool(use_ray), "worker_groups": infos}, indent=1))
        runtime = TeamRuntime(rollout_team(cfg, plan, wf), workers, rollout_sampling(cfg))

        # --- step 0: the supervised warm start, saved as the untrained team ---------------------
        logger.info(f"[train] worker groups ready in {time.perf_counter() - t_start:.0f} s")
        if not found:
            if cfg.sft.steps or any(cfg.sft.agent_steps.values()):
                t_sft = time.perf_counter()
                logger.info(f"[train] supervised warm start (sft): {cfg.sft.steps} steps per agent"
                            + (" (" + ", ".join(f"{a}: {k}" for a, k in cfg.sft.agent_steps.items()) + ")"
                               if cfg.sft.agent_steps else "")
                            + f", batch {cfg.sft.batch_size}, on generated toy examples")
                sft_info = await warm_start(cfg, plan, workers)
                logger.info(f"[train] warm start done in {time.perf_counter() - t_sft:.0f} s")
                (run / "sft.json").write_text(json_line(sft_info, indent=1))
                failed = {n: i["sft_aborted"] for n, i in sft_info.items() if i.get("sft_aborted")}
                if failed:
                    raise UserError("the sft warm start stopped: " + "; ".join(f"worker group {n}: {why}" for n, why in failed.items())
                                    + f"; lower sft.lr or check the model (details in {run / 'sft.json'})")
            logger.info("[train] saving the team before RL as ckpt/step_0")
            await save_checkpoint(run, cfg, plan, workers, wf, step=0, cursor=0, skipped_total=0)
        logger.info(f"[train] {n_steps - int(state['step'])} RL step(s) to go, {cfg.rollout.prompts_per_step} prompts x "
                    f"{cfg.rollout.n} episodes each")

        # --- RL iterations ------------------------------------------------------------------------
        step0 = int(state["step"])
        cursor = int(state["cursor"])
        skipped_total = int(state["skipped_total"])
        loss = LossSettings(mode=cfg.algo.loss, clip_low=cfg.algo.clip_low, clip_high=cfg.algo.clip_high,
                            dual_clip=cfg.algo.dual_clip, agg=cfg.algo.agg, entropy_coef=cfg.algo.entropy_coef)
        bar = tqdm(total=n_steps, initial=step0, desc=f"train {cfg.algo.estimator}", unit="step",
                   disable=not progress, dynamic_ncols=True, file=sys.stderr)
        for step in range(step0 + 1, n_steps + 1):
            t_step = time.perf_counter()

            # 1. prompts: the next P tasks of the shuffled training set
            batch = next_prompts(tasks, cursor, cfg.rollout.prompts_per_step, cfg.data)
            cursor_before, cursor = cursor, cursor + len(batch)

            # 2. rollouts: n episodes per prompt through the harness workflow, with old log-probs
            t0 = time.perf_counter()
            trajs = await rollout(batch, cfg, runtime, wf, retriever)
            rollout_s = time.perf_counter() - t0

            # 3. rewards -> row scores -> advantages (per row; statistics from this batch only)
            rb = make_rows(trajs, batch, wf.agents)
            scores = row_scores(rb["reward"], rb["valid"], c_inv=cfg.algo.c_inv)
            adv = compute_advantages(scores, rb["uid"], rb["traj"], rb["agent"], estimator=cfg.algo.estimator,
                                     norm_by_std=cfg.algo.norm_by_std, eps=cfg.algo.eps,
                                     single_row=cfg.algo.single_row, std_floor=cfg.algo.std_floor,
                                     group_by_agent=cfg.algo.group_by_agent)
            for row, a in zip(rb["rows"], adv.tolist()):
                row.advantage = a

            # 4. update each worker group on its own rows
            t0 = time.perf_counter()
            names = list(plan)
            results = await asyncio.gather(*(
                workers[wg].update([r for r, g in zip(rb["rows"], rb["wg"]) if g == wg],
                                   epochs=cfg.algo.ppo_epochs, mini_batches=cfg.algo.mini_batches, loss=loss,
                                   seed=derive_seed(cfg.seed, "update", step, wg))
                for wg in names))
            updates = dict(zip(names, results))
            update_s = time.perf_counter() - t0

            # 5. sync the rollout engines with the new weights
            t0 = time.perf_counter()
            await asyncio.gather(*(workers[wg].sync_weights() for wg in names))
            sync_s = time.perf_counter() - t0

            # 6. log
            skipped = sum(u["skipped_steps"] for u in updates.values())
            skipped_total += skipped
            record = step_metrics(step, cursor_before, batch, trajs, rb, scores, adv, updates, wf.agents, plan)
            record.update({N.SKIPPED_STEPS: skipped, N.SKIPPED_STEPS_TOTAL: skipped_total,
                           N.TIME_GEN: rollout_s, N.TIME_UPDATE: update_s, N.TIME_SYNC: sync_s,
                           N.TIME_STEP: time.perf_counter() - t_step})
            metrics.write(record)
            bar.set_postfix(reward=f"{record[N.SCORE]:.3f}", refresh=False)
            bar.update(1)

            # 7. checkpoint
            if step == n_steps or (cfg.save_every and step % cfg.save_every == 0):
                await save_checkpoint(run, cfg, plan, workers, wf, step=step, cursor=cursor, skipped_total=skipped_total)
        bar.close()
        summary = summarize(run, n_steps)
        stuck = never_updated(read_metrics(run), list(plan))
        if stuck:
            raise UserError(f"no optimizer step was applied for worker group(s) {', '.join(stuck)}: every update was "
                            f"skipped as non-finite (loss or gradient) in {summary['steps']} step(s); the metrics are in "
                            f"{run / METRICS}; check the lr, algo.eps / algo.std_floor and the data")
        return summary
    finally:
        for w in workers.values():
            try:
                await w.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        metrics.close()
        if ray_started:
            from drmas_trainer.ray_workers import shutdown_ray

            shutdown_ray()


# ================================================================================= the pieces, in loop order


def load_train_tasks(cfg: TrainConfig) -> list[Task]:
    """The training prompts named by ``data.source``: ``toy`` (generated from ``data.seed``),
    ``benchmark:NAME[,NAME]`` (registry entries: the training sets ``dapo_math_17k`` and
    ``nq_hotpotqa_train``, or any benchmark; from ``data.data_dir`` / ``$DRMAS_DATA_DIR``, else the
    hub), or a ``.jsonl`` file of Task records (``id``, ``question``, ``answers``; ``benchmark``
    defaults to ``train``)."""
    d = cfg.data
    if d.source == "toy":
        from drmas_bench.tasks.toy import make_toy_tasks

        tasks = make_toy_tasks(d.size, seed=d.seed, max_operand=d.max_operand, benchmark="toy")
    elif d.source.startswith("benchmark:"):
        from drmas_bench.tasks import load_tasks

        names = [n.strip() for n in d.source.split(":", 1)[1].split(",") if n.strip()]
        if not names:
            raise UserError(f"data.source {d.source!r} names no registry entry (e.g. benchmark:dapo_math_17k)")
        tasks = []
        for name in names:
            tasks.extend(load_tasks(name, d.data_dir, limit=d.limit))
    else:
        tasks = _task_file(Path(d.source), d.source)
    if d.limit is not None:
        tasks = tasks[: d.limit]
    if not tasks:
        raise UserError(f"data.source {d.source!r} has no tasks")
    return tasks


def _task_file(p: Path, source: str) -> list[Task]:
    """Task records from a JSON-lines file; rows in another layout get a hint to the registry."""
    from drmas_bench.tasks.registry import iter_jsonl

    if not p.is_file():
        raise UserError(f"data.source {source!r}: not toy, benchmark:NAME, or an existing .jsonl file")
    tasks = []
    for lineno, rec in iter_jsonl(p):
        try:
            answers = rec["answers"] if isinstance(rec["answers"], list) else [rec["answers"]]
            tasks.append(Task(str(rec.get("id", lineno)), str(rec.get("benchmark", "train")), rec["question"],
                              [str(a) for a in answers], rec.get("meta", {})))
        except KeyError as e:
            hint = (" (rows in the verl/Search-R1 layout, with prompt and reward_model, load through the registry: "
                    "data.source: benchmark:dapo_math_17k or benchmark:nq_hotpotqa_train, with data.data_dir)"
                    if "reward_model" in rec else "")
            raise UserError(f"{p}:{lineno}: a training task needs {e.args[0]!r}{hint}") from None
    return tasks


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


async def rollout(batch: list[Task], cfg: TrainConfig, runtime: TeamRuntime, wf: WorkflowSpec,
                  retriever: Any = None) -> list[Trajectory]:
    """n graded episodes per prompt, in (prompt, sample) order, with token ids and log-probs."""
    got: list[Trajectory] = []
    await run_episodes(batch, cfg.rollout.n, runtime, wf, None, seed=cfg.seed, retriever=retriever,
                       workflow_options=cfg.workflow_options, concurrency=cfg.rollout.concurrency,
                       flush_every=len(batch) * cfg.rollout.n, progress=False, want_logprobs=True,
                       on_finished=got.extend)
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
            rows.append(Row(turn.agent, list(c.prompt_ids), list(c.token_ids), list(c.logprobs or []), 0.0))
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


# ================================================================================= set-up helpers


def _has_ray() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


def _load_retriever(cfg: TrainConfig, wf: WorkflowSpec) -> Any:
    if not wf.needs_retriever:
        return None
    if not cfg.retriever:
        raise UserError(f"workflow {wf.name} needs a retriever: set `retriever:` in the recipe (bm25:DIR | dense:DIR | URL)")
    return open_retriever(cfg.retriever, hint=" (the recipe's `retriever:`; set it with "
                          "--set retriever=bm25:DIR|dense:DIR|http://HOST:PORT)")


def rollout_sampling(cfg: TrainConfig) -> Sampling:
    r = cfg.rollout
    return Sampling(temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens)


def rollout_team(cfg: TrainConfig, plan: dict[str, WorkerGroupPlan], wf: WorkflowSpec) -> TeamSpec:
    """The TeamSpec the harness runs during training (agent -> worker group, per-agent sampling)."""
    from drmas_trainer.config import agent_config

    return TeamSpec(
        workflow=wf.name,
        agents={a: g.name for g in plan.values() for a in g.agents},
        worker_groups={g.name: WorkerGroupSpec(g.name, g.settings.model, engine=g.settings.engine) for g in plan.values()},
        agent_sampling={a: dict(agent_config(cfg, a).sampling) for g in plan.values() for a in g.agents
                        if agent_config(cfg, a).sampling},
        workflow_options=dict(cfg.workflow_options),
    )


def local_checkpoint(run: Path, ckpt: Path | str, use_ray: bool) -> tuple[Path, Path | str]:
    """Checkpoint ``ckpt`` to resume: (the local folder the driver reads its files from, what the
    worker groups load from). A local folder is both. A URL (ckpt_store) is downloaded into
    ``RUN/.ckpt-cache/step_K``, whole for in-process groups; with Ray actors only the driver's files,
    and each actor downloads its own part on its node (the URL is what they get)."""
    if not ckpt_io.is_url(ckpt):
        return Path(ckpt), Path(ckpt)
    cache = run / CKPT_CACHE
    shutil.rmtree(cache, ignore_errors=True)  # one downloaded checkpoint at a time
    local = ckpt_io.store.fetch(ckpt, cache / ckpt.rstrip("/").rsplit("/", 1)[-1], DRIVER_FILES if use_ray else None)
    return local, ckpt if use_ray else local


async def start_workers(cfg: TrainConfig, plan: dict[str, WorkerGroupPlan], ckpt: Path | str | None,
                        use_ray: bool, workers: dict[str, Any]) -> dict[str, Any]:
    """One worker group per plan entry, from the checkpoint's folders when resuming (a local folder,
    or a checkpoint URL each group downloads its part of); engines started. Fills ``workers`` as it
    goes, so the caller can close what was started if a later one fails."""
    from drmas_bench.models import resolve_model

    if use_ray:
        from drmas_trainer.ray_workers import check_worker_demand

        check_worker_demand(cfg.ray, plan)  # a demand the cluster cannot meet: one line, before any actor
    for name, g in plan.items():
        if ckpt is not None:
            path = _part(ckpt, "models", name)
        elif use_ray:  # resolved inside the actor, on the node that loads it (aliases prepared there)
            from drmas_bench.pool.cluster import driver_model_name

            path = driver_model_name(g.settings.model)
        else:
            got = resolve_model(g.settings.model)
            path = str(getattr(got, "path", got))
        kwargs = dict(device=cfg.device, seed=derive_seed(cfg.seed, "wg", name), torch_threads=cfg.torch_threads)
        if use_ray:
            from drmas_trainer.ray_workers import RayWorkerHandle

            workers[name] = RayWorkerHandle.spawn(name, g.agents, g.settings, path, gpus=cfg.ray.gpus_per_worker, **kwargs)
        else:
            from drmas_trainer.worker import WorkerGroup

            workers[name] = WorkerGroup(name, g.agents, g.settings, path, **kwargs)
    if use_ray:  # placed within ray.timeout_s each (else a one-line error), then the groups are built
        await asyncio.gather(*(w.ready(cfg.ray.timeout_s) for w in workers.values()))
    if ckpt is not None:
        await asyncio.gather(*(w.load_optimizer(_part(ckpt, "optim", f"{n}.pt")) for n, w in workers.items()))
    await asyncio.gather(*(w.start_engine() for w in workers.values()))
    return workers


def _part(ckpt: Path | str, *parts: str) -> str:
    """A checkpoint entry as a worker group is given it: an absolute local path, or a URL."""
    got = ckpt_io.member(ckpt, *parts)
    return got if isinstance(got, str) else str(got)


async def warm_start(cfg: TrainConfig, plan: dict[str, WorkerGroupPlan], workers: dict[str, Any]) -> dict[str, Any]:
    """The ``sft:`` stage: each worker group imitates generated toy examples of its agents, then
    its engine gets the new weights."""
    from drmas_trainer.sft import toy_sft_examples

    s = cfg.sft
    jobs, names = [], []
    for name, g in plan.items():
        per_agent = {a: s.agent_steps.get(a, s.steps) for a in g.agents}
        steps = sum(per_agent.values())  # a shared group does its agents' steps, batches mixed in proportion
        if steps <= 0:
            continue
        names.append(name)
        examples = []
        for a, k in per_agent.items():
            examples += toy_sft_examples([a], k * s.batch_size, seed=derive_seed(s.seed, "sft", a),
                                         solver_accuracy=s.solver_accuracy, checker_accuracy=s.checker_accuracy,
                                         max_operand=s.max_operand, retry_share=s.retry_share)
        jobs.append(workers[name].sft(examples, steps=steps, lr=s.lr, batch_size=s.batch_size,
                                      seed=derive_seed(s.seed, "sft-order", name)))
    results = await asyncio.gather(*jobs)
    await asyncio.gather(*(workers[n].sync_weights() for n in names))
    return dict(zip(names, results))


# ================================================================================= checkpoints


def checkpoint_team(cfg: TrainConfig, plan: dict[str, WorkerGroupPlan], wf: WorkflowSpec, step: int) -> dict[str, Any]:
    """The checkpoint's ``team.yaml`` (what ``team_from_dict`` reads; model folders relative to it).

    Sampling carries only ``max_new_tokens`` (the budget the team was trained with); temperature
    and top-p stay with the evaluator (training explores at its own temperature). Per-agent sampling
    overrides of the recipe are kept. For the paper's workflows it also records the prompt templates
    (inline), the prompt limit and the retriever (kind, index identity) the rollouts used, so that
    eval of the checkpoint uses the same protocol."""
    from drmas_trainer.config import agent_config

    agents: dict[str, Any] = {}
    for g in plan.values():
        for a in g.agents:
            samp = agent_config(cfg, a).sampling
            agents[a] = {"wg": g.name, "sampling": dict(samp)} if samp else g.name
    from drmas_bench.workflows import protocol as P

    protocol = {}
    if P.has_templates(wf.name):  # the prompts and prompt limit the rollouts used (REFERENCE §2b)
        limit, side = P.ProtocolOptions().resolve(wf.name)
        protocol = {"prompts": P.default_templates(wf.name).to_dict(),
                    "protocol": {"max_prompt_tokens": limit or 0, "truncate": side}}
    if cfg.retriever:
        protocol["retriever"] = P.retriever_record(cfg.retriever)
    return {
        "workflow": wf.name,
        "agents": agents,
        "worker_groups": {g.name: {"model": f"models/{g.name}", "engine": g.settings.engine} for g in plan.values()},
        "sampling": {"max_new_tokens": cfg.rollout.max_new_tokens},
        "workflow_options": dict(cfg.workflow_options),
        **protocol,
        "trained": {"recipe": cfg.recipe, "estimator": cfg.algo.estimator, **_group_index(cfg), "loss": cfg.algo.loss,
                    "step": step,
                    "seed": cfg.seed, "shared": cfg.shared,
                    "base_models": {g.name: g.settings.model for g in plan.values()}},
    }


async def save_checkpoint(run: Path, cfg: TrainConfig, plan: dict[str, WorkerGroupPlan], workers: dict[str, Any],
                          wf: WorkflowSpec, *, step: int, cursor: int, skipped_total: int) -> Path:
    """Write ``<ckpt root>/step_<step>`` atomically (temp dir, marker, rename, ``latest``), then prune.
    The marker is written only when every worker group's files are in the root as the driver sees
    them (groups on other nodes write from there): else a one-line error, the previous checkpoint kept.
    A URL root (ckpt_store): the groups upload their parts, the driver uploads its files, then commits."""
    root = ckpt_io.resolve_root(run, cfg.ckpt_root)
    tmp = ckpt_io.begin(root, step)
    await asyncio.gather(*(w.save(str(ckpt_io.member(tmp, "models", n)), str(ckpt_io.member(tmp, "optim", f"{n}.pt")))
                           for n, w in workers.items()))
    missing = ckpt_io.missing_groups(tmp, workers)
    if missing and ckpt_io.is_url(root):
        raise UserError(f"checkpoint step {step}: the files of worker group(s) {', '.join(missing)} are not in {root} "
                        f"as fsspec lists it (an upload failed or went elsewhere?); the previous checkpoint is kept")
    if missing:
        raise UserError(f"checkpoint step {step}: the files of worker group(s) {', '.join(missing)} are not in {root} "
                        f"as this driver sees it (written on another node's local disk?); set ckpt_root to a folder "
                        f"every Ray node and the driver share (docs/scaling.md); the previous checkpoint is kept")
    team = checkpoint_team(cfg, plan, wf, step)
    with ckpt_io.driver_files(tmp) as here:  # tmp itself, or a local folder uploaded into the URL
        team_from_dict(team, wf.agents, wf.name, where="checkpoint team.yaml", base_dir=here)  # it must load
        (here / "team.yaml").write_text(yaml.safe_dump(team, sort_keys=False))
        ckpt_io.write_json(here / "trainer_state.json", {
            "step": step, "cursor": cursor, "skipped_total": skipped_total, "python_rng": random.getstate(),
            "estimator": cfg.algo.estimator, **_group_index(cfg), "recipe": cfg.recipe, "time": time.time(),
        })
        ckpt_io.save_rng(here / "rng.pt")
    final = ckpt_io.commit(tmp, root, step)
    ckpt_io.prune(root, cfg.keep_last)
    return final


def _group_index(cfg: TrainConfig) -> dict[str, bool]:
    """``{"group_by_agent": ...}`` where the estimator is one of the reference's names (its meaning
    depends on it), else nothing: the estimator's name alone says what a checkpoint was trained with."""
    return {} if cfg.algo.group_by_agent is None else {"group_by_agent": cfg.algo.group_by_agent}


def check_run_config(run: Path, cfg: TrainConfig, resuming: bool) -> None:
    """Write ``run/config.yaml``; when resuming, the stored one must match (``steps`` may grow)."""
    path = run / CONFIG
    new = cfg.to_dict()
    if resuming and path.is_file():
        old = yaml.safe_load(path.read_text()) or {}
        # steps may grow; Ray placement (address, GPUs per worker) may change between attempts
        diff = sorted(k for k in set(old) | set(new) if k not in ("steps", "epochs", "ray") and old.get(k) != new.get(k))
        if diff:
            raise UserError(f"{run} was trained with another configuration (differs in: {', '.join(diff)}); "
                            f"resume with the same recipe and flags, or use another --out")
    run.mkdir(parents=True, exist_ok=True)
    from drmas_bench.store import atomic_write

    atomic_write(path, yaml.safe_dump(new, sort_keys=False))


# ================================================================================= metrics


class MetricsLog:
    """``RUN/metrics.jsonl``: one JSON object per step, flushed and fsynced; plus the run's tracker
    (drmas_trainer.trackers: none | tensorboard | wandb).

    ``keep_until``: on (re)start, records of later steps (written after the checkpoint being
    resumed) are cut off, so the file always describes one consistent run."""

    def __init__(self, run: Path, keep_until: int = 0, tracker: str = "none",
                 config: dict[str, Any] | None = None) -> None:
        from drmas_bench.store import atomic_write
        from drmas_trainer.trackers import make_tracker

        run.mkdir(parents=True, exist_ok=True)
        self.path = run / METRICS
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= keep_until] if self.path.exists() else []
        atomic_write(self.path, "".join(json_line(r) + "\n" for r in kept))
        self.tracker = make_tracker(tracker, run, keep_until=keep_until, config=config)
        self.f = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.f.write(json_line(record) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())
        self.tracker.log(record)

    def close(self) -> None:
        self.f.close()
        self.tracker.close()


def finite_or_none(x: Any) -> Any:
    """``x`` with every non-finite float (NaN, inf) replaced by None, recursively; other values as
    they are (numpy / torch scalars become floats), so the result is strict JSON."""
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    try:
        f = float(x)
    except (TypeError, ValueError):
        return x
    return f if math.isfinite(f) else None


def json_line(record: Any, indent: int | None = None) -> str:
    """Strict JSON (``allow_nan=False``): non-finite floats are written as null, never as ``NaN``."""
    return json.dumps(finite_or_none(record), allow_nan=False, indent=indent)


def never_updated(records: list[dict[str, Any]], groups: list[str]) -> list[str]:
    """The worker groups that skipped at least one update but applied none over ``records``."""
    out = []
    for g in groups:
        applied = sum(r.get(N.wg(g, N.OPTIMIZER_STEPS)) or 0 for r in records)
        skipped = sum(r.get(N.wg(g, N.SKIPPED_STEPS)) or 0 for r in records)
        if applied == 0 and skipped > 0:
            out.append(g)
    return out


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics file (a run directory or the file); a torn last line is ignored."""
    p = Path(path)
    if p.is_dir():
        p = p / METRICS
    if not p.is_file():
        raise UserError(f"no metrics file at {p}")
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def step_metrics(step: int, cursor: int, batch: list[Task], trajs: list[Trajectory], rb: dict[str, Any],
                 scores: torch.Tensor, adv: torch.Tensor, updates: dict[str, dict[str, Any]],
                 agents: tuple[str, ...], plan: dict[str, WorkerGroupPlan]) -> dict[str, Any]:
    """The step's JSON record: verl-style names, per agent under ``agent/<a>/``, per worker group
    under ``wg/<g>/`` (drmas_trainer.metric_names)."""
    rec: dict[str, Any] = {
        "step": step,
        "data_cursor": cursor,
        "tasks": [t.meta.get("source_id", t.id) for t in batch],
        N.SCORE: _mean([float(t.reward) for t in trajs]),
        N.ACC: _mean([1.0 if t.correct else 0.0 for t in trajs]),
        N.REWARDS: float(scores.mean()),
        N.NUM_TURNS: _mean([len(t.turns) for t in trajs]),
        N.RESPONSE_LENGTH: _mean([len(r.response_ids) for r in rb["rows"]]),
    }
    stats = advantage_stats(adv, rb["agent"])
    factors = second_moment_factors(scores, rb["uid"], rb["agent"], len(agents))
    for k, a in enumerate(agents):
        mine = [i for i, r in enumerate(rb["rows"]) if r.agent == a]
        rec[N.agent(a, N.CALLS)] = len(mine) / max(1, len(trajs))
        rec[N.agent(a, N.VALID)] = _mean([1.0 if rb["valid"][i] else 0.0 for i in mine])
        rec[N.agent(a, N.RESPONSE_LENGTH)] = _mean([len(rb["rows"][i].response_ids) for i in mine])
        rec[N.agent(a, N.REWARDS)] = _mean([float(scores[i]) for i in mine])
        s = stats.get(k)
        rec[N.agent(a, N.ADV_MEAN)] = s["mean"] if s else float("nan")
        rec[N.agent(a, N.ADV_STD)] = s["std"] if s else float("nan")
        rec[N.agent(a, N.ADV_ABSMAX)] = s["abs_max"] if s else float("nan")
        rec[N.agent(a, N.MOMENT_FACTOR)], rec[N.agent(a, N.MOMENT_FACTOR_GROUPS)] = factors[k]
    for name, u in updates.items():
        for a, v in u["agent_grad_norm"].items():
            rec[N.agent(a, N.GRAD_NORM)] = v
            rec[N.agent(a, N.GRAD_NORM_MAX)] = u["agent_grad_norm_max"][a]
        for key, out in N.UPDATE_KEYS.items():
            if key in u:
                rec[N.wg(name, out)] = u[key]
    for key in N.AVERAGED:
        vals = [u[key] for u in updates.values() if key in u and isinstance(u[key], float) and math.isfinite(u[key])]
        rec[N.UPDATE_KEYS[key]] = _mean(vals)
    return rec


def summarize(run: Path, n_steps: int) -> dict[str, Any]:
    """First/last-5 reward means, skipped steps and per-agent grad-norm spread of a finished run."""
    recs = [r for r in read_metrics(run) if N.SCORE in r]
    rewards = [r[N.SCORE] if isinstance(r[N.SCORE], (int, float)) else float("nan") for r in recs]
    k = min(5, len(rewards))
    out: dict[str, Any] = {"run": str(run), "steps": len(recs),
                           "reward_first5": _mean(rewards[:k]), "reward_last5": _mean(rewards[-k:]),
                           "skipped_steps": sum(r.get(N.SKIPPED_STEPS) or 0 for r in recs),
                           "time_s": sum(r.get(N.TIME_STEP) or 0.0 for r in recs)}
    out["grad_norm_spread"] = grad_norm_spread(recs)
    return out


def grad_norm_spread(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per agent: max, median and max/median of ``agent/<a>/actor/grad_norm`` over the steps."""
    out: dict[str, dict[str, float]] = {}
    for a in N.agents_with({k for r in records for k in r}, N.GRAD_NORM):
        k = N.agent(a, N.GRAD_NORM)
        vals = [r[k] for r in records if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])]
        if vals:
            med = statistics.median(vals)
            out[a] = {"max": max(vals), "median": med, "spread": max(vals) / med if med > 0 else float("inf")}
    return out
