"""The GPU memory plan of a training run: what each worker group keeps on its GPU in each phase of an
iteration, from the model's architecture and the recipe, and whether it fits (``drmas-bench train
--plan``).

    shapes = {g: model_shape(p.settings.model) for g, p in groups.items()}
    plan = memory_plan(cfg, groups, shapes, gpu_gib=140, use_ray=False)
    print(format_plan(plan)); sys.exit(0 if plan.fits else 1)

Per worker group (P = parameters, from config.json or the built-in table :data:`KNOWN_SHAPES`):

- resident all the time: fp32 master weights (4P) + optimiser state on the GPU (``adamw`` 8P,
  ``adamw_8bit`` 2P, ``optimizer_offload: cpu`` 0: host memory instead);
- during its update only: fp32 gradients (4P), the bf16 copies of the weights that autocast caches
  for the forward/backward (2P, bf16 compute only), the gradient snapshot of a shared group (4P when
  it serves several agents), activations of one micro-batch of ``micro_batch_size`` x ``seq`` tokens
  (with gradient checkpointing: each layer's fp32 input plus one layer recomputed; without: every
  layer's), and the output layer's work on the micro-batch's ``micro_batch_size`` x
  ``max_new_tokens`` response tokens (``logprob_chunk`` x V float32 buffers and the lm_head
  gradient accumulator, or the full [tokens, V] logits with ``logprob_chunk: 0``);
- its rollout engine when awake: sglang ``mem_fraction_static`` x GPU memory (weights + KV cache;
  sglang's default 0.9 when the recipe does not say), hf bf16 weights (2P) + a KV cache for
  ``max_batch`` sequences of ``seq`` tokens. ``sleep_engine: true`` releases it during updates;
- per process: CUDA context and allocator slack, :data:`PROCESS_OVERHEAD_GIB`.

A **LoRA** group (``lora:``, ``shared_base``) instead keeps the frozen base once in the compute dtype
(2P in bf16, 4P in fp32) with no gradients and no optimiser state for it, and per adapter (A =
its parameters, :func:`lora_params`, from the rank and the target modules) fp32 weights 4A and its
AdamW state 8A; during the update gradients 4A, autocast's bf16 copies of the adapters 2A, the
snapshot of a group serving several agents 4A, and the activations and output layer as above (the
frozen output head needs no gradient accumulator unless it is a LoRA target). Its engine also holds
the adapters (bf16, 2A each).

A group **sharded** over N GPUs (``fsdp.ranks``, or ``train --plan --gpus N``) keeps on each of
them 1/N of its weights, gradients, optimiser state (or host share), snapshot and frozen reference
copy (KL in the reward, :func:`reference_memory`), plus, during its
update, two gathered decoder layers and the gathered root (embeddings, output head); activations
and the output layer are its rank's micro-batch's; each GPU has one engine per group (colocated:
every group on the same N GPUs, taking turns to update; separate: each group on its own N GPUs).
:func:`why_not` says, for a phase that does not fit, how much of it the engines are and the
``mem_fraction_static`` under which it would fit.

Phases per GPU: **rollout** (every resident state + the engines under the rollout budget: the GPU
less the training state, the engines that never sleep, other processes (``plan.reserved_gib``) and
one sync bucket; as many sleeping engines awake as fit, the least recently used of the rest asleep,
:func:`rollout_peak`), **update** (resident states + the updating group's extras + engines that do not
sleep; groups sharing a GPU as Ray actors update at the same time, in-process groups one after the
other), **sync** (rollout's memory + one weight bucket). ``seq`` = ``--prompt-tokens`` (default
4096) + ``rollout.max_new_tokens``. Activation sizes are estimates (the rest is exact arithmetic);
the GPU smoke script prints measured peaks for comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from drmas_bench.engines import traits
from drmas_bench.types import UserError
from drmas_trainer.config.groups import WorkerGroupPlan
from drmas_trainer.config.train import OPTIMIZERS, AgentConfig, TrainConfig
from drmas_trainer.forecast.shapes import ModelShape

GIB = 2**30
#: CUDA context, cuBLAS workspaces and caching-allocator slack per process (an estimate).
PROCESS_OVERHEAD_GIB = 2.0
#: H200: 143,771 MiB reported by the driver, 140 GiB usable as a round figure.
DEFAULT_GPU_GIB = 140.0


# ----------------------------------------------------------------------------------------- the plan


@dataclass
class GroupMemory:
    """One worker group's memory items (bytes) and the facts behind them."""

    name: str
    agents: list[str]
    model: str
    shape: ModelShape
    resident: dict[str, int] = field(default_factory=dict)  # always on the GPU
    update: dict[str, int] = field(default_factory=dict)  # during this group's update only
    engine: int = 0  # the engine when awake
    engine_sleeps: bool = False  # released during updates
    host: dict[str, int] = field(default_factory=dict)  # host memory (offloaded optimiser)
    notes: list[str] = field(default_factory=list)
    adapters: list[str] = field(default_factory=list)  # LoRA: one line per adapter
    sync_bytes: int = 0  # LoRA: the largest adapter's bf16 tensors, what one sync message carries


