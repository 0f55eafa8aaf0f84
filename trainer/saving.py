"""The run's side of a checkpoint: what the trainer puts in one (``team.yaml`` that eval loads,
``trainer_state.json``, the RNG, each worker group's model and optimiser) and how a resume gets a
local copy back. The folder layout, the atomic commit and URL roots are ``drmas_trainer.checkpoint``'s.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from drmas_bench.agents.team import team_from_dict
from drmas_bench.engines.carried import carried_options
from drmas_bench.engines.hosting import fit_options
from drmas_bench.retrievers import retriever_record
from drmas_bench.types import UserError
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.base import WorkflowSpec
from drmas_trainer import checkpoint as ckpt_io
from drmas_trainer.config.groups import WorkerGroupPlan, agent_config
from drmas_trainer.config.train import TrainConfig
from drmas_trainer.runlog import CKPT_CACHE, finite_or_none

DRIVER_FILES = ("team.yaml", "trainer_state.json", "rng.pt")  # what the driver itself reads of a checkpoint


def local_checkpoint(run: Path, ckpt: Path | str, use_ray: bool) -> tuple[Path, Path | str]:
    """Checkpoint ``ckpt`` to resume: (the local folder the driver reads its files from, what the
    worker groups load from). A local folder is both. A URL (drmas_bench.checkpoints.layout) is downloaded into
    ``RUN/.ckpt-cache/step_K``, whole for in-process groups; with Ray actors only the driver's files,
    and each actor downloads its own part on its node (the URL is what they get)."""
    if not ckpt_io.is_url(ckpt):
        return Path(ckpt), Path(ckpt)
    cache = run / CKPT_CACHE
    shutil.rmtree(cache, ignore_errors=True)  # one downloaded checkpoint at a time
    local = ckpt_io.fetch(ckpt, cache / ckpt.rstrip("/").rsplit("/", 1)[-1], DRIVER_FILES if use_ray else None)
    return local, ckpt if use_ray else local


def checkpoint_part(ckpt: Path | str, *parts: str) -> str:
    """A checkpoint entry as a worker group is given it: an absolute local path, or a URL."""
    got = ckpt_io.member(ckpt, *parts)
    return got if isinstance(got, str) else str(got)


def checkpoint_team(cfg: TrainConfig, plan: dict[str, WorkerGroupPlan], wf: WorkflowSpec, step: int) -> dict[str, Any]:
    """The checkpoint's ``team.yaml`` (what ``team_from_dict`` reads; model folders relative to it).

    Sampling carries only ``max_new_tokens`` (the budget the team was trained with); temperature
    and top-p stay with the evaluator (training explores at its own temperature). Per-agent sampling
    overrides of the recipe are kept. For the paper's workflows it also records the prompt templates
    (inline), the prompt limit and the retriever (kind, index identity) the rollouts used, so that
    eval of the checkpoint uses the same protocol. Each worker group carries the engine options that
    shape its numbers (:func:`engine_settings`), so eval runs the engines as the rollouts and the
    validations did."""

    agents: dict[str, Any] = {}
    for g in plan.values():
        for a in g.agents:
            samp = agent_config(cfg, a).sampling
            agents[a] = {"wg": g.name, "sampling": dict(samp)} if samp else g.name

    protocol = {}
    if proto.has_templates(wf.name):  # the prompts and prompt limit the rollouts used (REFERENCE §2b)
        limit, side = proto.ProtocolOptions().resolve(wf.name)
        protocol = {"prompts": proto.default_templates(wf.name).to_dict(),
                    "protocol": {"max_prompt_tokens": limit or 0, "truncate": side}}
    if cfg.retriever:
        protocol["retriever"] = retriever_record(cfg.retriever)
    return {
        "workflow": wf.name,
        "agents": agents,
        "worker_groups": {g.name: {"model": f"models/{g.name}", "engine": g.settings.engine,
                                   "options": engine_settings(g)} for g in plan.values()},
        "sampling": {"max_new_tokens": cfg.rollout.max_new_tokens},
        "workflow_options": dict(cfg.workflow_options),
        **protocol,
        "trained": {"recipe": cfg.recipe, "estimator": cfg.algo.estimator, **_group_index(cfg), "loss": cfg.algo.loss,
                    "step": step,
                    "seed": cfg.seed, "shared": cfg.shared, **({"shared_base": True} if cfg.shared_base else {}),
                    "base_models": {g.name: g.settings.model for g in plan.values()}},
    }


async def save_checkpoint(run: Path, cfg: TrainConfig, plan: dict[str, WorkerGroupPlan], workers: dict[str, Any],
                          wf: WorkflowSpec, *, step: int, cursor: int, skipped_total: int,
                          keep: tuple[int, ...] = (), record: dict[str, Any] | None = None) -> Path:
    """Write ``<ckpt root>/step_<step>`` atomically (temp dir, marker, rename, ``latest``), then prune.
    The marker is written only when every worker group's files are in the root as the driver sees
    them (groups on other nodes write from there): else a one-line error, the previous checkpoint kept.
    A URL root (drmas_bench.checkpoints.layout): the groups upload their parts, the driver uploads its files, then commits.
    ``keep``: steps pruning must spare besides step_0 (``val.keep_best``'s checkpoint). ``record``: the
    step's metrics as they stand before the save, kept in ``trainer_state.json`` so that a resume can
    log them where the run was stopped between the commit and its ``metrics.jsonl`` line."""
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
            **({"record": finite_or_none(record)} if record is not None else {}),
        })
        ckpt_io.save_rng(here / "rng.pt")
    final = ckpt_io.commit(tmp, root, step)
    ckpt_io.prune(root, cfg.keep_last, keep=(0, *keep))  # step_0 and ``keep`` (the best validation's) stay
    return final


def engine_settings(g: WorkerGroupPlan) -> dict[str, Any]:
    """The options of group ``g``'s rollout engine that a checkpoint carries (dtype, batch invariance,
    ...: ``drmas_bench.engines.carried``), from what the group makes its engine with: the trainer's
    compute dtype, which the recipe's own ``engine_options`` override (``WorkerGroup``'s fit_options)."""
    s = g.settings
    return carried_options(s.engine, fit_options(s.engine, {"dtype": s.dtype}, s.engine_options))


def _group_index(cfg: TrainConfig) -> dict[str, bool]:
    """``{"group_by_agent": ...}`` where the estimator is one of the reference's names (its meaning
    depends on it), else nothing: the estimator's name alone says what a checkpoint was trained with."""
    return {} if cfg.algo.group_by_agent is None else {"group_by_agent": cfg.algo.group_by_agent}
