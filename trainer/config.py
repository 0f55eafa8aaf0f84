"""Training configuration: one dataclass tree, loaded from a recipe YAML and command-line overrides.

    cfg = load_config("tiny", overrides={"algo.estimator": "grpo", "steps": 10})
    plan = plan_worker_groups(cfg, ("solver", "checker"))   # agent -> worker group, validated

A recipe is a YAML mapping whose keys mirror :class:`TrainConfig` (sections ``data``, ``rollout``,
``algo``, ``sft``, ``ray``, ``agent_defaults``, ``agents``). ``--recipe`` takes a name (a file in
``trainer/recipes/``) or a path. An unknown key anywhere is a :class:`UserError` naming the key and
listing the allowed ones; values are coerced to the field's type (so ``lr: 1e-6``, which YAML 1.1
reads as a string, is a float).

Worker groups (REFERENCE.md §5): each logical agent maps to a worker group (one model, its
optimiser and its rollout engine). By default each agent gets its own group (non-shared);
``shared: true`` puts agents that use the same model into one group; an agent's ``wg`` names its
group explicitly. The per-agent optimisation settings (:data:`WG_SETTINGS`) attach to the group, so
agents sharing a group must agree on them, or loading fails with a line that names both agents.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from drmas_bench.engines import ENGINES
from drmas_bench.store import safe_name
from drmas_bench.types import UserError

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"


# ----------------------------------------------------------------------------------------- sections


@dataclass
class AgentConfig:
    """Per-agent settings. Everything but ``wg`` and ``sampling`` belongs to the agent's worker group."""

    model: str | None = None  # alias, folder or hub id; None = TrainConfig.model
    wg: str | None = None  # worker group name; None = the agent's name (or the model's, with shared: true)
    lr: float = 1e-6  # AdamW learning rate (REFERENCE §1: 1e-6 per agent)
    lr_warmup_steps: int = 0  # linear warm-up of the lr over the group's first N optimiser steps
    weight_decay: float = 0.01  # AdamW weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    grad_clip: float = 1.0  # clip the global gradient norm of the group's step to this
    micro_batch_size: int = 8  # rows per forward/backward (gradient accumulation inside a mini-batch)
    engine: str = "hf"  # rollout engine: hf (CPU/GPU, in process) | sglang (GPU)
    engine_options: dict[str, Any] = field(default_factory=dict)  # passed to make_engine (e.g. max_batch)
    dtype: str = "float32"  # compute dtype: float32 | bfloat16 (autocast; weights and AdamW state stay fp32)
    gradient_checkpointing: bool = False  # trade compute for activation memory (large models)
    sleep_engine: bool = False  # engine releases its memory (weights + KV cache) during the update
    logprob_chunk: int = 1024  # tokens per vocabulary projection in the update (0 = full logits; docs/trainer.md)
    optimizer: str = "adamw"  # adamw (fp32 states, 8 B/param) | adamw_8bit (bitsandbytes, CUDA, 2 B/param)
    optimizer_offload: str = "none"  # none | cpu (AdamW states + fp32 master copy in host memory, step on CPU)
    sync_bucket_mb: int = 1024  # weight sync to the engine in buckets of about this many MiB
    sampling: dict[str, Any] = field(default_factory=dict)  # this agent's temperature/top_p/max_new_tokens


#: optimizer choices -> optimiser-state bytes per parameter (besides weights and gradients), on the GPU
OPTIMIZERS = {"adamw": 8, "adamw_8bit": 2}
#: optimizer_offload choices
OFFLOADS = ("none", "cpu")

#: AgentConfig fields that belong to the worker group: agents sharing a group must agree on them.
WG_SETTINGS = ("model", "lr", "lr_warmup_steps", "weight_decay", "betas", "grad_clip", "micro_batch_size", "engine",
               "engine_options", "dtype", "gradient_checkpointing", "sleep_engine", "logprob_chunk", "optimizer",
               "optimizer_offload", "sync_bucket_mb")


