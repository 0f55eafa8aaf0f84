"""Validation during training, as the reference validates (``trainer.test_freq``,
``trainer.val_before_train``), through the harness's own evaluation.

    v = Validator(cfg, run, plan, wf, workers, retriever)
    if v.due(step, n_steps):
        record.update(await v.validate(step))      # RUN/val/step_N/ + the step log's val/... names

Each validation is ``drmas_bench.api.run_on_engines``: the plan of ``drmas-bench eval`` (the team the
checkpoint's ``team.yaml`` describes, ``val.benchmarks``, ``val.n``, eval's sampling and seed) run
on the trainer's own engines as they stand after the weight sync: no reload, no copy of weights,
no second process. Its folder ``RUN/val/step_N`` is a run like any other (``view``, ``leaderboard``,
``compare`` open it), and its records are those of ``drmas-bench eval --model RUN/ckpt/step_N --seed
val.seed`` on the same questions (the records' ``run`` stamp aside: it names where the weights came
from). The names logged (:func:`val_metrics`) are the reference's ``val/...`` keys, verl's
``val-core/<source>/reward/mean@n`` and ours; docs/trainer.md ("Validation") maps each to its meaning.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

import yaml

from drmas_bench.api import EvalConfig, plan, prepare, run_on_engines
from drmas_bench.files import atomic_write
from drmas_bench.records import RecordView
from drmas_bench.report.runs import load_run
from drmas_bench.types import UserError
from drmas_bench.workflows.base import WorkflowSpec
from drmas_trainer import checkpoint as ckpt_io
from drmas_trainer import metric_names
from drmas_trainer.config.groups import WorkerGroupPlan
from drmas_trainer.config.train import TrainConfig
from drmas_trainer.saving import checkpoint_team

VAL_DIR = "val"  # RUN/val/step_N: one run folder per validation
TEAM_FILE = "team.yaml"  # RUN/val/team.yaml: the team each validation plans with
PREFIX = "val/"  # every validation metric's prefix (the reference's)
TIME_KEY = metric_names.TIME_TESTING  # verl's timer name for its validation
CALLS_KEY = "val/calls"
RUN_KEY = "val/run"


def step_folder(step: int) -> str:
    """The validation run folder of ``step``, relative to the training run: ``val/step_N``."""
    return f"{VAL_DIR}/step_{step}"


def due(val: Any, step: int, n_steps: int) -> bool:
    """Whether step ``step`` (1..n_steps) is validated after its update: every ``val.every`` steps
    and at the last step (verl: ``test_freq > 0 and (last step or step % test_freq == 0)``)."""
    return bool(val.every) and (step % val.every == 0 or step == n_steps)


def val_team(cfg: TrainConfig, plan: dict[str, WorkerGroupPlan], wf: WorkflowSpec) -> dict[str, Any]:
    """The team a validation evaluates: the checkpoint's ``team.yaml`` (workflow, agents, prompts,
    protocol, retriever, per-agent sampling, max new tokens), with each worker group's model the one
    it was started from (the plan resolves and checks it; the weights come from the engines)."""
    team = checkpoint_team(cfg, plan, wf, step=0)
    for g in plan.values():
        team["worker_groups"][g.name]["model"] = str(g.settings.model)
    team.pop("trained", None)  # not a checkpoint
    return team


def eval_config(cfg: TrainConfig, run: Path, step: int) -> EvalConfig:
    """The EvalConfig of the validation at ``step`` (``drmas-bench eval`` flags with the same meaning)."""
    v = cfg.val
    return EvalConfig(team=str(run / VAL_DIR / TEAM_FILE), benchmarks=list(v.benchmarks or []),
                      data_dir=v.data or cfg.data.data_dir, limit=v.limit, n=v.n, temperature=v.temperature,
                      top_p=v.top_p, seed=v.seed, retriever=cfg.retriever, out=str(run / step_folder(step)),
                      fresh=True, progress=False)


def live_models(plan: dict[str, WorkerGroupPlan], run: Path, step: int) -> dict[str, dict[str, Any]]:
    """The run identity's models of a validation: the trainer's engines at ``step`` (not a folder)."""
    return {g.name: {"name": f"{Path(str(g.settings.model).rstrip('/')).name}@step_{step}",
                     "weights": f"the training run's engines after step {step}", "run": str(run), "step": step}
            for g in plan.values()}


@dataclass
class Validator:
    """Validates the trainer's current policy (see the module docstring); ``history`` holds each
    validation's metrics by step, for the best step. With ``engines`` (the trainer's
    ``RolloutEngines``) a validation generates as a rollout does: pooled engines wake under the
    rollout's memory budget and are held asleep again afterwards."""

    cfg: TrainConfig
    run: Path
    plan: dict[str, WorkerGroupPlan]
    wf: WorkflowSpec
    workers: dict[str, Any]
    retriever: Any = None
    history: dict[int, dict[str, Any]] = field(default_factory=dict)
    engines: Any = None

    def due(self, step: int, n_steps: int) -> bool:
        return due(self.cfg.val, step, n_steps)

    async def validate(self, step: int) -> dict[str, Any]:
        """Evaluate the engines as they are now into ``RUN/val/step_<step>``; returns the metrics."""
        t0 = time.perf_counter()
        team_path = self.run / VAL_DIR / TEAM_FILE
        atomic_write(team_path, yaml.safe_dump(val_team(self.cfg, self.plan, self.wf), sort_keys=False))
        p = prepare(plan(eval_config(self.cfg, self.run, step)))  # its models are the trainer's: nothing left to fetch
        if self.engines is not None:
            await self.engines.before_rollout()
        try:
            summary = await run_on_engines(p, self.engines.views() if self.engines is not None else self.workers,
                                           models=live_models(self.plan, self.run, step), retriever=self.retriever,
                                           pool_stats={"pool": "the trainer's engines"})
        finally:
            if self.engines is not None:
                await self.engines.after_rollout()
        rec = val_metrics(summary.data, *source_scores(load_run(summary.run_dir, compact=True).views))
        rec[TIME_KEY] = time.perf_counter() - t0
        rec[RUN_KEY] = step_folder(step)
        self.history[step] = rec
        return rec

    def kept(self) -> tuple[int, ...]:
        """The steps whose checkpoints pruning must spare: the best validation's, with ``val.keep_best``."""
        b = self.best() if self.cfg.val.keep_best else None
        return (b["step"],) if b else ()

    async def keep_best(self, step: int, saved: bool, save: Callable[..., Awaitable[Any]] | None) -> None:
        """``val.keep_best``: when step ``step``'s validation is the best so far, its checkpoint (saved
        now with ``save(keep=...)`` unless the step ``saved`` one already) stays beside ``latest``,
        and ``ckpt/best`` points at it."""
        if not self.cfg.val.keep_best or step not in self.history:
            return
        b = self.best()
        if b is None or b["step"] != step:
            return
        if not saved and save is not None:
            await save(keep=(step,))
        ckpt_io.point(ckpt_io.resolve_root(self.run, self.cfg.ckpt_root), ckpt_io.BEST, step)

    def best(self) -> dict[str, Any] | None:
        """The best validation so far by ``val.keep_best`` (else micro avg@n): step, metric, value, run."""
        return best_step(self.history, self.cfg.val.keep_best or f"{PREFIX}avg@{self.cfg.val.n}")


