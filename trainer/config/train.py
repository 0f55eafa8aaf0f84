"""Training configuration: one tree of pydantic schemas (drmas_bench.schema), loaded from a recipe YAML
and command-line overrides.

    cfg = load_config("tiny", overrides={"algo.estimator": "grpo", "steps": 10})

A recipe is a YAML mapping whose keys mirror :class:`TrainConfig` (sections ``data``, ``rollout``,
``algo``, ``sft``, ``ray``, ``agent_defaults``, ``agents``). ``--recipe`` takes a name (a file in
``trainer/recipes/``) or a path. An unknown key anywhere is a :class:`UserError` naming the key and
listing the allowed ones; values are coerced to the field's type by the schema, for recipes and
``--set SECTION.KEY=VALUE`` alike (so ``lr: 1e-6``, which YAML 1.1 reads as a string, is a float).
``drmas-bench config-schema train`` (and docs/trainer.md) lists every key with its type, default
and description.

The agent -> worker-group plan is ``config.groups``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import yaml
from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from drmas_bench.engines import DEFAULT_ENGINE, ENGINES, traits
from drmas_bench.schema import (
    COERCING,
    RANGES,
    CoercingSchema,
    Float,
    Int,
    ModelOnEngine,
    Rate,
    TrainSamplingSchema,
    parse,
    registered,
)
from drmas_bench.types import UserError
from drmas_bench.workflows import get_workflow, workflow_names
from drmas_bench.yamlfile import read_yaml
from drmas_trainer.config.forecast import ForecastConfig
from drmas_trainer.config.rollout import DataConfig, RolloutConfig
from drmas_trainer.config.val import ValConfig

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"


# ----------------------------------------------------------------------------------------- sections


#: optimizer choices -> optimiser-state bytes per parameter (besides weights and gradients), on the GPU
OPTIMIZERS = {"adamw": 8, "adamw_8bit": 2}
#: optimizer_offload choices
OFFLOADS = ("none", "cpu")


class LoraConfig(CoercingSchema):
    """One LoRA adapter's shape (``lora:`` of ``agent_defaults`` or an agent; peft's LoraConfig,
    built by ``drmas_trainer.lora``)."""

    rank: Int = RANGES["positive_count"].field(16, description="LoRA rank r (peft `r`), >= 1")
    alpha: Float = Field(32.0, gt=0, allow_inf_nan=False, description="LoRA alpha (scale alpha / rank), > 0")
    target_modules: Any = Field("all-linear", description='modules that get an adapter: "all-linear" (every linear '
                                'layer but the output head, peft\'s shortcut) or a list of module names, e.g. '
                                '[q_proj, k_proj, v_proj, o_proj]')
    dropout: Float = RANGES["share"].field(0.0, description="dropout on the adapter's input, in [0, 1]")

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip():
            return v.strip()
        if isinstance(v, (list, tuple)) and v and all(isinstance(m, str) and m.strip() for m in v):
            return [m.strip() for m in v]
        raise ValueError(f'must be "all-linear" or a non-empty list of module names, got {v!r}')


class AgentConfig(ModelOnEngine):
    """Per-agent settings (``agent_defaults:`` and ``agents.NAME:``). Everything but ``wg`` and
    ``sampling`` belongs to the agent's worker group; ``model`` and ``engine`` are the worker-group
    core that team files share (:class:`drmas_bench.schema.ModelOnEngine`)."""

    model_config = COERCING

    model: Optional[str] = Field(None, description="alias, folder or hub id; null = the config's `model`")
    engine: str = Field(DEFAULT_ENGINE, description="rollout engine: hf (CPU/GPU, in process) | sglang (GPU)")
    wg: Optional[str] = Field(None, description="worker group name; null = the agent's name (or the model's, with shared: true)")
    lr: Rate = Field(1e-6,
                      description="AdamW learning rate (REFERENCE §1: 1e-6 per agent), finite and >= 0 (0: weights never move)")
    lr_warmup_steps: Int = Field(0, ge=0, description="linear warm-up of the lr over the group's first N optimiser steps")
    weight_decay: Float = RANGES["rate"].field(0.01, description="AdamW weight decay, finite and >= 0")
    betas: tuple[Annotated[Float, RANGES["beta"].field()], Annotated[Float, RANGES["beta"].field()]] = Field(
        (0.9, 0.999), description="AdamW betas, each in [0, 1)")
    grad_clip: Float = RANGES["grad_clip"].field(
        1.0, description="clip the global gradient norm of the group's step to this (<= 0: off); finite")
    micro_batch_size: Int = RANGES["positive_count"].field(8, description="rows per forward/backward (gradient accumulation inside a mini-batch)")
    engine_options: dict[str, Any] = Field(default_factory=dict, description="engine options passed to make_engine (e.g. max_batch)")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="compute dtype (autocast; weights and AdamW state stay fp32)")
    gradient_checkpointing: bool = Field(False, description="trade compute for activation memory (large models)")
    sleep_engine: bool = Field(False, description="the engine releases its memory (weights + KV cache) during the update")
    logprob_chunk: Int = Field(1024, ge=0, description="tokens per vocabulary projection in the update (0 = full logits; docs/trainer.md)")
    optimizer: str = Field("adamw", description="adamw (fp32 states, 8 B/param) | adamw_8bit (bitsandbytes, CUDA, 2 B/param)")
    optimizer_offload: str = Field("none", description="none | cpu (AdamW states + fp32 master copy in host memory, step on CPU)")
    sync_bucket_mb: Int = Field(1024, ge=1, description="weight sync to the engine in buckets of about this many MiB")
    sampling: dict[str, Any] = Field(default_factory=dict,
                                     description="this agent's sampling overrides: temperature, top_p, max_new_tokens")
    lora: Optional[LoraConfig] = Field(None, description="train a LoRA adapter over the frozen model instead of all "
                                       "its weights (null = full weights); with shared_base one adapter per agent")

    @field_validator("engine")
    @classmethod
    def _trainable_engine(cls, v: str) -> str:

        if v in ENGINES and traits(v).remote:  # an unknown name is the registry check's to report
            raise ValueError(f"{v} serves remote models whose weights cannot be trained here; use hf or sglang")
        return v

    @field_validator("optimizer", "optimizer_offload")
    @classmethod
    def _registered(cls, v: str, info: ValidationInfo) -> str:
        return registered(v, {"optimizer": OPTIMIZERS, "optimizer_offload": OFFLOADS}[info.field_name])

    @field_validator("sampling")
    @classmethod
    def _sampling(cls, v: dict[str, Any]) -> dict[str, Any]:
        TrainSamplingSchema.model_validate(v)  # the sampling schema team files share (errors: its key path)
        return v

    @model_validator(mode="after")
    def _offload_needs_adamw(self) -> "AgentConfig":
        if self.optimizer != "adamw" and self.optimizer_offload != "none":
            raise ValueError(f"optimizer_offload {self.optimizer_offload} works with optimizer adamw only")
        return self


#: AgentConfig fields that belong to the worker group: agents sharing a group must agree on them.
WG_SETTINGS = ("model", "lr", "lr_warmup_steps", "weight_decay", "betas", "grad_clip", "micro_batch_size", "engine",
               "engine_options", "dtype", "gradient_checkpointing", "sleep_engine", "logprob_chunk", "optimizer",
               "optimizer_offload", "sync_bucket_mb", "lora")
#: the WG_SETTINGS that belong to an agent's own adapter in a ``shared_base`` group (may differ per agent)
ADAPTER_SETTINGS = ("lr", "lr_warmup_steps", "weight_decay", "betas", "grad_clip", "lora")


class KLCtrlConfig(CoercingSchema):
    """The KL-in-reward coefficient (verl's ``algorithm.kl_ctrl``): fixed, or adaptive towards a target KL."""

    type: Literal["fixed", "adaptive"] = Field("fixed", description="fixed (beta = kl_coef) | adaptive (beta *= 1 + "
                                               "clip(kl / target_kl - 1, +-0.2) * rows / horizon each step)")
    kl_coef: Float = RANGES["rate"].field(0.001, description="beta at step 1, >= 0")
    target_kl: Float = Field(0.1, gt=0, allow_inf_nan=False, description="adaptive: the KL it steers towards, > 0")
    horizon: Float = Field(10000.0, gt=0, allow_inf_nan=False, description="adaptive: rows over which it moves, > 0")


class AlgoConfig(CoercingSchema):
    """Advantages and the policy loss (see docs/advantages.md)."""

    estimator: str = Field("drmas", description="drmas | grpo | grpo_first_row | global_step | drmas_mean_only | "
                                                "drmas_std_only | grpo_row_score; the reference's names (need "
                                                "group_by_agent): agent_agent | traj_traj | agent_traj | traj_agent | "
                                                "auto | master | reference_2025_10 (alias 3b556f2) (docs/advantages.md)")
    group_by_agent: Optional[bool] = Field(None, description="the reference's group_by_agent_id, for its estimator "
                                                             "names only: true pools per (uid, agent), false per uid")
    norm_by_std: bool = Field(True, description="false: mean-centred scores only")
    single_row: Literal["reference", "zero"] = Field("reference", description="a group of one row: reference (mean 0 / std 1) | zero")
    std_floor: Float = RANGES["rate"].field(0.0, description="clamp the std from below (0 = off, the reference)")
    eps: Float = RANGES["rate"].field(1e-6, description="added to the std, finite and >= 0 (0: a group of equal scores "
                                                        "gives 0/0 and its update is skipped)")
    c_inv: Float = RANGES["rate"].field(0.1, description="invalid-action penalty: row score = R - c_inv * (1 - valid), finite and >= 0")
    loss: Literal["ppo", "gspo"] = Field("ppo", description="ppo (token-level, dual clip) | gspo (sequence-level ratio)")
    clip_low: Optional[Float] = RANGES["rate"].field(None, description="null = the loss's default (ppo 0.2, gspo 3e-4); >= 0")
    clip_high: Optional[Float] = RANGES["rate"].field(None, description="null = the loss's default (ppo 0.2, gspo 4e-4); >= 0")
    dual_clip: Optional[Float] = Field(3.0, gt=1.0, description="PPO dual clip c, > 1 (null = off)")
    agg: Optional[str] = Field(None, description="token-mean | seq-mean-token-sum | seq-mean-token-mean; null = the loss's default")
    entropy_coef: Float = RANGES["coef"].field(0.0, description="entropy bonus (search recipe: 0.001), finite")
    ppo_epochs: Int = RANGES["positive_count"].field(1, description="passes over an iteration's rows")
    mini_batches: Int = RANGES["positive_count"].field(
        1, description="optimiser steps per epoch per worker group (math 1, search 5); at most prompts_per_step x n")
    balance_loss_by_agent_freq: bool = Field(
        False, description="weight each row's policy loss by (1/n of its (prompt, agent) pair) / batch mean, so every "
                           "agent counts once per prompt however often it acted (the reference's switch; "
                           "drmas_trainer.loss_balance)")
    adv_metrics: Literal["40f50a1", "755152e", "none"] = Field(
        "40f50a1", description="per-step advantage metrics with the reference's names: 40f50a1 (adv_std, adv_norm, "
                               "adv_diag) | 755152e (adv_std, adv_norm) | none (drmas_trainer.adv_metrics)")
    use_kl_in_reward: bool = Field(False, description="subtract beta * KL(policy || reference policy) from each row's "
                                                      "score (a frozen reference: the recipe's model; LoRA: the base "
                                                      "without adapters); drmas_trainer.rewards")
    kl_penalty: str = Field("kl", description="per-token KL estimator of the reward penalty: kl | k1 | abs | mse | k2 | "
                                              "low_var_kl | k3")
    kl_ctrl: KLCtrlConfig = Field(default_factory=KLCtrlConfig,
                                    description="the KL coefficient's controller (use_kl_in_reward)")

    @field_validator("estimator")
    @classmethod
    def _estimator(cls, v: str) -> str:
        from drmas_trainer.advantages import ESTIMATORS  # the registry (imports torch: only when validating)

        return registered(v, sorted(ESTIMATORS), "estimator")

    @model_validator(mode="after")
    def _group_index(self) -> "AlgoConfig":
        from drmas_trainer.advantages import check_group_index

        check_group_index(self.estimator, self.group_by_agent)  # a reference name without it: refused, not defaulted
        return self

    @field_validator("agg", "kl_penalty")
    @classmethod
    def _loss_names(cls, v: str | None, info: ValidationInfo) -> str | None:
        from drmas_trainer.losses import AGG_MODES, KL_PENALTIES

        return v if v is None else registered(v, {"agg": AGG_MODES, "kl_penalty": list(KL_PENALTIES)}[info.field_name])


class SFTConfig(CoercingSchema):
    """Supervised warm start on generated toy examples (steps: 0 = none). Deliberately partial: the
    solver's targets are right only ``solver_accuracy`` of the time, so RL has something to fix.
    Other keys are the workflow's own warm-start options: keyword parameters of its example maker
    (``@workflow(sft=...)``, e.g. toy_fixer's ``fixer_accuracy``), checked against it (``TrainConfig``)."""

    model_config = ConfigDict(**{**COERCING, "extra": "allow"})

    steps: Int = RANGES["steps"].field(0, description="optimiser steps per agent (0 = no warm start); a shared group does the sum of its agents'")
    agent_steps: dict[str, Annotated[Int, RANGES["steps"].field()]] = Field(
        default_factory=dict, description="per-agent overrides of steps, e.g. {checker: 40}")
    lr: Rate = Field(3e-3, description="learning rate of the warm start, finite and >= 0")
    batch_size: Int = RANGES["batch_size"].field(32, description="examples per step, >= 1")
    seed: Int = Field(0, description="example generation")
    solver_accuracy: Float = Field(0.5, ge=0, le=1, description="share of solver targets with the right sum (the rest: near misses)")
    checker_accuracy: Float = Field(0.8, ge=0, le=1, description="share of checker targets with the right verdict")
    retry_share: Float = RANGES["share"].field(0.2, description='share of solver examples on the "previous answer was rejected" prompt, in [0, 1]')
    max_operand: Int = Field(9, ge=0, description="toy operands are 0..max_operand")


class RayConfig(CoercingSchema):
    """Ray placement: one actor per worker group."""

    num_cpus: Optional[Int] = Field(None, description="for a local ray.init (null = Ray's default)")
    num_gpus: Optional[Int] = Field(None, description="for a local ray.init; logical GPUs on a CPU machine (tests)")
    gpus_per_worker: Float = Field(1.0, ge=0, description="GPUs reserved by each worker-group actor (0.5: two groups share a GPU)")
    address: Optional[str] = Field(None, description='attach to an existing cluster ("auto", host:port or ray://host:port; '
                                   'also --ray-address); null = $RAY_ADDRESS, else start a local one')
    ship_code: Optional[bool] = Field(None, description="send this checkout's packages to the workers in the runtime_env "
                                      "(null = only when attaching to a cluster; docs/scaling.md)")
    timeout_s: Float = Field(60.0, gt=0, description="wait at most this long for Ray to place each actor (model loading not counted)")


# ----------------------------------------------------------------------------------------- sharded worker groups


class FSDPConfig(CoercingSchema):
    """Worker groups sharded over several GPUs with FSDP2 (``drmas_trainer.fsdp.worker``; docs/trainer.md,
    "Sharded worker groups"). ``ranks: 1`` is one process per group, unsharded."""

    ranks: Int = RANGES["positive_count"].field(
        1, description="ranks (GPUs) per worker group: parameters, gradients and AdamW state sharded over them, "
                       "the group's rows split across them; 1 = no sharding")
    layout: Literal["colocated", "separate"] = Field(
        "colocated", description="colocated: every group has one rank on each of `ranks` GPUs, each with its engine "
                                 "(the reference's layout); separate: each group on its own `ranks` GPUs")
    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="torch.distributed backend: auto = nccl on "
                                                     "CUDA, gloo on CPU")
    reshard_after_forward: bool = Field(True, description="free each layer's gathered parameters after its forward "
                                                          "(gather again for backward): less memory, more traffic")


