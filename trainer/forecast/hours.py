"""How long a training run takes, predicted before launch (``drmas-bench train --plan``): the time of
one step per phase and of the whole run, from the hardware's published figures, the models'
shapes, the recipe and the workload of one step (the recipe's ``plan:`` section).

    est = predict(cfg, groups, shapes, memplan, HARDWARE["h100"], gpu="h100", gpus=4, tasks=17917)
    print(format_hours(est))   # drmas_bench.commands.train.plan_recipe(cfg) makes memplan and est in one call

Per step (B = prompts_per_step x n episodes; each group's engine runs on every one of the N GPUs
with the step's batch split evenly, TP 1; P = a group's parameters; W = 2P bytes of bf16 weights):

- **rollout**, per generate call of the step's :class:`~drmas_trainer.forecast.workload.Workload`
  (in order; the batch waits for its longest response): b = share x B / N sequences per engine,
  its prompt p, mean response r and longest response L (the recipe's point: p = ``question_tokens``
  + ``context_tokens``, r = ``response_share`` x max_new_tokens, L = max_new_tokens; its low and
  high ends and a measured run give others).
  - *prefill*: b x p x F(p / 2) FLOPs at the hardware's bf16 peak x :data:`MFU`;
  - *decode*: memory bound: L x W (weights read every decode step) + b x r x (p + r / 2) x
    KV bytes per token (the cache read by every decode step), at HBM bandwidth x :data:`MBU`; or
    compute bound, b x r x 2P FLOPs at the peak x :data:`MFU`, whichever takes longer.
- **update**, per worker group (in turn on the same GPUs when colocated; at the same time on
  separate GPUs): T = the tokens of its agents' rows (share x B x (p + r) per call), F(ctx / 2)
  FLOPs per token per forward, forwards per token = old log-probs (1, ``old_logprobs:
  recompute``) + reference policy (1, KL in the reward) + ppo_epochs x (3 forward and backward,
  + 1 recompute with gradient checkpointing), over the group's ranks GPUs at the peak x
  :data:`MFU`; with ``optimizer_offload: cpu`` each optimizer step moves 8P / ranks bytes over
  PCIe (fp32 gradients down, fp32 weights up) and AdamW reads and writes 28P / ranks bytes of host
  memory (a node's host bandwidth shared by its GPUs).
- **weight syncs and wake-ups**: an engine woken after sleeping gets its weights again (the update
  holds every engine asleep, so each group's first call of a step is one); under the rollout's
  budget (``MemoryPlan.rollouts``: k engines awake at once, least recently used asleep) each call
  whose engine was put to sleep is another. Each moves W: gathered over NVLink from the other
  ranks' shards ((N - 1) / N x W) and written into the engine (2 x W of HBM traffic).

**On this machine** (``--gpu here``: its CPU, measured by drmas_trainer.forecast.hardware_probe), a
group whose engine is ``hf`` decodes as that engine was measured to, not at the copy bandwidth:
its products read the weights (P x the engine dtype's bytes, per block of ``DecodeCost.rows`` rows in
the batch-invariant decode) at the rate a decode-shaped product reached, and every forward pays the
step's other costs (each layer's ops, attention per row, sampling over the vocabulary), measured on
narrow random models of the same family: per prompt alone in its prefill (invariant) or once per
batch (padded), and at every decode step for the rows still decoding. A weight sync there is one
copy, read in the trainer's dtype and written in the engine's, at the copy bandwidth.

F(c) = 2P + 4 x layers x c x heads x head_dim: a token's forward FLOPs (matrix products and the
attention over c earlier tokens). **Validation**: each of the run's validations (before training,
every ``val.every`` steps, the last step) is the workload's calls over questions x ``val.n``
episodes, generation only; the total is the steps plus the validations. Not modelled: the retrieval
server's latency, the reward (math grading), checkpoints, start-up, and the wait for stragglers
beyond the longest response. No constant here was fitted to the reference's reported hours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drmas_bench.benchmarks import catalog
from drmas_bench.engines.footprint import DTYPE_BYTES
from drmas_bench.types import UserError
from drmas_trainer.forecast.hardware import HARDWARE, MBU, MFU, Hardware, hardware_for  # noqa: F401 (re-exported)
from drmas_trainer.forecast.workload import Workload, stated

__all__ = ["HARDWARE", "MBU", "MFU", "Hardware", "HoursEstimate", "format_hours", "hardware_for", "predict",
           "training_prompts"]

if TYPE_CHECKING:
    from drmas_trainer.config.groups import WorkerGroupPlan
    from drmas_trainer.config.train import TrainConfig
    from drmas_trainer.forecast.hardware_probe import DecodeCost
    from drmas_trainer.forecast.memory import MemoryPlan
    from drmas_trainer.forecast.shapes import ModelShape


def forward_flops(shape: "ModelShape", ctx: float) -> float:
    """A token's forward FLOPs attending to ``ctx`` earlier tokens: 2 per parameter (matrix products)
    + 4 x layers x ctx x heads x head_dim (scores and the weighted sum)."""
    return 2 * shape.params + 4 * shape.layers * ctx * shape.heads * shape.hd


def kv_bytes_per_token(shape: "ModelShape") -> int:
    """The engine's bf16 KV cache per token: keys and values of every layer."""
    return shape.layers * 2 * shape.kv_heads * shape.hd * 2