@dataclass
class GPUPhase:
    gpu: int
    phase: str
    bytes: int
    items: str


@dataclass
class RolloutBudget:
    """One GPU's rollout under a memory budget (:func:`rollout_peak`): the engines of the worker groups
    on it share what the training state, other processes and one sync bucket leave; as many stay
    awake as fit, the least recently used of the others sleeps (weights and KV cache released)."""

    gpu: int
    budget: int  # bytes left for engines: GPU - overhead - resident states - other processes - one bucket
    engines: dict[str, int]  # group -> its engine's bytes when awake
    awake: int  # engines awake at once in the worst case (the largest ones): 0 = not even one fits
    peak: int  # the rollout's memory on this GPU with ``awake`` engines awake (no bucket)
    reason: str  # one line: the arithmetic and what it means

    @property
    def all_awake(self) -> bool:
        return self.awake >= len(self.engines)


@dataclass
class MemoryPlan:
    gpu_bytes: int
    groups: list[GroupMemory]
    gpus: list[list[str]]  # group names per GPU
    placement: str
    seq: int
    phases: list[GPUPhase]
    rollouts: list[RolloutBudget] = field(default_factory=list)  # per GPU: the rollout under the budget
    reserved_bytes: int = 0  # per GPU, held by other processes (plan.reserved_gib: a retrieval server)
    ranks: int = 1  # GPUs each group is sharded over (1: unsharded)
    together: bool = True  # groups sharing a GPU update at the same time (Ray actors); False: in turn
    memory_source: str = "--gpu-memory"  # where gpu_bytes came from (flag, recipe, default), for the header
    prompt_source: str = ""  # where the longest prompt of seq came from (flag, recipe, default), for the header

    @property
    def peak(self) -> GPUPhase:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def n_gpus(self) -> int:
        """The GPUs the layout uses: each row of ``gpus`` stands for ``ranks`` of them."""
        return self.ranks * len(self.gpus)

    @property
    def fits(self) -> bool:
        return self.peak.bytes <= self.gpu_bytes


def rollout_peak(engines: dict[str, int], budget: int) -> tuple[int, int]:
    """(engines awake at once, their bytes) for a rollout whose ``engines`` (group -> bytes when
    awake) share ``budget`` bytes of one GPU: the pool keeps awake what fits and sleeps the least
    recently used of the rest, so any set of engines may be the awake one; the guarantee is the
    largest k engines fitting together. k = 0: not even the largest one fits (the run cannot roll
    out on this GPU); k = len(engines): every engine stays awake (no wake-ups after the first).

    The budget a runtime pool should use on a GPU is ``MemoryPlan.rollouts[gpu].budget`` (bytes);
    the memory of the rollout phase is the GPU's resident states + overhead + other processes +
    the k engines, what ``MemoryPlan.rollouts[gpu].peak`` holds."""
    sizes = sorted(engines.values(), reverse=True)
    k, used = 0, 0
    for b in sizes:
        if used + b > budget:
            break
        k, used = k + 1, used + b
    return k, used