@dataclass
class DataConfig:
    """Where the training prompts come from and in which order."""

    source: str = "toy"  # "toy" (generated) | "benchmark:NAME[,NAME]" (registry) | path to a Task .jsonl
    size: int = 1000  # toy: how many questions to generate
    max_operand: int = 9  # toy: operands are 0..max_operand
    seed: int = 0  # toy generation seed and the shuffle seed (epoch e uses seed + e)
    shuffle: bool = True  # reshuffle the prompts every epoch
    limit: int | None = None  # use only the first N tasks of the source
    data_dir: str | None = None  # benchmark files (default $DRMAS_DATA_DIR, else the hub)


@dataclass
class RolloutConfig:
    """How rollouts are sampled (one iteration = prompts_per_step x n trajectories)."""

    prompts_per_step: int = 32  # distinct prompts per iteration (REFERENCE §6: math 32, search 128)
    n: int = 8  # rollouts per prompt, the group of the advantage statistics (math 8, search 5)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 512  # per agent call
    concurrency: int = 1024  # episodes in flight


@dataclass
class AlgoConfig:
    """Advantages and the policy loss (see docs/advantages.md)."""

    estimator: str = "drmas"  # drmas | grpo | grpo_first_row | drmas_mean_only | drmas_std_only | traj_traj | global_step
    norm_by_std: bool = True  # False: mean-centred scores only
    single_row: str = "reference"  # reference (mean 0 / std 1) | zero
    std_floor: float = 0.0  # clamp the std from below (0 = off, the reference)
    eps: float = 1e-6
    c_inv: float = 0.1  # invalid-action penalty: row score = R - c_inv * (1 - valid)
    loss: str = "ppo"  # ppo (token-level, dual clip) | gspo (sequence-level ratio)
    clip_low: float | None = None  # None = the loss's default (ppo 0.2, gspo 3e-4)
    clip_high: float | None = None  # None = the loss's default (ppo 0.2, gspo 4e-4)
    dual_clip: float | None = 3.0  # PPO dual clip c (None = off)
    agg: str | None = None  # token-mean | seq-mean-token-sum | seq-mean-token-mean; None = the loss's default
    entropy_coef: float = 0.0  # entropy bonus (search recipe: 0.001)
    ppo_epochs: int = 1  # passes over an iteration's rows
    mini_batches: int = 1  # optimiser steps per epoch per worker group (math 1, search 5)


@dataclass
class SFTConfig:
    """Supervised warm start on generated toy examples (steps: 0 = none). Deliberately partial: the
    solver's targets are right only ``solver_accuracy`` of the time, so RL has something to fix."""

    steps: int = 0  # optimiser steps per agent (0 = no warm start); a shared group does the sum of its agents'
    agent_steps: dict[str, int] = field(default_factory=dict)  # per-agent overrides of steps, e.g. {checker: 40}
    lr: float = 3e-3
    batch_size: int = 32  # examples per step
    seed: int = 0  # example generation
    solver_accuracy: float = 0.5  # share of solver targets with the right sum (the rest: near misses)
    checker_accuracy: float = 0.8  # share of checker targets with the right verdict
    retry_share: float = 0.2  # share of solver examples on the "previous answer was rejected" prompt
    max_operand: int = 9


@dataclass
class RayConfig:
    """Ray placement: one actor per worker group."""

    num_cpus: int | None = None  # for a local ray.init (None = Ray's default)
    num_gpus: int | None = None  # for a local ray.init; logical GPUs on a CPU machine (tests)
    gpus_per_worker: float = 1.0  # GPUs reserved by each worker-group actor (0.5: two groups share a GPU)
    address: str | None = None  # join an existing cluster ("auto" or host:port); None = start one
    timeout_s: float = 60.0  # wait at most this long for Ray to place each actor (model loading not counted)


# ----------------------------------------------------------------------------------------- the root