@dataclass
class Call:
    """One generate call of a step, as the model computes it (seconds per phase)."""

    agent: str
    group: str
    batch: float  # sequences per engine (per GPU)
    prompt: float  # mean prompt tokens
    response: float  # mean response tokens
    longest: float = 0.0  # the longest response: decode steps the batch waits for
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_bound: str = ""  # "memory" | "compute"
    wakes: int = 0  # 1 when its engine was asleep (a weight sync)


@dataclass
class HoursEstimate:
    gpu: str
    hardware: Hardware
    gpus: int
    steps: int | None  # None: the number of training prompts is unknown (a path that is not there)
    steps_why: str
    calls: list[Call]
    update_s: dict[str, float]  # group -> its update's compute
    offload_s: dict[str, float]  # group -> its optimizer offload traffic
    update_wall_s: float  # the update phase: groups in turn (colocated) or at once (separate)
    sync_s: float
    syncs: int  # weight syncs (wake-ups) per step
    reported_hours: float | None = None
    notes: list[str] = field(default_factory=list)
    workload: str = ""  # where the step's workload comes from (Workload.source)
    val_count: int = 0  # validations in the run (before training, every val.every steps, the last step)
    val_episodes: int = 0  # episodes of one validation: questions x val.n
    val_s: float = 0.0  # one validation's generation: the workload's calls over val_episodes episodes
    sources: dict[str, str] = field(default_factory=dict)  # figure -> where it came from (flag, recipe, default)
    low_hours: float | None = None  # the range (drmas_trainer.forecast.outlook); None: a measured workload
    high_hours: float | None = None
    parts: dict[str, tuple[float, float]] = field(default_factory=dict)  # unknown -> its own (low, high) hours
    decode_sources: dict[str, str] = field(default_factory=dict)  # group -> its decode as measured here

    @property
    def rollout_s(self) -> float:
        return sum(c.prefill_s + c.decode_s for c in self.calls)

    @property
    def step_s(self) -> float:
        return self.rollout_s + self.update_wall_s + self.sync_s

    @property
    def train_hours(self) -> float | None:
        """The steps alone, without validation."""
        return None if self.steps is None else self.steps * self.step_s / 3600

    @property
    def val_hours(self) -> float:
        return self.val_count * self.val_s / 3600

    @property
    def hours(self) -> float | None:
        """The run's predicted total: its steps and its validations (as the reference's wall clock)."""
        return None if self.train_hours is None else self.train_hours + self.val_hours