def _rollout(gpu: int, gm: list["GroupMemory"], fixed: int, reserved: int, bucket: int, gpu_bytes: int) -> RolloutBudget:
    """The rollout of one GPU under its budget (:func:`rollout_peak`), with the one-line reason. An
    engine that does not sleep (``sleep_engine: false``) is always awake: part of the fixed memory."""
    never = sum(m.engine for m in gm if not m.engine_sleeps)
    fixed += never
    engines = {m.name: m.engine for m in gm if m.engine_sleeps}
    budget = gpu_bytes - fixed - reserved - bucket
    k, used = rollout_peak(engines, max(budget, 0))
    sizes = ", ".join(f"{n} {b / GIB:.1f}" for n, b in engines.items()) or "none sleeps"
    head = (f"rollout budget on GPU {gpu}: {gpu_bytes / GIB:.1f} GiB - {fixed / GIB:.1f} training state and overhead"
            + (" (with the engines that never sleep)" if never else "")
            + (f" - {reserved / GIB:.1f} other processes" if reserved else "")
            + f" - {bucket / GIB:.1f} sync bucket = {budget / GIB:.1f} GiB for engines ({sizes} GiB)")
    if not engines:
        tail = "no engine sleeps (sleep_engine: false): all stay awake"
    elif k == 0:
        tail = "not even one engine fits: a smaller mem_fraction_static, more ranks or optimizer_offload: cpu"
    elif k >= len(engines):
        tail = "every engine stays awake" if len(engines) > 1 else "its engine stays awake"
    else:
        tail = (f"{k} of {len(engines)} awake at once, the least recently used of the others asleep "
                f"(weights and KV cache released, woken with a weight sync)")
    return RolloutBudget(gpu, budget, engines, k, fixed + reserved + used, f"{head}: {tail}")


#: the linear layers peft's "all-linear" adapts in a decoder layer (every linear but the output head)
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_params(shape: ModelShape, rank: int, target_modules: Any) -> int:
    """Parameters of one LoRA adapter of ``rank`` on ``target_modules`` ("all-linear" or names):
    rank x (fan-in + fan-out) per adapted linear layer, every decoder layer (``lm_head`` once)."""
    h, hd = shape.hidden, shape.hd
    dims = {"q_proj": (h, shape.heads * hd), "k_proj": (h, shape.kv_heads * hd), "v_proj": (h, shape.kv_heads * hd),
            "o_proj": (shape.heads * hd, h), "gate_proj": (h, shape.intermediate), "up_proj": (h, shape.intermediate),
            "down_proj": (shape.intermediate, h)}
    names = ALL_LINEAR if isinstance(target_modules, str) else tuple(target_modules)
    n = sum(rank * sum(dims[m]) for m in names if m in dims) * shape.layers
    if "lm_head" in names:
        n += rank * (h + shape.vocab)
    return n


def _lora_resident(g: GroupMemory, plan: WorkerGroupPlan, P: int, bf16: bool) -> int:
    """A LoRA group's resident and update items (module docstring); returns the adapters' total A."""
    s = plan.settings
    g.resident[f"base weights {'bf16' if bf16 else 'fp32'} (frozen)"] = (2 if bf16 else 4) * P
    A = 0
    for name, a in plan.adapters.items():
        n = lora_params(g.shape, a.lora.rank, a.lora.target_modules)
        A += n
        g.adapters.append(f"adapter {name}: rank {a.lora.rank}, {n / 1e6:.1f}M parameters")
        g.sync_bytes = max(g.sync_bytes, 2 * n)
    g.resident[f"adapters fp32 ({len(plan.adapters)})"] = 4 * A
    if s.optimizer_offload == "cpu":
        g.host["adapter optimizer + fp32 master (host)"] = (OPTIMIZERS[s.optimizer] + 8) * A
    else:
        g.resident[f"adapter optimizer {s.optimizer}"] = OPTIMIZERS[s.optimizer] * A
    g.update["adapter gradients fp32"] = 4 * A
    if bf16:
        g.update["bf16 adapter copies (autocast)"] = 2 * A
    if len(plan.agents) > 1:
        g.update["adapter gradient snapshot (several agents)"] = 4 * A
    return A