@dataclass
class TrainConfig:
    """The whole training run. Sections: data, rollout, algo, sft, ray; agents by name."""

    recipe: str = ""  # the recipe's name (informational)
    workflow: str = "toy"  # harness workflow: toy | math_refine | search_route
    workflow_options: dict[str, Any] = field(default_factory=dict)  # e.g. {rounds: 2}
    retriever: str | None = None  # search workflows: bm25:DIR | dense:DIR | http://HOST:PORT
    model: str = "tiny-random"  # the default model of every agent
    shared: bool = False  # agents with the same model share one worker group
    agent_defaults: dict[str, Any] = field(default_factory=dict)  # AgentConfig keys applied to every agent
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-agent AgentConfig keys (over agent_defaults)
    steps: int = 100  # RL iterations (one rollout batch + updates each)
    epochs: float | None = None  # alternative to steps: passes over the data (steps = ceil(epochs*D/P))
    seed: int = 0  # run seed: rollouts, shuffles, torch
    save_every: int = 10  # checkpoint every N steps (and at the last step); 0 = only the last
    keep_last: int = 2  # RL checkpoints kept (the warm-start step_0 is always kept); 0 = all
    torch_threads: int = 1  # torch intra-op threads per process (1 is fastest on a busy small CPU)
    device: str = "auto"  # policy device: auto (cuda when available) | cpu | cuda
    tracker: str = "none"  # also send step metrics to: none | tensorboard | wandb (drmas_trainer.trackers)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))


# ----------------------------------------------------------------------------------------- loading


def _plain(x: Any) -> Any:
    """Tuples -> lists, recursively (YAML/JSON friendly)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Coerce a YAML value to the annotated type ``tp`` (float/int/bool/str, Optional, tuple, dict)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], where)
    if tp is float:
        if isinstance(value, bool):
            raise UserError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise UserError(f"{where}: expected a number, got {value!r}") from None
    if tp is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise UserError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise UserError(f"{where}: expected an integer, got {value!r}") from None
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise UserError(f"{where}: expected true or false, got {value!r}")
    if tp is str:
        if isinstance(value, (dict, list)):
            raise UserError(f"{where}: expected a string, got {value!r}")
        return str(value)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise UserError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, where) for v, a in zip(value, args))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def _build(cls: type, d: Any, where: str) -> Any:
    """A dataclass from a mapping: unknown keys are errors that name them; values are coerced."""
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise UserError(f"{where}: expected a mapping, got {d!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}; allowed: {', '.join(names)}")
    kwargs = {}
    for k, v in d.items():
        tp = hints[k]
        sub = f"{where}.{k}" if where else k
        if dataclasses.is_dataclass(tp):
            kwargs[k] = _build(tp, v, sub)
        elif k == "agents" and cls is TrainConfig:
            if not isinstance(v, dict):
                raise UserError(f"{sub}: expected a mapping of agent name -> settings")
            for a, s in v.items():
                _build(AgentConfig, s, f"{sub}.{a}")  # validate keys and types now
            kwargs[k] = {str(a): dict(s or {}) for a, s in v.items()}
        else:
            kwargs[k] = _coerce(v, tp, sub)
    return cls(**kwargs)


def recipe_path(recipe: str) -> Path:
    """A recipe name (``tiny``) -> ``trainer/recipes/tiny.yaml``; a path -> itself."""
    p = Path(recipe)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        if not p.is_file():
            raise UserError(f"recipe file {p} not found")
        return p
    cand = RECIPES_DIR / f"{recipe}.yaml"
    if not cand.is_file():
        known = ", ".join(sorted(q.stem for q in RECIPES_DIR.glob("*.yaml")))
        raise UserError(f"unknown recipe {recipe!r}; known: {known} (or pass a YAML path)")
    return cand


def _set_path(d: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    cur = d
    for k in keys[:-1]:
        nxt = cur.get(k)
        if nxt is None:
            nxt = cur[k] = {}
        if not isinstance(nxt, dict):
            raise UserError(f"override {dotted}: {k} is not a section")
        cur = nxt
    cur[keys[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """``"algo.lr=1e-3"`` -> ``("algo.lr", 0.001)``; the value is read as YAML."""
    if "=" not in item:
        raise UserError(f"--set expects KEY=VALUE (e.g. algo.estimator=grpo), got {item!r}")
    k, v = item.split("=", 1)
    try:
        return k.strip(), yaml.safe_load(v)
    except yaml.YAMLError:
        return k.strip(), v


def load_config(recipe: str | dict[str, Any], overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Load a recipe (name, YAML path or mapping) and apply dotted ``overrides``; validate."""
    if isinstance(recipe, dict):
        raw, where = dict(recipe), "config"
    else:
        p = recipe_path(recipe)
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise UserError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(raw, dict):
            raise UserError(f"{p}: a recipe must be a mapping")
        raw.setdefault("recipe", p.stem)
        where = str(p)
    for k, v in (overrides or {}).items():
        _set_path(raw, k, v)
    try:
        cfg = _build(TrainConfig, raw, "")
    except UserError as e:
        raise UserError(f"{where}{' (with --set overrides)' if overrides else ''}: {e}") from None
    validate(cfg, where)
    return cfg


