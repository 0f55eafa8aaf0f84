"""The run directory's own files: ``metrics.jsonl`` (one strict-JSON record per RL step, cut back
to the resumed step on a restart), ``config.yaml`` (what a resume must match), and the summary of a
finished run. The trainer's loop writes through these; ``drmas-bench regress`` / ``plot`` and
``scripts/stability_study.py`` read through them.

    log = MetricsLog(run, keep_until=step, tracker="none")
    log.write(step_metrics(step, cursor, batch, trajs, rb, scores, adv, updates, agents, plan))
    summarize(run, n_steps)        # first/last-5 rewards, skipped steps, grad-norm spread
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

import torch
import yaml

from drmas_bench.files import atomic_write
from drmas_bench.types import Task, Trajectory, UserError
from drmas_trainer import metric_names
from drmas_trainer.advantages import advantage_stats
from drmas_trainer.config.groups import WorkerGroupPlan
from drmas_trainer.config.train import TrainConfig
from drmas_trainer.moment_factor import second_moment_factors
from drmas_trainer.trackers import make_tracker

METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
RUN_FILES = ("metrics.jsonl", "config.yaml", "sft.json", "workers.json", "error.log", "curves.png")
CKPT_CACHE = ".ckpt-cache"  # RUN/.ckpt-cache/step_K: the checkpoint a resume from a URL root downloaded


def clear_run(run: Path) -> None:
    """``--fresh``: remove what a previous run left in ``run`` (checkpoints, logs, TensorBoard)."""
    for p in ("ckpt", "tb", CKPT_CACHE) + RUN_FILES:
        q = run / p
        if q.is_dir() and not q.is_symlink():
            shutil.rmtree(q)
        elif q.exists() or q.is_symlink():
            q.unlink()


def check_run_config(run: Path, cfg: TrainConfig, resuming: bool) -> None:
    """Write ``run/config.yaml``; when resuming, the stored one must match (``steps`` may grow)."""
    path = run / CONFIG
    new = cfg.to_dict()
    if resuming and path.is_file():
        old = yaml.safe_load(path.read_text()) or {}
        # steps may grow; Ray placement (address, GPUs per worker), sharding (fsdp) and validation (val: it
        # reads the policy, never changes it) may change between attempts
        diff = sorted(k for k in set(old) | set(new)
                      if k not in ("steps", "epochs", "ray", "fsdp", "val") and old.get(k) != new.get(k))
        if diff:
            raise UserError(f"{run} was trained with another configuration (differs in: {', '.join(diff)}); "
                            f"resume with the same recipe and flags, or use another --out")
    run.mkdir(parents=True, exist_ok=True)

    atomic_write(path, yaml.safe_dump(new, sort_keys=False))


class MetricsLog:
    """``RUN/metrics.jsonl``: one JSON object per step, flushed and fsynced; plus the run's tracker
    (drmas_trainer.trackers: none | tensorboard | wandb).

    ``keep_until``: on (re)start, records of later steps (written after the checkpoint being
    resumed) are cut off, so the file always describes one consistent run. ``restore``: the record of
    step ``keep_until`` as its checkpoint carries it, logged here when the file lacks that step (the
    run stopped after the checkpoint's commit, before its line; the line then has no save seconds)."""

    def __init__(self, run: Path, keep_until: int = 0, tracker: str = "none",
                 config: dict[str, Any] | None = None, restore: dict[str, Any] | None = None) -> None:

        run.mkdir(parents=True, exist_ok=True)
        self.path = run / METRICS
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= keep_until] if self.path.exists() else []
        atomic_write(self.path, "".join(json_line(r) + "\n" for r in kept))
        self.tracker = make_tracker(tracker, run, keep_until=keep_until, config=config)
        self.f = open(self.path, "a", encoding="utf-8")
        if restore is not None and restore.get("step") == keep_until and not any(r.get("step") == keep_until for r in kept):
            self.write(restore)

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
        applied = sum(r.get(metric_names.wg(g, metric_names.OPTIMIZER_STEPS)) or 0 for r in records)
        skipped = sum(r.get(metric_names.wg(g, metric_names.SKIPPED_STEPS)) or 0 for r in records)
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
        metric_names.SCORE: _mean([float(t.reward) for t in trajs]),
        metric_names.ACC: _mean([1.0 if t.correct else 0.0 for t in trajs]),
        metric_names.REWARDS: float(scores.mean()),
        metric_names.NUM_TURNS: _mean([len(t.turns) for t in trajs]),
        metric_names.RESPONSE_LENGTH: _mean([len(r.response_ids) for r in rb["rows"]]),
    }
    stats = advantage_stats(adv, rb["agent"])
    factors = second_moment_factors(scores, rb["uid"], rb["agent"], len(agents))
    for k, a in enumerate(agents):
        mine = [i for i, r in enumerate(rb["rows"]) if r.agent == a]
        rec[metric_names.agent(a, metric_names.CALLS)] = len(mine) / max(1, len(trajs))
        rec[metric_names.agent(a, metric_names.VALID)] = _mean([1.0 if rb["valid"][i] else 0.0 for i in mine])
        rec[metric_names.agent(a, metric_names.RESPONSE_LENGTH)] = _mean([len(rb["rows"][i].response_ids) for i in mine])
        rec[metric_names.agent(a, metric_names.REWARDS)] = _mean([float(scores[i]) for i in mine])
        s = stats.get(k)
        rec[metric_names.agent(a, metric_names.ADV_MEAN)] = s["mean"] if s else float("nan")
        rec[metric_names.agent(a, metric_names.ADV_STD)] = s["std"] if s else float("nan")
        rec[metric_names.agent(a, metric_names.ADV_ABSMAX)] = s["abs_max"] if s else float("nan")
        factor, groups = factors[k]
        rec[metric_names.agent(a, metric_names.MOMENT_FACTOR)] = factor
        rec[metric_names.agent(a, metric_names.MOMENT_FACTOR_GROUPS)] = groups
    for name, u in updates.items():
        for a, v in u["agent_grad_norm"].items():
            rec[metric_names.agent(a, metric_names.GRAD_NORM)] = v
            rec[metric_names.agent(a, metric_names.GRAD_NORM_MAX)] = u["agent_grad_norm_max"][a]
        for key, out in metric_names.UPDATE_KEYS.items():
            if key in u:
                rec[metric_names.wg(name, out)] = u[key]
    for key in metric_names.AVERAGED:
        vals = [u[key] for u in updates.values() if key in u and isinstance(u[key], float) and math.isfinite(u[key])]
        rec[metric_names.UPDATE_KEYS[key]] = _mean(vals)
    return rec