def _lru_wakes(order: list[str], capacity: int) -> list[int]:
    """Per call, 1 when its engine must wake: every engine starts asleep (the update holds them
    asleep), at most ``capacity`` stay awake, the least recently used sleeps first."""
    awake: list[str] = []  # least recently used first
    out = []
    for g in order:
        if g in awake:
            awake.remove(g)
            out.append(0)
        else:
            if len(awake) >= max(capacity, 1):
                awake.pop(0)
            out.append(1)
        awake.append(g)
    return out


def training_prompts(cfg: "TrainConfig") -> tuple[int | None, str]:
    """(distinct training prompts, where the figure comes from) without loading the data: a
    registry benchmark's size, the toy generator's, or a local file's line count; None if unknown."""
    src = cfg.data.source
    n: int | None = None
    if src == "toy":
        n, why = cfg.data.size, "toy data.size"
    elif src.startswith("benchmark:"):
        catalog.known_names()
        names = [x.strip() for x in src.split(":", 1)[1].split(",") if x.strip()]
        if all(x in catalog.BENCHMARKS for x in names):
            n = sum(catalog.BENCHMARKS[x].expected_rows for x in names)
            why = f"{src}: {n:,} prompts (the registry's size)"
        else:
            why = f"{src}: unknown size"
    elif Path(src).is_file() and src.endswith(".jsonl"):
        with open(src, "rb") as f:
            n = sum(1 for line in f if line.strip())
        why = f"{src}: {n:,} lines"
    else:
        why = f"{src}: size unknown before loading"
    if n is not None and cfg.data.limit is not None:
        n, why = min(n, cfg.data.limit), why + f", data.limit {cfg.data.limit}"
    return n, why


def predict(cfg: "TrainConfig", groups: dict[str, "WorkerGroupPlan"], shapes: dict[str, "ModelShape"],
            memplan: "MemoryPlan", hw: Hardware, *, gpu: str, gpus: int, tasks: int | None,
            tasks_why: str = "", workload: Workload | None = None,
            decode: dict[str, "DecodeCost"] | None = None) -> HoursEstimate:
    """The hours of ``cfg`` (module docstring) on ``gpus`` GPUs of ``hw``, its groups laid out as in
    ``memplan`` (ranks per group; colocated or separate; engines awake at once under the rollout
    budget); ``tasks``: distinct training prompts (None: the run's length in steps is unknown when
    the recipe counts epochs); ``workload``: the step's (default: the point the recipe's ``plan:``
    states); ``decode``: per group, its hf engine's decode measured on this machine
    (drmas_trainer.forecast.hardware_probe.decode_cost; ``--gpu here``), which replaces the decode
    and weight-sync terms of the published figures (module docstring, "On this machine")."""
    ranks = max(memplan.ranks, 1)  # a group's engines and shards: one per GPU of its `ranks` GPUs
    workload = workload or stated(cfg, [a for p in groups.values() for a in p.agents])
    decode = decode or {}
    calls = _calls(workload, cfg, groups, shapes, hw, ranks, decode=decode)
    capacity = min((ro.awake for ro in memplan.rollouts if ro.engines), default=len(groups))
    for call, w in zip(calls, _lru_wakes([c.group for c in calls], capacity)):
        call.wakes = w
    update_s, offload_s = _updates(cfg, groups, shapes, calls, hw, ranks, gpus)
    per_group = {g: update_s[g] + offload_s.get(g, 0.0) for g in groups}
    # every group on the same GPUs: their updates take turns; each on GPUs of its own: at the same time
    update_wall = sum(per_group.values()) if len(memplan.gpus) == 1 else max(per_group.values())
    sync_s = 0.0
    for c in calls:
        if c.wakes and c.group in decode:  # read in the trainer's dtype, written in the engine's: one copy
            src = DTYPE_BYTES[groups[c.group].settings.dtype]
            sync_s += (src + decode[c.group].weight_bytes) * shapes[c.group].params / hw.hbm_bytes_s
        elif c.wakes:
            W = 2 * shapes[c.group].params
            sync_s += W * (ranks - 1) / ranks / hw.nvlink_bytes_s + 2 * W / hw.hbm_bytes_s
    steps, steps_why = run_steps(cfg, tasks, tasks_why)
    pc = cfg.plan
    reported = pc.reported_hours if gpu == (pc.gpu or gpu) else None  # only beside the reference's own hardware
    est = HoursEstimate(gpu, hw, gpus, steps, steps_why, calls, update_s, offload_s, update_wall, sync_s,
                        sum(c.wakes for c in calls), reported, workload=workload.source,
                        decode_sources={g: d.source for g, d in decode.items()})
    if steps is not None:  # validation: the same calls over its questions x val.n episodes
        est.val_count, est.val_episodes = validations(cfg, steps)
        if est.val_count:
            est.val_s = sum(c.prefill_s + c.decode_s for c in _calls(workload, cfg, groups, shapes, hw, ranks,
                                                                     episodes=est.val_episodes, decode=decode))
    return est