# ----------------------------------------------------------------------------------------- the root


class TrainConfig(CoercingSchema):
    """The whole training run. Sections: data, rollout, algo, sft, ray; agents by name."""

    recipe: str = Field("", description="the recipe's name (informational; default: the recipe file's stem)")
    workflow: str = Field("toy", description="harness workflow: any registered one, from the suites' folders "
                          "(toy, toy_fixer, math_refine, math_single, search_route, search_single, ...)")
    workflow_options: dict[str, Any] = Field(default_factory=dict, description="the workflow's options, e.g. {rounds: 2}")

    @field_validator("workflow")
    @classmethod
    def _registered_workflow(cls, v: str) -> str:
        return registered(v, workflow_names(), "workflow")  # the harness's registry (drmas_bench.suites.discovery)
    retriever: Optional[str] = Field(None, description="search workflows: bm25:DIR | dense:DIR | http://HOST:PORT")
    model: str = Field("tiny-random", description="the default model of every agent")
    shared: bool = Field(False, description="agents with the same model share one worker group")
    shared_base: bool = Field(False, description="agents with the same model share one worker group and its frozen "
                              "base weights, each training its own LoRA adapter (needs lora; not with shared)")
    agent_defaults: dict[str, Any] = Field(default_factory=dict, description="agent settings (the agent table) applied to every agent")
    agents: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                              description="agent name -> agent settings (the agent table), over agent_defaults")
    steps: Int = Field(100, ge=1, description="RL iterations (one rollout batch + updates each)")
    epochs: Optional[Float] = Field(None, gt=0, allow_inf_nan=False,
                                    description="alternative to steps: passes over the data (steps = ceil(epochs*D/P))")
    seed: Int = Field(0, description="run seed: rollouts, shuffles, torch")
    save_every: Int = RANGES["every"].field(10, description="checkpoint every N steps (and at the last step); 0 = only the last")
    ckpt_root: Optional[str] = Field(None, description="checkpoint folder (null = RUN/ckpt); on a multi-node Ray cluster a "
                                     "folder the driver and every node share, or an fsspec URL (s3://bucket/run1, "
                                     "file:///shared/ck; its backend package and credentials are the user's; "
                                     "docs/scaling.md)")
    keep_last: Int = RANGES["every"].field(2, description="RL checkpoints kept (the warm-start step_0 is always kept); 0 = all")
    torch_threads: Int = Field(1, ge=1, description="torch intra-op threads per process (1 is fastest on a busy small CPU)")
    device: str = Field("auto", description="policy device: auto (cuda when available) | cpu | cuda[:N]")
    tracker: str = Field("none", description="also send step metrics to: none | tensorboard | wandb (drmas_trainer.trackers)")
    data: DataConfig = Field(default_factory=DataConfig, description="where the training prompts come from")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="how rollouts are sampled")
    algo: AlgoConfig = Field(default_factory=AlgoConfig, description="advantages and the policy loss")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="supervised warm start (toy)")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray placement")
    fsdp: FSDPConfig = Field(default_factory=FSDPConfig, description="worker groups sharded over several GPUs (FSDP2)")
    plan: ForecastConfig = Field(default_factory=ForecastConfig, description="train --plan's hardware and workload "
                             "(memory plan and predicted hours; the trainer does not read it)")
    val: ValConfig = Field(default_factory=ValConfig, description="validation during training (the reference's "
                           "test_freq / val_before_train), each a run folder RUN/val/step_N")

    @model_validator(mode="before")
    @classmethod
    def _empty_sections(cls, d: Any) -> Any:
        """A section left empty in YAML (``ray:`` with only comments under it) means its defaults."""
        if isinstance(d, dict):
            sections = {n for n, f in cls.model_fields.items() if isinstance(f.annotation, type)
                        and issubclass(f.annotation, CoercingSchema)}
            return {k: v for k, v in d.items() if not (v is None and k in sections)}
        return d

    @model_validator(mode="after")
    def _mini_batches_fit(self) -> "TrainConfig":
        """Each optimiser step needs rows: more mini-batches than an iteration's trajectories would
        leave steps empty (1000 mini-batches of 8 trajectories trained nothing, with exit 0)."""
        per_step = self.rollout.prompts_per_step * self.rollout.n
        if self.algo.mini_batches > per_step:
            raise ValueError(f"algo.mini_batches {self.algo.mini_batches} is more than the {per_step} trajectories of "
                             f"one iteration (rollout.prompts_per_step x rollout.n); each mini-batch needs some")
        return self

    @model_validator(mode="after")
    def _shared_base(self) -> "TrainConfig":
        if self.shared and self.shared_base:
            raise ValueError("shared (one set of weights for the group's agents) and shared_base (one frozen base, "
                             "an adapter per agent) exclude each other; set one of them")
        return self

    @model_validator(mode="after")
    def _sft_options(self) -> "TrainConfig":
        """The sft section's keys beyond its own are the workflow's warm-start options: each must be a
        keyword parameter of its example maker, of its default's type."""
        extra = dict(self.sft.model_extra or {})
        if extra:
            maker = get_workflow(self.workflow).sft
            options = {p.name: p.default for p in inspect.signature(maker).parameters.values()
                       if p.kind is p.KEYWORD_ONLY and p.default is not p.empty} if maker is not None else {}
            for k, v in extra.items():
                if k not in options:
                    raise ValueError(f"sft.{k}: unknown key; the sft section's own keys: {', '.join(SFTConfig.model_fields)}"
                                     f"; workflow {self.workflow}'s warm-start options: {', '.join(sorted(options)) or 'none'}")
                d = options[k]
                if d is not None and not isinstance(v, type(d)) and not (isinstance(d, float) and isinstance(v, int)
                                                                        and not isinstance(v, bool)):
                    raise ValueError(f"sft.{k}: expected {type(d).__name__} (like the default {d!r}), got {v!r}")
        return self

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("auto", "cpu", "cuda") and not v.startswith("cuda:"):
            raise ValueError(f"must be auto, cpu or cuda[:N], got {v!r}")
        return v

    @field_validator("agents", mode="before")
    @classmethod
    def _empty_agents(cls, v: Any) -> Any:
        return {a: ({} if s is None else s) for a, s in v.items()} if isinstance(v, dict) else v

    def to_dict(self) -> dict[str, Any]:
        return _plain(self.model_dump())