def summarize(run: Path, n_steps: int) -> dict[str, Any]:
    """First/last-5 reward means (``reward_window`` steps each: 5, or half the run when it has fewer
    than 10 steps, so the two never overlap), skipped steps and per-agent grad-norm spread of a
    finished run. ``time_s`` is the RL steps' own seconds (``timing_s/step`` summed over the log: no
    start-up, warm start or validation before step 1); ``train`` (the command) adds ``wall_s``, the
    whole call's."""
    recs = [r for r in read_metrics(run) if metric_names.SCORE in r]
    rewards = [r[metric_names.SCORE] if isinstance(r[metric_names.SCORE], (int, float)) else float("nan") for r in recs]
    k = max(1, min(5, len(rewards) // 2))  # two windows that do not overlap (a 4-step run: 2 and 2)
    out: dict[str, Any] = {"run": str(run), "steps": len(recs), "reward_window": k,
                           "reward_first5": _mean(rewards[:k]), "reward_last5": _mean(rewards[-k:]),
                           "skipped_steps": sum(r.get(metric_names.SKIPPED_STEPS) or 0 for r in recs),
                           "time_s": sum(r.get(metric_names.TIME_STEP) or 0.0 for r in recs)}
    out["grad_norm_spread"] = grad_norm_spread(recs)
    return out


def grad_norm_spread(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per agent: max, median and max/median (``spread``; absent when the median is 0) of
    ``agent/<a>/actor/grad_norm`` over the steps."""
    out: dict[str, dict[str, float]] = {}
    for a in metric_names.agents_with({k for r in records for k in r}, metric_names.GRAD_NORM):
        k = metric_names.agent(a, metric_names.GRAD_NORM)
        vals = [r[k] for r in records if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])]
        if vals:
            med = statistics.median(vals)
            out[a] = {"max": max(vals), "median": med}
            if med > 0:  # every norm 0 (or half of them): no spread to speak of, rather than "inf"
                out[a]["spread"] = max(vals) / med
    return out