def run_steps(cfg: "TrainConfig", tasks: int | None, tasks_why: str) -> tuple[int | None, str]:
    """(the run's RL steps, where the figure comes from); None when it counts epochs of a training set
    of unknown size."""
    if cfg.epochs is None:
        return cfg.steps, f"steps {cfg.steps}"
    if tasks is None:
        return None, f"epochs {cfg.epochs:g} over {tasks_why}"
    return (max(1, math.ceil(cfg.epochs * tasks / cfg.rollout.prompts_per_step)),
            f"epochs {cfg.epochs:g} x {tasks_why} / {cfg.rollout.prompts_per_step} prompts per step")


def validations(cfg: "TrainConfig", steps: int) -> tuple[int, int]:
    """(validations in a run of ``steps`` steps, episodes of each: questions x val.n), (0, 0) when
    validation is off; as drmas_trainer.validation counts them (before training, every val.every
    steps and at the last step)."""
    v = cfg.val
    if not v.active:
        return 0, 0
    count = int(v.before_train) + (sum(1 for s in range(1, steps + 1) if s % v.every == 0 or s == steps)
                                   if v.every else 0)
    questions = 0
    for b in v.benchmarks or []:
        rows = catalog.get_benchmark(b).expected_rows
        questions += min(v.limit, rows) if v.limit else rows
    return count, questions * v.n


def _calls(workload: Workload, cfg: "TrainConfig", groups: dict[str, "WorkerGroupPlan"],
           shapes: dict[str, "ModelShape"], hw: Hardware, ranks: int, episodes: int | None = None,
           decode: dict[str, "DecodeCost"] | None = None) -> list[Call]:
    """The step's generate calls with their prefill and decode seconds (module docstring), from
    ``workload`` (drmas_trainer.forecast.workload: stated by the recipe or measured) over ``episodes``
    episodes (default a step's: prompts_per_step x n); a group in ``decode`` decodes as measured."""
    group_of = {a: g for g, p in groups.items() for a in p.agents}
    B = episodes or cfg.rollout.prompts_per_step * cfg.rollout.n
    eff_flops, eff_bw = hw.flops_used, hw.bytes_used
    calls: list[Call] = []
    for c in workload.calls:
        if c.agent not in group_of:
            where = f"--workload ({workload.source})" if workload.measured else "plan.calls"
            raise UserError(f"{where}: unknown agent {c.agent!r}; the workflow's agents: {', '.join(group_of)}")
        g = group_of[c.agent]
        sh = shapes[g]
        b, p, r, L = c.share * B / ranks, c.prompt_tokens, c.mean_response, c.longest_response
        call = Call(c.agent, g, b, p, r, longest=L)
        call.prefill_s = b * p * forward_flops(sh, p / 2) / eff_flops
        kv = b * r * (p + r / 2) * kv_bytes_per_token(sh)
        dc = (decode or {}).get(g)
        if dc is None:
            mem = L * 2 * sh.params + kv
            comp = b * r * 2 * sh.params
            call.decode_s, call.decode_bound = max((mem / eff_bw, "memory"), (comp / eff_flops, "compute"))
        else:
            call.prefill_s += (b * dc.step_overhead_s(1, sh.layers) if dc.invariant  # each prompt alone
                               else dc.step_overhead_s(b, sh.layers))
            blocks = math.ceil(b / dc.rows) if dc.invariant else 1  # the invariant decode's padded blocks
            mem = L * blocks * dc.weight_bytes * sh.params / dc.weight_bytes_s + kv / eff_bw
            comp = b * r * 2 * sh.params / eff_flops
            rows = b * r / max(L, 1e-9)  # the rows still decoding, on average over the call's L steps
            call.decode_s, call.decode_bound = max((mem, "memory"), (comp, "compute"))
            call.decode_s += L * dc.step_overhead_s(rows, sh.layers)
        calls.append(call)
    return calls