# ----------------------------------------------------------------------------------------- loading


def _plain(x: Any) -> Any:
    """Tuples -> lists, recursively (YAML/JSON friendly)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def parse_agent(d: Any, where: str, prefix: str) -> AgentConfig:
    """Agent settings from a mapping (unknown keys / bad types: one line naming ``prefix.key``)."""
    return parse(AgentConfig, d if d is not None else {}, where, prefix=prefix)


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
        raw = read_yaml(p, "recipe") or {}  # the reader of every user YAML file (size, UTF-8, alias bombs)
        if not isinstance(raw, dict):
            raise UserError(f"{p}: a recipe must be a mapping")
        raw.setdefault("recipe", p.stem)
        where = str(p)
    for k, v in (overrides or {}).items():
        _set_path(raw, k, v)
    where_set = f"{where}{' (with --set overrides)' if overrides else ''}"
    cfg = parse(TrainConfig, raw, where_set)
    parse_agent(cfg.agent_defaults, where_set, "agent_defaults")  # unknown keys / bad types, named where they are set
    for agent, settings in cfg.agents.items():
        parse_agent(settings, where_set, f"agents.{agent}")
    validate(cfg, where)
    return cfg


def validate(cfg: TrainConfig, where: str = "config") -> None:
    """What the schema cannot see alone: each agent's settings merged over ``agent_defaults``
    (e.g. an optimizer from the defaults with an agent's offload); one line naming the agent."""
    for agent in cfg.agents:
        parse_agent({**cfg.agent_defaults, **cfg.agents[agent]}, where, f"agents.{agent}")