def validate(cfg: TrainConfig, where: str = "config") -> None:
    """Value checks that the types cannot express; each error is one line naming the key."""
    from drmas_trainer.advantages import ESTIMATORS
    from drmas_trainer.losses import AGG_MODES

    a, r = cfg.algo, cfg.rollout
    if a.estimator not in ESTIMATORS:
        raise UserError(f"{where}: algo.estimator {a.estimator!r} unknown; known: {', '.join(sorted(ESTIMATORS))}")
    if a.loss not in ("ppo", "gspo"):
        raise UserError(f"{where}: algo.loss must be ppo or gspo, got {a.loss!r}")
    if a.agg is not None and a.agg not in AGG_MODES:
        raise UserError(f"{where}: algo.agg must be one of {', '.join(AGG_MODES)}, got {a.agg!r}")
    if a.single_row not in ("reference", "zero"):
        raise UserError(f"{where}: algo.single_row must be reference or zero, got {a.single_row!r}")
    if a.dual_clip is not None and a.dual_clip <= 1.0:
        raise UserError(f"{where}: algo.dual_clip must be > 1 (or null), got {a.dual_clip}")
    for name, v in (("algo.ppo_epochs", a.ppo_epochs), ("algo.mini_batches", a.mini_batches),
                    ("rollout.prompts_per_step", r.prompts_per_step), ("rollout.n", r.n),
                    ("rollout.max_new_tokens", r.max_new_tokens), ("steps", cfg.steps)):
        if v < 1:
            raise UserError(f"{where}: {name} must be at least 1, got {v}")
    if cfg.ray.gpus_per_worker < 0 or cfg.ray.timeout_s <= 0:
        raise UserError(f"{where}: ray.gpus_per_worker must be >= 0 and ray.timeout_s > 0")
    if cfg.torch_threads < 1:
        raise UserError(f"{where}: torch_threads must be at least 1")
    if cfg.device not in ("auto", "cpu", "cuda") and not cfg.device.startswith("cuda:"):
        raise UserError(f"{where}: device must be auto, cpu or cuda[:N], got {cfg.device!r}")
    defaults = _build(AgentConfig, dict(cfg.agent_defaults), "agent_defaults")  # unknown keys / bad types
    check_lr(defaults.lr, f"{where}: agent_defaults.lr")  # named where it is set, before the agents inherit it
    check_lr(cfg.sft.lr, f"{where}: sft.lr")
    for agent in cfg.agents:
        _check_agent(_build(AgentConfig, {**cfg.agent_defaults, **cfg.agents[agent]}, f"agents.{agent}"),
                     f"{where}: agents.{agent}")
    if not 0.0 <= cfg.sft.solver_accuracy <= 1.0 or not 0.0 <= cfg.sft.checker_accuracy <= 1.0:
        raise UserError(f"{where}: sft.solver_accuracy and sft.checker_accuracy must be within [0, 1]")


def check_lr(lr: float, key: str) -> None:
    """A learning rate must be a finite number >= 0 (0 = the weights never move); NaN, infinite or
    negative ones fail here, as one line naming ``key``, instead of inside the optimiser."""
    if not (math.isfinite(lr) and lr >= 0.0):
        raise UserError(f"{key} must be a finite number >= 0, got {lr}")