def _updates(cfg: "TrainConfig", groups: dict[str, "WorkerGroupPlan"], shapes: dict[str, "ModelShape"],
             calls: list[Call], hw: Hardware, ranks: int, gpus: int) -> tuple[dict[str, float], dict[str, float]]:
    """Per group: its update's compute seconds, and its optimizer offload's (module docstring)."""
    update_s: dict[str, float] = {}
    offload_s: dict[str, float] = {}
    for g, plan in groups.items():
        sh, s = shapes[g], plan.settings
        rows = [(c.batch * ranks, c.prompt + c.response) for c in calls if c.group == g]  # (rows, tokens per row)
        tokens = sum(n * t for n, t in rows)
        ctx = sum(n * t * t / 2 for n, t in rows) / max(tokens, 1e-9)  # F is linear in ctx: exact for the sum
        passes = (1 if cfg.rollout.old_logprobs == "recompute" else 0) + (1 if cfg.algo.use_kl_in_reward else 0) \
            + cfg.algo.ppo_epochs * (3 + (1 if s.gradient_checkpointing else 0))
        update_s[g] = tokens * forward_flops(sh, ctx) * passes / (ranks * hw.flops_used)
        if s.optimizer_offload == "cpu" and not plan.lora:
            opt_steps = cfg.algo.ppo_epochs * cfg.algo.mini_batches
            sharing = min(hw.gpus_per_node, gpus)  # the ranks of one node step at once on its host memory
            offload_s[g] = opt_steps * (8 * sh.params / ranks / hw.pcie_bytes_s
                                        + 28 * sh.params / ranks / (hw.host_bytes_s / sharing))
    return update_s, offload_s


def format_hours(est: HoursEstimate) -> str:
    """The prediction as text: per call its prefill and decode, then the step's phases and the run."""
    hw = est.hardware
    whence = "; ".join(f"{k}: {v}" for k, v in est.sources.items())
    mfu, mbu = hw.flops_used / hw.bf16_flops, hw.bytes_used / hw.hbm_bytes_s
    out = [f"\nhours on {est.gpus} x {hw.title}" + (f" ({whence})" if whence else "") + f" [{hw.source}]: "
           f"{hw.bf16_flops / 1e12:.3g} TFLOP/s at MFU {mfu:.2f}, memory {hw.hbm_bytes_s / 1e12:.3g} TB/s at MBU "
           f"{mbu:.2f}, NVLink {hw.nvlink_bytes_s / 1e9:.0f} GB/s, PCIe {hw.pcie_bytes_s / 1e9:.0f} GB/s (one direction)",
           *(f"  decode of {g}: {src}" for g, src in est.decode_sources.items()),
           f"  {'call':<22} {'seq/GPU':>8} {'prompt':>7} {'resp':>6} {'max':>5} {'prefill s':>10} {'decode s':>9}  bound"
           "   wake"]
    for i, c in enumerate(est.calls, 1):
        out.append(f"  {f'{i}. {c.agent} ({c.group})':<22} {c.batch:8.1f} {c.prompt:7.0f} {c.response:6.0f} {c.longest:5.0f} "
                   f"{c.prefill_s:10.1f} {c.decode_s:9.1f}  {c.decode_bound:<7} {'yes' if c.wakes else 'no'}")
    upd = ", ".join(f"{g} {s:.1f}" + (f" + offload {est.offload_s[g]:.1f}" if g in est.offload_s else "")
                    for g, s in est.update_s.items())
    out.append(f"  step: rollout {est.rollout_s:.1f} s + update {est.update_wall_s:.1f} s ({upd}) + "
               f"{est.syncs} weight sync(s) {est.sync_s:.1f} s = {est.step_s:.1f} s")
    out.extend(_run_lines(est))
    return "\n".join(out)