def logged_history(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The validations a run's step log already holds (a resumed run's best step counts them)."""
    return {int(r["step"]): r for r in records if RUN_KEY in r and "step" in r}


def source_scores(views: Iterable[RecordView]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """A run's records (``load_run(...).views``) -> ``(test_score per benchmark, {data source:
    {"test_score", "mean", "n"}})``: the reference's
    ``test_score`` is the mean over its validation rows (one per agent call) of the row's trajectory
    reward, i.e. each trajectory weighted by its calls; it logs it per data source, which a
    benchmark's questions may declare (``meta.data_source``: the sampled sets' ``math500_first50``,
    ``aime24``, ``nq``, ...). ``mean`` is the plain mean reward of the source's trajectories (its
    avg@n), ``n`` the most samples of one of its questions."""
    num: dict[str, float] = {}
    den: dict[str, int] = {}
    by_src: dict[str, list[float]] = {}
    samples: dict[str, dict[str, int]] = {}
    for v in views:
        calls = len(v.turns)
        src = v.task_meta.get("data_source")
        keys = [v.benchmark] + ([f"@{src}"] if src and src != v.benchmark else [])
        for k in keys:
            num[k] = num.get(k, 0.0) + v.reward * calls
            den[k] = den.get(k, 0) + calls
        if len(keys) > 1:
            by_src.setdefault(str(src), [0.0, 0.0])
            by_src[str(src)][0] += v.reward
            by_src[str(src)][1] += 1
            q = samples.setdefault(str(src), {})
            q[v.task_id] = q.get(v.task_id, 0) + 1
    score = {k: (num[k] / den[k] if den[k] else math.nan) for k in num}
    sources = {s: {"test_score": score[f"@{s}"], "mean": t / c if c else math.nan, "n": max(samples[s].values())}
               for s, (t, c) in by_src.items()}
    return {k: v for k, v in score.items() if not k.startswith("@")}, sources


def val_metrics(summary: dict[str, Any], test_scores: dict[str, float] | None = None,
                sources: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """The step log's validation names from a run's ``summary.json`` (``n`` samples per question):

    - the reference's: ``val/<bench>/test_score`` (``test_scores``), ``val/<bench>/avg@n``,
      ``val/<bench>/pass@n``, ``val/avg@n``, ``val/pass@n`` (over all questions);
    - verl's: ``val-core/<bench>/reward/mean@n`` (= avg@n);
    - per data source of a benchmark whose questions declare one (``sources``, the sampled sets):
      ``val/<source>/test_score``, ``val/<source>/avg@n`` and ``val-core/<source>/reward/mean@n``;
    - ours: ``val/<bench>/pass@k`` for every k < n (unbiased), ``val/macro/avg@n`` and
      ``val/macro/pass@n`` (mean of benchmarks), per agent ``val/agent/<a>/valid/mean`` and
      ``val/agent/<a>/num_calls/mean`` (calls per trajectory), ``val/calls`` (agent calls),
      ``val/questions``, ``val/samples``.
    """
    rec: dict[str, Any] = {}

    def scores(prefix: str, s: dict[str, Any]) -> None:
        n = int(s.get("n_max") or s.get("n") or 1)
        rec[f"{prefix}avg@{n}"] = s.get("avg@n")
        for k, v in sorted((s.get("pass@k") or {}).items(), key=lambda kv: int(kv[0])):
            rec[f"{prefix}pass@{k}"] = v

    for b, s in (summary.get("benchmarks") or {}).items():
        scores(f"{PREFIX}{b}/", s)
        n = int(s.get("n_max") or s.get("n") or 1)
        rec[f"val-core/{b}/reward/mean@{n}"] = s.get("avg@n")
        if test_scores and b in test_scores:
            rec[f"{PREFIX}{b}/test_score"] = test_scores[b]
    for src, f in (sources or {}).items():
        n = int(f["n"])
        rec[f"{PREFIX}{src}/test_score"] = f["test_score"]
        rec[f"{PREFIX}{src}/avg@{n}"] = rec[f"val-core/{src}/reward/mean@{n}"] = f["mean"]
    micro = summary.get("micro") or {}
    scores(PREFIX, micro)
    macro = summary.get("macro") or {}
    if macro:
        n = int(micro.get("n_max") or micro.get("n") or 1)
        rec[f"{PREFIX}macro/avg@{n}"] = macro.get("avg@n")
        rec[f"{PREFIX}macro/pass@{n}"] = macro.get("pass@n")
    for a, c in ((summary.get("compliance") or {}).get("agents") or {}).items():
        rec[f"{PREFIX}agent/{a}/valid/mean"] = c.get("valid_rate")
    for a, c in (micro.get("agents") or {}).items():
        rec[f"{PREFIX}agent/{a}/num_calls/mean"] = c.get("calls_per_traj")
    rec[CALLS_KEY] = int((micro.get("usage") or {}).get("calls") or 0)
    rec[f"{PREFIX}questions"] = micro.get("questions")
    rec[f"{PREFIX}samples"] = micro.get("samples")
    return rec


def best_step(history: dict[int, dict[str, Any]], metric: str) -> dict[str, Any] | None:
    """The step whose validation has the highest ``metric`` (the earliest on a tie); None before any
    validation. A metric no validation logged is a UserError listing the logged ones."""
    if not history:
        return None
    got = {s: r[metric] for s, r in history.items() if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])}
    if not got:
        names = sorted(k for r in history.values() for k in r if k.startswith(PREFIX))
        raise UserError(f"val.keep_best: no validation logged {metric!r}; logged: {', '.join(dict.fromkeys(names))}")
    step = max(sorted(got), key=lambda s: got[s])
    return {"step": step, "metric": metric, "value": got[step], "run": step_folder(step)}


# ----------------------------------------------------------------------------------------- what it costs


def validation_count(val: Any, n_steps: int) -> int:
    """How many validations a run of ``n_steps`` RL steps makes (before training, every N, the last)."""
    return int(val.before_train) + sum(1 for s in range(1, n_steps + 1) if due(val, s, n_steps))