def _check_agent(ac: AgentConfig, where: str) -> None:
    check_lr(ac.lr, f"{where}.lr")
    if ac.engine not in ENGINES:  # the engine registry is the one list of backends
        raise UserError(f"{where}.engine must be hf or sglang, got {ac.engine!r}")
    if ac.engine == "openai":
        raise UserError(f"{where}.engine: openai serves remote models whose weights cannot be trained here; use hf or sglang")
    if ac.dtype not in ("float32", "bfloat16"):
        raise UserError(f"{where}.dtype must be float32 or bfloat16, got {ac.dtype!r}")
    if ac.micro_batch_size < 1:
        raise UserError(f"{where}.micro_batch_size must be at least 1")
    if ac.logprob_chunk < 0 or ac.sync_bucket_mb < 1:
        raise UserError(f"{where}: logprob_chunk must be >= 0 (0 = full logits) and sync_bucket_mb >= 1")
    if ac.optimizer not in OPTIMIZERS:
        raise UserError(f"{where}.optimizer must be one of {', '.join(OPTIMIZERS)}, got {ac.optimizer!r}")
    if ac.optimizer_offload not in OFFLOADS:
        raise UserError(f"{where}.optimizer_offload must be one of {', '.join(OFFLOADS)}, got {ac.optimizer_offload!r}")
    if ac.optimizer != "adamw" and ac.optimizer_offload != "none":
        raise UserError(f"{where}: optimizer_offload {ac.optimizer_offload} works with optimizer adamw only")
    bad = sorted(set(ac.sampling) - {"temperature", "top_p", "max_new_tokens"})
    if bad:
        raise UserError(f"{where}.sampling: unknown key(s) {', '.join(bad)}; allowed: max_new_tokens, temperature, top_p")


# ----------------------------------------------------------------------------------------- worker groups


@dataclass
class WorkerGroupPlan:
    """One worker group: its name, the agents it serves and their (agreed) settings."""

    name: str
    agents: list[str]
    settings: AgentConfig  # the group's settings (model resolved; sampling/wg of the first agent)


def agent_config(cfg: TrainConfig, agent: str) -> AgentConfig:
    """The effective settings of ``agent``: AgentConfig defaults < agent_defaults < agents[agent]."""
    base = _build(AgentConfig, {**cfg.agent_defaults, **cfg.agents.get(agent, {})}, f"agents.{agent}")
    if base.model is None:
        base = dataclasses.replace(base, model=cfg.model)
    _check_agent(base, f"agents.{agent}")
    return base


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(s).rstrip("/")).name) or "model"


def plan_worker_groups(cfg: TrainConfig, workflow_agents: tuple[str, ...]) -> dict[str, WorkerGroupPlan]:
    """Map the workflow's agents to worker groups (see the module docstring); validate agreement."""
    unknown = sorted(set(cfg.agents) - set(workflow_agents))
    if unknown:
        raise UserError(f"agents: unknown agent(s) {', '.join(unknown)} for workflow {cfg.workflow!r}; "
                        f"its agents: {', '.join(workflow_agents)}")
    settings = {a: agent_config(cfg, a) for a in workflow_agents}
    models = {s.model for s in settings.values()}
    groups: dict[str, WorkerGroupPlan] = {}
    for agent in workflow_agents:
        s = settings[agent]
        if s.wg:
            name = safe_name(s.wg, f"agents.{agent}.wg: worker group")  # it names models/<wg>, optim/<wg>.pt
        elif cfg.shared:
            name = "shared" if len(models) == 1 else _slug(s.model)
        else:
            name = agent
        if name not in groups:
            groups[name] = WorkerGroupPlan(name, [agent], s)
            continue
        g = groups[name]
        for key in WG_SETTINGS:
            mine, theirs = getattr(s, key), getattr(g.settings, key)
            if mine != theirs:
                raise UserError(f"agents {g.agents[0]} and {agent} share worker group {name!r} but disagree on "
                                f"{key} ({theirs!r} vs {mine!r}); give them the same {key} or separate groups")
        g.agents.append(agent)
    return groups