def _shard(g: GroupMemory, ranks: int, shape: ModelShape, bf16: bool) -> None:
    """A group sharded over ``ranks`` GPUs (FSDP2): its weights, gradients, optimiser state and
    snapshot are split evenly (items renamed "... / N"), host memory per GPU likewise; while a layer
    runs, its parameters are gathered whole (two layers: the next one is prefetched), and the root's
    (embeddings, final norm, output head) for the whole forward and backward."""
    if ranks <= 1:
        return
    for items in (g.resident, g.update, g.host):
        for k in [k for k in items if any(w in k for w in ("weights", "gradients", "optimizer", "snapshot", "adapter"))
                  and "copies" not in k]:
            items[f"{k} / {ranks}"] = -(-items.pop(k) // ranks)
    g.update.pop("bf16 weight copies (autocast)", None)  # sharded bf16 groups gather bf16 params instead
    b = 2 if bf16 else 4
    h = shape.hidden
    layer = (shape.params - shape.vocab * h * (1 if shape.tied else 2) - h) // shape.layers
    g.update[f"gathered layers ({'bf16' if bf16 else 'fp32'}, 2 at a time)"] = 2 * layer * b
    g.update["gathered root (embeddings, head)"] = shape.vocab * h * (1 if shape.tied else 2) * b
    g.notes.append(f"FSDP2 over {ranks} GPUs")


def group_memory(name: str, plan: WorkerGroupPlan, shape: ModelShape, *, seq: int, response: int,
                 gpu_bytes: int, ranks: int = 1) -> GroupMemory:
    """The memory items of one worker group (see the module docstring); ``ranks`` > 1: its share of
    one of the GPUs it is sharded over (:func:`_shard`)."""
    s: AgentConfig = plan.settings
    P = shape.params
    bf16 = s.dtype == "bfloat16"
    g = GroupMemory(name, list(plan.agents), str(s.model), shape)
    A = _lora_resident(g, plan, P, bf16) if plan.lora else 0
    head_trains = not plan.lora or any("lm_head" in (a.lora.target_modules if not isinstance(a.lora.target_modules, str)
                                                       else ()) for a in plan.adapters.values())
    if not plan.lora:
        g.resident["weights fp32"] = 4 * P
        opt = OPTIMIZERS[s.optimizer] * P
        if s.optimizer_offload == "cpu":
            g.host["optimizer + fp32 master (host)"] = (OPTIMIZERS[s.optimizer] + 4 + 4) * P
        else:
            g.resident[f"optimizer {s.optimizer}"] = opt
        g.update["gradients fp32"] = 4 * P
        if bf16:
            g.update["bf16 weight copies (autocast)"] = 2 * P
        if len(plan.agents) > 1:
            g.update["gradient snapshot (shared group)"] = 4 * P
    tokens = s.micro_batch_size * seq
    h, inter = shape.hidden, shape.intermediate
    act_b = 2 if bf16 else 4
    one_layer = tokens * (8 * h + 2 * shape.kv_heads * shape.hd + 3 * inter) * act_b + tokens * h * 8
    if s.gradient_checkpointing:
        g.update["activations (checkpointed, est.)"] = shape.layers * tokens * h * 4 + one_layer
    else:
        g.update["activations (all layers, est.)"] = shape.layers * one_layer
    V, resp = shape.vocab, s.micro_batch_size * response  # only response tokens reach the output layer
    if s.logprob_chunk > 0 and head_trains and plan.lora:  # an adapted head runs the full-logits path
        g.update["output layer (full logits: lm_head adapted)"] = resp * V * (act_b + 4 + 4 + 4)
    elif s.logprob_chunk > 0:
        c = min(s.logprob_chunk, resp)
        head_grad = V * h * (4 + act_b) if head_trains else 0  # a frozen head accumulates no gradient
        g.update[f"output layer (chunks of {s.logprob_chunk})"] = c * V * (4 + 4 + act_b) + head_grad
    else:  # the model's logits (compute dtype), their float32 copy, and two float32 buffers of backward
        g.update["output layer (full logits)"] = resp * V * (act_b + 4 + 4 + 4) + V * h * act_b
    reserved = traits(s.engine).gpu_memory_fraction  # an engine that reserves a static share of the GPU
    if reserved:
        option, default = reserved
        frac = float(s.engine_options.get(option, default))
        g.engine = int(frac * gpu_bytes)
        g.notes.append(f"{s.engine} {option} {frac}")
    else:
        kv = int(s.engine_options.get("max_batch", 32)) * seq * shape.layers * 2 * shape.kv_heads * shape.hd * 2
        g.engine = 2 * P + kv + 2 * A
        g.notes.append("hf engine: bf16 weights + KV cache" + (" + adapters" if A else ""))
    g.engine_sleeps = bool(s.sleep_engine)
    _shard(g, ranks, shape, bf16)
    return g


def memory_plan(cfg: TrainConfig, groups: dict[str, WorkerGroupPlan], shapes: dict[str, ModelShape], *,
                gpu_gib: float = DEFAULT_GPU_GIB, use_ray: bool = False, prompt_tokens: int = 4096,
                gpus: int | None = None, reserved_gib: float | None = None) -> MemoryPlan:
    """The plan of ``groups`` (``plan_worker_groups``) with the model ``shapes`` per group.

    Options: ``gpu_gib`` (memory of one GPU); ``use_ray`` (groups are Ray actors reserving
    ``ray.gpus_per_worker`` GPUs each: below 1, ``floor(1 / gpus_per_worker)`` groups share a GPU
    and update at the same time; otherwise one group per GPU) or in process (every group on one GPU,
    updates one after the other); ``prompt_tokens`` (longest prompt of a training row); ``gpus``
    (sharded groups, ``fsdp.ranks`` > 1 or ``gpus`` given: the node's GPUs; colocated, every group
    has a shard and an engine on each of the ``ranks`` GPUs, ``ranks`` = ``gpus`` unless the recipe
    says; separate, each group has ``gpus / groups`` GPUs of its own); ``reserved_gib`` (memory per GPU
    that other processes hold, e.g. the reference's retrieval server; default the recipe's
    ``plan.reserved_gib``)."""
    gpu_bytes = int(gpu_gib * GIB)
    reserved = int((cfg.plan.reserved_gib if reserved_gib is None else reserved_gib) * GIB)
    seq = prompt_tokens + cfg.rollout.max_new_tokens
    ranks, layout = sharding(cfg, len(groups), gpus)
    mems = [group_memory(n, p, shapes[n], seq=seq, response=cfg.rollout.max_new_tokens, gpu_bytes=gpu_bytes,
                         ranks=ranks) for n, p in groups.items()]
    if cfg.algo.use_kl_in_reward:  # KL in the reward: a frozen reference copy per full-weight group (drmas_trainer.
        for m, p in zip(mems, groups.values()):  # reference_policy); a LoRA group's reference is its own frozen base
            if not p.lora:
                m.resident.update(reference_memory(p.settings, shapes[m.name], ranks))
    names = [m.name for m in mems]
    if ranks > 1:
        use_ray = True
        if layout == "colocated":
            gpus_of = [names]  # every one of the ranks GPUs holds the same
            placement = (f"FSDP2, colocated: every group sharded over the same {ranks} GPUs, an engine per group "
                         f"on each; groups update one after the other; GPU 0 stands for each of the {ranks}")
        else:
            gpus_of = [[n] for n in names]  # one GPU of each group's own set
            placement = (f"FSDP2, separate: each group sharded over {ranks} GPUs of its own ({ranks * len(names)} "
                         f"GPUs); GPU i stands for each GPU of group i")
        return _phases(cfg, groups, mems, gpus_of, placement, seq, gpu_bytes, use_ray, together=False,
                       reserved=reserved, ranks=ranks)
    if use_ray:
        per = max(1, math.floor(1 / cfg.ray.gpus_per_worker)) if cfg.ray.gpus_per_worker < 1 else 1
        on = [names[i: i + per] for i in range(0, len(names), per)]
        placement = (f"Ray actors, gpus_per_worker {cfg.ray.gpus_per_worker:g}: {per} group(s) per GPU"
                     + (", updating at the same time" if per > 1 else ""))
    else:
        on = [names]
        placement = "in process: every group on one GPU, updates one after the other"
    return _phases(cfg, groups, mems, on, placement, seq, gpu_bytes, use_ray, together=use_ray, reserved=reserved)


def reference_memory(s: AgentConfig, shape: ModelShape, ranks: int = 1) -> dict[str, int]:
    """The frozen reference copy of a full-weight group with KL in the reward, in its compute dtype:
    whole on the group's GPU, or, sharded over ``ranks`` GPUs (``drmas_trainer.fsdp.worker``), 1/N of
    it on each (its layers are gathered one at a time during the old-log-prob pass, not the update)."""
    b = 2 if s.dtype == "bfloat16" else 4
    name = f"reference policy {'bf16' if b == 2 else 'fp32'} (frozen)"
    return {f"{name} / {ranks}": -(-b * shape.params // ranks)} if ranks > 1 else {name: b * shape.params}


def sharding(cfg: TrainConfig, n_groups: int, gpus: int | None) -> tuple[int, str]:
    """(ranks per group, layout) for a plan on ``gpus`` GPUs: the recipe's ``fsdp`` section, or, when
    it has 1 rank and ``gpus`` is given, all of them (colocated) or an equal share (separate)."""
    ranks, layout = cfg.fsdp.ranks, cfg.fsdp.layout
    if gpus and ranks == 1:
        ranks = gpus if layout == "colocated" else max(1, gpus // n_groups)
    if gpus and ranks * (1 if layout == "colocated" else n_groups) > gpus:
        raise UserError(f"fsdp.ranks {ranks} ({layout}) needs {ranks * (1 if layout == 'colocated' else n_groups)} "
                        f"GPUs; --gpus is {gpus}")
    return ranks, layout


def _phases(cfg: TrainConfig, groups: dict[str, WorkerGroupPlan], mems: list[GroupMemory], gpus: list[list[str]],
            placement: str, seq: int, gpu_bytes: int, use_ray: bool, together: bool = True, reserved: int = 0,
            ranks: int = 1) -> MemoryPlan:
    """Per GPU: rollout, update and sync phases (module docstring); ``together`` False: groups on
    one GPU update one after the other (colocated sharded groups take turns); ``reserved``: bytes
    per GPU held by other processes (a retrieval server), counted in every phase."""
    by = {m.name: m for m in mems}
    phases: list[GPUPhase] = []
    rollouts: list[RolloutBudget] = []
    for i, gnames in enumerate(gpus):
        gm = [by[n] for n in gnames]
        base = int(PROCESS_OVERHEAD_GIB * GIB) * (len(gm) if use_ray else 1) + reserved
        resident = sum(sum(m.resident.values()) for m in gm)
        bucket = max(m.sync_bytes or groups[m.name].settings.sync_bucket_mb << 20 for m in gm)  # LoRA: one adapter
        ro = _rollout(i, gm, base - reserved + resident, reserved, bucket, gpu_bytes)
        rollouts.append(ro)
        what = ("resident states + every engine awake" if ro.all_awake else
                f"resident states + {max(ro.awake, 1)} of {len(ro.engines)} sleeping engines awake (budget)")
        rollout = ro.peak + (0 if ro.awake or not ro.engines else max(ro.engines.values()))  # none fits: the largest
        phases.append(GPUPhase(i, "rollout", rollout, what))
        awake = sum(m.engine for m in gm if not m.engine_sleeps)
        if use_ray and together and len(gm) > 1:
            extra = sum(sum(m.update.values()) for m in gm)
            phases.append(GPUPhase(i, "update (all groups at once)", base + resident + awake + extra,
                                   "resident + every group's update extras + engines that do not sleep"))
        else:
            for m in gm:
                phases.append(GPUPhase(i, f"update {m.name}", base + resident + awake + sum(m.update.values()),
                                       f"resident + {m.name}'s update extras + engines that do not sleep"))
        phases.append(GPUPhase(i, "sync", rollout + bucket, "rollout memory + one weight bucket"))
    return MemoryPlan(gpu_bytes, mems, gpus, placement, seq, phases, rollouts, reserved, ranks, together)


def _g(b: float) -> str:
    return f"{b / GIB:7.1f}"


def format_plan(plan: MemoryPlan, recipe: str = "") -> str:
    """The plan as text: per group its items (GiB), then per GPU each phase against the GPU."""
    out = [f"memory plan{' for ' + recipe if recipe else ''}: GPU {plan.gpu_bytes / GIB:.0f} GiB ({plan.memory_source}), "
           f"{plan.placement}; sequence {plan.seq} tokens (prompt + max_new_tokens"
           + (f"; the prompt: {plan.prompt_source}" if plan.prompt_source else "") + ")"]
    for m in plan.groups:
        out.append(f"\nworker group {m.name} (agents {', '.join(m.agents)}): {m.model}, "
                   f"{m.shape.params / 1e9:.2f}B parameters [{m.shape.source}]")
        out.extend(f"  {line} (LoRA; the base frozen)" for line in m.adapters)
        out.append(f"  {'item':<50} {'GiB':>7}  when")
        for k, v in m.resident.items():
            out.append(f"  {k:<50} {_g(v)}  always")
        for k, v in m.update.items():
            out.append(f"  {k:<50} {_g(v)}  its update")
        out.append(f"  {'rollout engine (' + '; '.join(m.notes) + ')':<50} {_g(m.engine)}  "
                   + ("awake except during updates (sleep_engine)" if m.engine_sleeps else "always (sleep_engine false)"))
        for k, v in m.host.items():
            out.append(f"  {k:<50} {_g(v)}  host memory, not GPU")
    out.append("")
    out.append(f"  {'GPU':<4} {'phase':<30} {'GiB':>7}  {'of':>5}  verdict")
    for p in plan.phases:
        ok = "fits" if p.bytes <= plan.gpu_bytes else "DOES NOT FIT"
        out.append(f"  {p.gpu:<4} {p.phase:<30} {_g(p.bytes)}  {plan.gpu_bytes / GIB:5.0f}  {ok}  ({p.items})")
    if plan.reserved_bytes:
        out.append(f"  every phase counts {plan.reserved_bytes / GIB:.1f} GiB per GPU held by other processes "
                   f"(plan.reserved_gib)")
    out.extend(f"  {r.reason}" for r in plan.rollouts)
    pk = plan.peak
    out.append(f"peak: {pk.phase} on GPU {pk.gpu}, {pk.bytes / GIB:.1f} GiB of {plan.gpu_bytes / GIB:.0f} GiB: "
               + ("fits" if plan.fits else "does not fit"))
    out.extend(why_not(plan))
    return "\n".join(out)


def why_not(plan: MemoryPlan) -> list[str]:
    """What makes each phase that does not fit too large, one line each: for a rollout or sync, the
    budget arithmetic and the ``mem_fraction_static`` under which one engine would fit beside the
    rest; for an update, the training state's items and what shrinks them."""
    by = {m.name: m for m in plan.groups}
    lines = []
    for p in plan.phases:
        if p.bytes <= plan.gpu_bytes:
            continue
        ro = plan.rollouts[p.gpu] if plan.rollouts else None
        gm = [by[n] for n in plan.gpus[p.gpu]]
        if p.phase in ("rollout", "sync") and ro is not None and ro.engines:
            line = f"why: {p.phase} on GPU {p.gpu}: {ro.reason}"
            frac = (ro.budget / plan.gpu_bytes) if ro.budget > 0 else 0.0
            if frac > 0 and all("mem_fraction_static" in " ".join(m.notes) for m in gm if m.name in ro.engines):
                line += f"; one engine fits with engine_options.mem_fraction_static <= {math.floor(frac * 100) / 100:.2f}"
            lines.append(line)
            continue
        awake = [m for m in gm if not m.engine_sleeps]
        eng = sum(m.engine for m in awake)
        rest = p.bytes - eng
        line = f"why: {p.phase} on GPU {p.gpu} = " + (f"{eng / GIB:.1f} GiB of {len(awake)} engine(s) that do not sleep + "
                                                     if awake else "") + f"{rest / GIB:.1f} GiB of training state and overhead"
        if rest < plan.gpu_bytes and awake and all("mem_fraction_static" in " ".join(m.notes) for m in awake):
            frac = (plan.gpu_bytes - rest) / len(awake) / plan.gpu_bytes
            line += (f"; it fits with engine_options.mem_fraction_static <= {math.floor(frac * 100) / 100:.2f} "
                     f"per engine, or sleep_engine: true")
        else:
            items = {k: v for m in gm for k, v in (*m.resident.items(), *(m.update.items() if m.name in p.phase or
                                                                              "all groups" in p.phase else ()))}
            big = max(items, key=lambda k: items[k]) if items else ""
            fixes = ["more ranks (--gpus)"]
            fixes += ["optimizer_offload: cpu"] if any(any(k.startswith("optimizer") for k in m.resident) for m in gm) else []
            fixes += ["a smaller micro_batch_size"] if any(k.startswith("activations") for k in items) else []
            fixes += ["gradient_checkpointing"] if any(k.startswith("activations (all") for k in items) else []
            line += (f" (the largest item: {big} {items[big] / GIB:.1f} GiB)" if big else "") \
                + "; the training state alone exceeds the GPU: " + ", ".join(fixes)
        lines.append(line)
    return lines
