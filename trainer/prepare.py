"""What the trainer sets up before its first RL step, checked before the run directory is touched
where it can be: the training tasks, the workflow options, the retriever the rollouts use, the
team the harness runs during training, the worker groups (in process or Ray actors, from a base
model or a checkpoint), and the optional supervised warm start.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from drmas_bench.agents.team import TeamSpec, WorkerGroupSpec
from drmas_bench.benchmarks import get_benchmark, load_tasks
from drmas_bench.benchmarks.catalog import iter_jsonl, resolve_data_dir
from drmas_bench.models import resolve_model
from drmas_bench.pool.cluster import driver_model_name
from drmas_bench.retrievers import default_spec, open_retriever
from drmas_bench.types import Sampling, SFTExample, Task, UserError
from drmas_bench.workflows import get_workflow
from drmas_bench.workflows.base import WorkflowSpec, derive_seed
from drmas_trainer.config.groups import WorkerGroupPlan, agent_config
from drmas_trainer.config.train import TrainConfig
from drmas_trainer.ray_workers import RayWorkerHandle, check_worker_demand
from drmas_trainer.saving import checkpoint_part


def load_train_tasks(cfg: TrainConfig) -> list[Task]:
    """The training prompts named by ``data.source``: ``toy`` (generated from ``data.seed``),
    ``benchmark:NAME[,NAME]`` (registry entries: the training sets ``dapo_math_17k`` and
    ``nq_hotpotqa_train``, or any benchmark; from ``data.data_dir`` / ``$DRMAS_DATA_DIR``, else the
    hub), or a ``.jsonl`` file of Task records (``id``, ``question``, ``answers``; ``benchmark``
    defaults to ``train``)."""
    d = cfg.data
    if d.source == "toy":
        generate = get_benchmark("toy").generate  # the toy suite's generator, with the recipe's size and seed
        assert generate is not None
        tasks = generate(d.size, seed=d.seed, max_operand=d.max_operand, benchmark="toy")
    elif d.source.startswith("benchmark:"):
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

    if not p.is_file():
        raise UserError(f"data.source {source!r}: not toy, benchmark:NAME, or an existing .jsonl file")
    tasks = []
    first_at: dict[tuple[str, str], int] = {}  # (benchmark, id) -> line: a repeated id would merge two prompts
    for lineno, rec in iter_jsonl(p):
        try:
            answers = rec["answers"] if isinstance(rec["answers"], list) else [rec["answers"]]
            t = Task(str(rec.get("id", lineno)), str(rec.get("benchmark", "train")), rec["question"],
                     [str(a) for a in answers], rec.get("meta", {}))
        except KeyError as e:
            hint = (" (rows in the verl/Search-R1 layout, with prompt and reward_model, load through the registry: "
                    "data.source: benchmark:dapo_math_17k or benchmark:nq_hotpotqa_train, with data.data_dir)"
                    if "reward_model" in rec else "")
            raise UserError(f"{p}:{lineno}: a training task needs {e.args[0]!r}{hint}") from None
        key = (t.benchmark, t.id)
        if key in first_at:
            raise UserError(f"{p}:{lineno}: duplicate id {t.id!r} (already at line {first_at[key]}); task ids must be "
                            "unique within a training set (their samples would merge into one GRPO group)")
        first_at[key] = lineno
        tasks.append(t)
    return tasks


def rollout_retriever(cfg: TrainConfig, wf: WorkflowSpec) -> Any:
    if not wf.needs_retriever:
        return None
    if not cfg.retriever:  # as eval: the embedded BM25 index of the data dir's mini corpus, else say what to set

        try:
            spec = default_spec(resolve_data_dir(cfg.data.data_dir))
        except UserError:
            raise UserError(f"workflow {wf.name} needs a retriever: set `retriever:` in the recipe (bm25:DIR | dense:DIR | URL), "
                            "or data.data_dir / DRMAS_DATA_DIR to a data dir with corpus/mini_corpus.jsonl") from None
        return open_retriever(spec)
    return open_retriever(cfg.retriever, hint=" (the recipe's `retriever:`; set it with "
                          "--set retriever=bm25:DIR|dense:DIR|http://HOST:PORT)")


def rollout_sampling(cfg: TrainConfig) -> Sampling:
    r = cfg.rollout
    return Sampling(temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens)


def rollout_team(cfg: TrainConfig, plan: dict[str, WorkerGroupPlan], wf: WorkflowSpec) -> TeamSpec:
    """The TeamSpec the harness runs during training (agent -> worker group, per-agent sampling)."""

    return TeamSpec(
        workflow=wf.name,
        agents={a: g.name for g in plan.values() for a in g.agents},
        worker_groups={g.name: WorkerGroupSpec(g.name, g.settings.model, engine=g.settings.engine) for g in plan.values()},
        agent_sampling={a: dict(agent_config(cfg, a).sampling) for g in plan.values() for a in g.agents
                        if agent_config(cfg, a).sampling},
        workflow_options=dict(cfg.workflow_options),
    )


async def start_workers(cfg: TrainConfig, plan: dict[str, WorkerGroupPlan], ckpt: Path | str | None,
                        use_ray: bool, workers: dict[str, Any]) -> dict[str, Any]:
    """One worker group per plan entry, from the checkpoint's folders when resuming (a local folder,
    or a checkpoint URL each group downloads its part of); engines started. Fills ``workers`` as it
    goes, so the caller can close what was started if a later one fails."""

    sharded = cfg.fsdp.ranks > 1  # FSDP2 groups of fsdp.ranks Ray actors each (drmas_trainer.fsdp.ray_group)
    if sharded:
        from drmas_trainer.fsdp.ray_group import check_sharded

        check_sharded(cfg, use_ray)
    elif use_ray:
        check_worker_demand(cfg.ray, plan)  # a demand the cluster cannot meet: one line, before any actor
    paths, options = {}, {}
    for name, g in plan.items():
        if ckpt is not None:
            path = checkpoint_part(ckpt, "models", name)
        elif use_ray:  # resolved inside the actor, on the node that loads it (aliases prepared there)
            path = driver_model_name(g.settings.model)
        else:
            got = resolve_model(g.settings.model)
            path = str(getattr(got, "path", got))
        kwargs = dict(device=cfg.device, seed=derive_seed(cfg.seed, "wg", name), torch_threads=cfg.torch_threads)
        if g.lora:  # per-agent (shared_base) or per-group LoRA adapters over the frozen base
            kwargs.update(adapters=dict(g.adapters), adapter_of=dict(g.adapter_of))
        if sharded:
            paths[name], options[name] = path, kwargs
        elif use_ray:
            workers[name] = RayWorkerHandle.spawn(name, g.agents, g.settings, path, gpus=cfg.ray.gpus_per_worker, **kwargs)
        else:
            from drmas_trainer.worker import WorkerGroup

            workers[name] = WorkerGroup(name, g.agents, g.settings, path, **kwargs)
    if sharded:
        from drmas_trainer.fsdp.ray_group import spawn_sharded

        workers.update(spawn_sharded(cfg, plan, paths, options))
    if use_ray:  # placed within ray.timeout_s each (else a one-line error), then the groups are built
        await asyncio.gather(*(w.ready(cfg.ray.timeout_s) for w in workers.values()))
    if ckpt is not None:
        await asyncio.gather(*(w.load_optimizer(checkpoint_part(ckpt, "optim", f"{n}.pt")) for n, w in workers.items()))
    await asyncio.gather(*(w.start_engine() for w in workers.values()))
    return workers


async def warm_start(cfg: TrainConfig, plan: dict[str, WorkerGroupPlan], workers: dict[str, Any]) -> dict[str, Any]:
    """The ``sft:`` stage: each worker group imitates generated examples of its agents (the
    workflow's declared maker, `WorkflowSpec.sft`), then its engine gets the new weights."""

    s = cfg.sft
    make_examples = get_workflow(cfg.workflow).sft  # a workflow without one is refused before any model loads (trainer.py)
    jobs, names = [], []
    for name, g in plan.items():
        per_agent = {a: s.agent_steps.get(a, s.steps) for a in g.agents}
        steps = sum(per_agent.values())  # a shared group does its agents' steps, batches mixed in proportion
        if steps <= 0:
            continue
        names.append(name)
        examples: list[SFTExample] = []
        for a, k in per_agent.items():
            examples += make_examples([a], k * s.batch_size, seed=derive_seed(s.seed, "sft", a),
                                      solver_accuracy=s.solver_accuracy, checker_accuracy=s.checker_accuracy,
                                      **(s.model_extra or {}),  # the workflow's own options (toy_fixer's fixer_accuracy)
                                      max_operand=s.max_operand, retry_share=s.retry_share,
                                      data_dir=cfg.data.data_dir, retriever=cfg.retriever,  # what search_route's maker reads
                                      workflow_options=cfg.workflow_options)
        jobs.append(workers[name].sft(examples, steps=steps, lr=s.lr, batch_size=s.batch_size,
                                      seed=derive_seed(s.seed, "sft-order", name)))
    results = await asyncio.gather(*jobs)
    await asyncio.gather(*(workers[n].sync_weights() for n in names))
    return dict(zip(names, results))