#: Below this predicted step time the GPU figures say nothing about a run: a step's fixed costs
#: (Python, engine calls, host-device transfers; seconds on the tiny recipes, docs/trainer.md) dwarf it.
TOO_SHORT_S = 1.0


def _run_lines(est: HoursEstimate) -> list[str]:
    """The run's lines: its steps, its validations, the total; the range and the reference's hours."""
    if est.hours is None or est.train_hours is None:
        return [f"  run: unknown number of steps ({est.steps_why})"]
    if est.step_s < TOO_SHORT_S and est.hardware.mfu is None:  # a GPU of the table, not this machine measured
        return [f"  run: {est.steps:,} steps; no hours for this recipe on a GPU: its models are too small for GPU "
                f"figures to mean anything (the model counts {est.step_s * 1e3:.1f} ms of GPU work per step; the "
                f"fixed costs of a step it does not model, Python, engine calls and transfers, take seconds). "
                f"Time a short run instead: train --steps 2"]
    out = [f"  run: {est.steps:,} steps ({est.steps_why}) x {est.step_s:.1f} s = {est.train_hours:.1f} h"]
    if est.val_count:
        out.append(f"  validation: {est.val_count} validation(s) (before training, every val.every steps, the last "
                   f"step) x {est.val_episodes:,} episodes, each the step's calls over them: {est.val_s:.1f} s = "
                   f"{est.val_hours:.1f} h")
    else:
        out.append("  validation: off")
    line = f"  total: steps + validation = {est.hours:.1f} h predicted"
    if est.reported_hours:
        line += f"; the reference reports ~{est.reported_hours:g} h (ratio {est.hours / est.reported_hours:.2f})"
    out.append(line)
    if est.low_hours is not None and est.high_hours is not None:
        out.append(f"  range: {est.low_hours:.1f} - {est.high_hours:.1f} h (high/low {est.high_hours / est.low_hours:.2f}) "
                   f"from the recipe's stated bounds on the unknowns (plan.bounds, plan.calls' share_low / share_high: "
                   f"the longest response, early stopping); a measured workload narrows it")
        if est.parts:
            out.append("  each unknown alone (the other at the point): " + "; ".join(
                f"{k} {lo:.1f} - {hi:.1f} h" for k, (lo, hi) in est.parts.items()))
    out.append(f"  workload: {est.workload}")
    return out


def as_dict(est: HoursEstimate) -> dict[str, Any]:
    """The figures a table of rows needs."""
    return {"step_s": est.step_s, "rollout_s": est.rollout_s, "update_s": est.update_wall_s, "sync_s": est.sync_s,
            "syncs": est.syncs, "steps": est.steps, "val_s": est.val_s, "validations": est.val_count,
            "hours": est.hours, "low_hours": est.low_hours, "high_hours": est.high_hours,
            "reported_hours": est.reported_hours}
