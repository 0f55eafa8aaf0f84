"""A worker group: one policy (a Hugging Face causal LM) with its AdamW optimiser and its rollout
engine, serving one or more logical agents (REFERENCE.md §5).

    wg = WorkerGroup("solver", ["solver"], settings, model_path, device="cpu")
    await wg.start_engine()                        # hf on CPU, sglang on GPU: the rollout engine
    completions = await wg.generate(requests)      # what the harness's TeamRuntime calls
    metrics = await wg.update(rows, epochs=1, mini_batches=1, loss=LossSettings())
    await wg.sync_weights()                        # engine.update_weights(policy weights)
    await wg.save(folder, optimizer_path)          # HF folder (safetensors) + optimiser state

Every method is ``async`` so that the trainer drives an in-process group and a Ray actor
(``ray_workers.py``) with the same code; compute runs synchronously inside them.

**update(rows)** runs ``epochs`` passes; each pass shuffles the rows (seeded) and splits them into
``mini_batches`` mini-batches, one optimiser step each. A mini-batch is split into micro-batches of
``micro_batch_size`` rows whose losses are scaled by their share of the mini-batch (tokens for
``token-mean``, rows for the ``seq-mean`` aggregations) before ``backward``, so the accumulated
gradient equals that of the whole mini-batch's loss exactly. Then the global gradient norm is
clipped to ``grad_clip`` and AdamW steps.

**Per-agent gradient norms.** In a group that serves one agent the agent's norm is the group's
(pre-clip) norm. In a shared group, micro-batches are formed per agent and, after each agent's
micro-batches, the gradient accumulated so far is compared with a snapshot taken before them: the
difference is exactly the gradient of that agent's loss term (accumulation is linear). Its norm,
divided by the agent's share of the mini-batch, is the norm of the gradient of the agent's own
token-mean loss, comparable with a non-shared group's norm. Cost: one extra copy of the gradients
(parameter-sized memory) while the group's agents are accumulated, and one pass over the gradients
per agent; no extra forward or backward passes.

**Non-finite steps.** A non-finite micro-batch loss stops the mini-batch; a non-finite gradient
norm is caught after accumulation. Either way the gradients are dropped, the optimiser does not
step (its state is untouched), and ``skipped_steps`` counts it. Parameters therefore stay finite,
and :meth:`save` refuses to write non-finite weights anyway. The supervised warm start (:meth:`sft`)
has the same guard, and stops after ``SFT_MAX_BAD_IN_A_ROW`` skipped steps in a row.

**Where the rest lives.** The log-prob numerics (chunked vocabulary projection, the full-logits
reference, row packing) are pure tensor functions in ``drmas_trainer.logprobs``; the optimiser
(AdamW, 8-bit, CPU-offloaded) is built by ``drmas_trainer.optim``; rows, loss settings and the
micro-batching helpers are ``drmas_trainer.rows``; the warm start is ``drmas_trainer.sft``. This
file is the stateful group that ties them to a policy and a rollout engine, with the hooks
(``_share``, ``_all_sum``, ``_full``, ...) that ``drmas_trainer.fsdp.worker`` overrides to shard
the group over several ranks (FSDP2) with the same update.

**Memory.** After an update, ``sync_weights`` empties the CUDA cache before the engine wakes and
hands the engine a lazy generator of bf16 tensors (``update_weights(..., bucket_bytes=sync_bucket_mb
MiB)`` when the engine takes buckets). The plan of all of it per GPU: ``drmas_trainer.forecast.memory``
(``train --plan``).

**The engine's lifecycle** (``drmas_trainer.engine_lifecycle``): an update marks the engine's
weights *stale*; ``generate`` and ``engine_wake`` sync a stale engine before it serves, so a
request never meets old weights, whoever woke the engine; syncs, wakes, sleeps and generate calls
are counted for the step's metrics.

**Precision.** Weights and AdamW state are float32; ``dtype: bfloat16`` runs the forward/backward
under bf16 autocast and hands the engine bf16 copies (bytes per parameter: ``drmas_trainer.optim``).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import random
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

from drmas_bench.checkpoints.copies import node_copy
from drmas_bench.checkpoints.layout import is_url, upload
from drmas_bench.engines.base import resolve_model_path
from drmas_bench.engines.hosting import fit_options, host_engine
from drmas_bench.models.loading import load_causal_lm
from drmas_bench.types import Completion, Request, SFTExample, UserError
from drmas_trainer.config.train import AgentConfig
from drmas_trainer.engine_lifecycle import EngineLifecycle
from drmas_trainer.logprobs import pack_rows, token_logprobs
from drmas_trainer.lora_group import LoraAdapters
from drmas_trainer.losses import policy_loss
from drmas_trainer.optim import local, make_adapter_optimizers, make_optimizer, release_cached_memory
from drmas_trainer.row_scoring import RowScoring
from drmas_trainer.rows import Acc, LossSettings, Row, chunks, row_weights, split
from drmas_trainer.sft import SFT_MAX_BAD_IN_A_ROW, SFT_REPORT_EVERY_S, WarmStart

__all__ = ["SFT_MAX_BAD_IN_A_ROW", "SFT_REPORT_EVERY_S", "LossSettings", "Row", "SFTExample", "WorkerGroup"]


# ----------------------------------------------------------------------------------------- the group


class WorkerGroup(RowScoring, LoraAdapters, WarmStart, EngineLifecycle):
    """Policy + optimiser + rollout engine for the agents of one worker group (module docstring).

    Args:
        name: the group's name (``solver``, ``shared``...).
        agents: logical agents this group serves.
        settings: the group's settings (lr, weight decay, betas, grad clip, micro-batch size, engine,
            engine options, dtype, gradient checkpointing, sleep_engine).
        model_path: local folder (or hub id) to load the policy and tokenizer from; a checkpoint URL
            (``ROOT/step_K/models/<wg>``, drmas_bench.checkpoints.layout) is first downloaded on this node.
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda[:N]"``.
        seed: seeds torch in this process (parameters are loaded, not drawn, so it matters little).
        torch_threads: torch intra-op threads for this process.
        max_batch: default engine micro-batch size, for engines that batch (``engine_options`` may
            override it).
        adapters: LoRA (``drmas_trainer.lora``): adapter name -> its settings (lr, betas, ..., ``lora``);
            the base stays frozen and each adapter has its own optimiser. ``model_path`` is then the
            base model, or a checkpoint's adapter folder to resume from. None: full weights.
        adapter_of: LoRA: agent -> the adapter its rows train and its requests are served with.
    """

    def __init__(self, name: str, agents: list[str], settings: AgentConfig, model_path: str, *,
                 device: str = "auto", seed: int = 0, torch_threads: int | None = None, max_batch: int = 64,
                 adapters: dict[str, AgentConfig] | None = None, adapter_of: dict[str, str] | None = None) -> None:
        hf_logging.disable_progress_bar()  # no "Loading weights" / "Writing model shards" bars per step

        if torch_threads:
            torch.set_num_threads(torch_threads)
        torch.manual_seed(seed)
        self.name = name
        self.agents = list(agents)
        self.settings = settings
        if is_url(model_path):  # resuming from a URL checkpoint root: this node's own copy (a rank's own)
            model_path = str(node_copy(model_path, owner=self._copy_owner))
        self.model_path = resolve_model_path(model_path)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        # fp32 master weights and AdamW state always; dtype bfloat16 = compute under autocast (an update
        # of lr 1e-6 would round away in bf16 weights), and the engine gets bf16 copies
        self.compute_dtype = getattr(torch, settings.dtype)
        self.adapters = dict(adapters or {})
        self.adapter_of = dict(adapter_of or {})
        self.base_ref = settings.model or self.model_path  # LoRA: what a checkpoint names as the base
        self._engine_dir: str | None = None  # LoRA: the adapters folder the engine started from
        try:
            if self.adapters:
                self._load_lora_policy()
            else:
                self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
                self.policy = load_causal_lm(self.model_path, dtype=torch.float32)  # one load at a time (base.py)
        except (OSError, ValueError) as e:
            raise UserError(f"worker group {name}: cannot load {model_path!r}: {' '.join(str(e).split())[:200]}") from None
        self.policy.to(self.device)
        self.policy.train()
        if settings.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self._wrap_policy()  # sharded groups: fully_shard here, so the optimiser gets the shards
        self.params = [p for p in self.policy.parameters() if p.requires_grad]  # LoRA: the adapters' only
        self.optimizer = self._make_optimizer(settings.lr)
        self.engine: Any = None
        # generic options go only to engines that take them (max_batch: hf; dtype: hf and sglang, so the
        # rollout engine computes in the policy's dtype); the recipe's own engine_options win

        self.engine_options = fit_options(settings.engine, {"max_batch": max_batch, "device": str(self.device),
                                                            "dtype": settings.dtype}, settings.engine_options)
        self.optimizer_steps = 0
        self.skipped_steps = 0
        self._init_lifecycle()  # stale / lost flags and the engine counters (engine_lifecycle.py)

    def _make_optimizer(self, lr: float) -> Any:
        """The group's optimiser per ``optimizer`` / ``optimizer_offload`` (see :func:`make_optimizer`);
        LoRA: one per adapter, each with its own settings (``optim.AdapterOptimizers``)."""
        s = self.settings
        if self.adapters:
            return make_adapter_optimizers(self.adapter_params, self.adapters, kind=s.optimizer, offload=s.optimizer_offload)
        return make_optimizer(self.params, kind=s.optimizer, offload=s.optimizer_offload, lr=lr,
                              betas=tuple(s.betas), weight_decay=s.weight_decay)

    # ------------------------------------------------------------------ LoRA: the adapters themselves are LoraAdapters'

    def _clip_grads(self) -> float:
        """Clip the gradients and return the pre-clip global norm. Full weights: the group's norm
        against ``grad_clip``. LoRA: each adapter against its own ``grad_clip`` (the agents' updates
        stay as independent as in separate groups); the returned norm is over all adapters."""
        if not self.adapters:
            clip = self.settings.grad_clip if self.settings.grad_clip > 0 else float("inf")
            return float(torch.nn.utils.clip_grad_norm_(self.params, clip))
        sq = 0.0
        for name, ps in self.adapter_params.items():
            c = self.adapters[name].grad_clip
            n = float(torch.nn.utils.clip_grad_norm_(ps, c if c > 0 else float("inf")))
            sq += n * n
        return math.sqrt(sq)

    # ------------------------------------------------------------------ engine

    async def start_engine(self) -> None:
        """Create the rollout engine from the group's model folder and push the current weights."""

        if self.engine is None:
            where = self.model_path
            if self.adapters:  # the engine starts from the base and this group's adapters, as saved
                self._engine_dir = tempfile.mkdtemp(prefix=f"drmas-adapters-{self.name}-")
                self._save_adapters(self._engine_dir, base=self._base_path)
                where = self._engine_dir
            self.engine = await asyncio.to_thread(host_engine, self.settings.engine, where, **self.engine_options)
            await self.sync_weights()

    async def generate(self, requests: list[Request]) -> list[Completion]:
        """Rollouts: the engine's ``generate`` (the harness's TeamRuntime calls this); an engine that
        is asleep or holds stale weights is woken (and synced) first."""
        if self.engine is None:
            await self.start_engine()
        if self._engine_stale or self._engine_lost or not self.engine.is_awake:
            await self.engine_wake()
        self.engine_counters["generate_calls"] += 1
        return await self.engine.generate(requests)

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The policy's weights by ``state_dict`` name (what ``update_weights`` takes), in the
        compute dtype (what the engine runs in): a lazy generator, one tensor converted at a time,
        so no full copy of all weights exists (the engine packs them into buckets)."""
        for k, v in self.policy.state_dict().items():
            yield k, self._full(v).detach().to(self.compute_dtype)

    def _autocast(self) -> Any:
        """bf16 autocast when the group computes in bf16; a no-op context in float32."""
        return torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32)

    async def sync_weights(self) -> float:
        """Copy the policy's weights into the rollout engine; returns the seconds it took."""
        t0 = time.perf_counter()
        if self.engine is not None:
            release_cached_memory(self.device)  # the update's freed blocks go back before the engine wakes
            if not self.engine.is_awake:
                await self.engine.wake()
                self.engine_counters["wakes"] += 1
            self.engine_counters["syncs"] += 1
            self._engine_stale = self._engine_lost = False
            if self.adapters:  # LoRA: only the adapters move; the engine's base is the frozen one
                for name, config, tensors in self.adapter_weights():
                    await self.engine.update_adapter(name, config, tensors)
                return time.perf_counter() - t0
            update = self.engine.update_weights
            if "bucket_bytes" in inspect.signature(update).parameters:
                await update(self.named_weights(), bucket_bytes=self.settings.sync_bucket_mb << 20)
            else:
                await update(self.named_weights())
        return time.perf_counter() - t0

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
            self.engine = None
        if getattr(self, "_engine_dir", None):
            shutil.rmtree(self._engine_dir, ignore_errors=True)
            self._engine_dir = None

    # ------------------------------------------------------------------ hooks (one process; fsdp.worker: over ranks)

    world = 1  # ranks of the group (drmas_trainer.fsdp.worker shards it over several)
    rank = 0
    _copy_owner = ""  # whose node-local copy of a URL checkpoint part this process reads (fsdp.worker: its rank's)
    _grad_scale = 1.0  # multiplies each micro-batch's loss before backward

    def _wrap_policy(self) -> None:
        """Called once the policy is loaded, before the optimiser exists (fsdp.worker shards it)."""

    def _share(self, items: list) -> list[tuple[list, bool]]:
        """This rank's micro-batches of ``items`` as (items, real) pairs: here all of them."""
        return [(c, True) for c in chunks(items, self.settings.micro_batch_size)]

    def _all_sum(self, values: list[float]) -> list[float]:
        return list(values)

    def _all_max(self, values: list[float]) -> list[float]:
        return list(values)

    def _merge_rows(self, out: list[list[float]]) -> list[list[float]]:
        return out

    def _full(self, t: Tensor) -> Tensor:
        return t

    def _logprobs(self, batch: dict[str, Tensor], **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        """``token_logprobs`` of the policy (a sharded group runs it inside its FSDP root)."""
        return token_logprobs(self.policy, batch, **kwargs)

    # ------------------------------------------------------------------ training

    def _agent_norm(self, prev: dict[Tensor, Tensor] | None) -> float:
        """Norm of (current accumulated gradient - snapshot), over every rank's shard."""
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.params:
            if p.grad is None:
                continue
            g = local(p.grad)
            d = g if prev is None or p not in prev else g - prev[p]
            sq += d.detach().double().square().sum()
        return math.sqrt(self._all_sum([float(sq)])[0])

    def _micro_loss(self, micro: list[Row], loss: LossSettings) -> tuple[Tensor, dict[str, float]]:
        """The policy loss of one micro-batch (aggregated over it) and its metrics."""
        batch = pack_rows([r.prompt_ids for r in micro], [r.response_ids for r in micro], self.pad_id, self.device)
        with self._autocast():
            logp, ent = self._logprobs(batch, with_entropy=True, chunk=self.settings.logprob_chunk,
                                       entropy_grad=loss.entropy_coef != 0.0)
        T = logp.shape[1]
        old = torch.zeros_like(logp)
        for b, r in enumerate(micro):
            old[b, : len(r.old_logprobs)] = torch.tensor(r.old_logprobs[:T], dtype=old.dtype)
        adv = torch.tensor([r.advantage for r in micro], dtype=torch.float32, device=self.device)
        return policy_loss(logp, old, adv, batch["mask"], mode=loss.mode, clip_low=loss.clip_low,
                           clip_high=loss.clip_high, dual_clip=loss.dual_clip, agg=loss.agg,
                           entropy=ent, entropy_coef=loss.entropy_coef, pg_weights=row_weights(micro, logp))

    def _optimizer_step(self, mb: list[Row], loss: LossSettings, acc: Acc, agent_norms: dict[str, list[float]],
                        norms: list[float]) -> bool:
        """One optimiser step on mini-batch ``mb``; False when it was skipped (non-finite). Sharded:
        every rank sees the whole mini-batch, runs its share of each agent's micro-batches (padded
        with weight-0 ones so all ranks run as many) and the norms and metrics are summed over ranks."""
        def size(rows: list[Row]) -> int:
            return sum(len(r.response_ids) for r in rows) if loss.token_level else len(rows)

        denom = size(mb)
        by_agent: dict[str, list[Row]] = {}
        for r in mb:
            by_agent.setdefault(r.agent, []).append(r)
        multi = len(by_agent) > 1
        self.optimizer.zero_grad(set_to_none=True)
        prev: dict[Tensor, Tensor] | None = None
        step_agent_norms: dict[str, float] = {}
        step_acc = Acc()
        finite = True
        for k, (agent, arows) in enumerate(by_agent.items()):
            self._use_agent(agent)
            for micro, real in self._share(arows):
                loss_t, m = self._micro_loss(micro, loss)
                if not math.isfinite(m["loss"]):
                    finite = False
                    if self.world == 1:
                        break  # ranks go on together: their gradients turn non-finite and the step is dropped
                w = size(micro) / denom if real else 0.0
                (loss_t * (w * self._grad_scale)).backward()
                step_acc.add(m if real else {k2: v for k2, v in m.items() if k2 != "ratio_max"}, w)
            if not finite and self.world == 1:
                break
            if multi:
                share = size(arows) / denom
                step_agent_norms[agent] = self._agent_norm(prev) / share
                if k < len(by_agent) - 1:  # snapshot for the next agent (not needed after the last)
                    prev = {p: local(p.grad).detach().clone() for p in self.params if p.grad is not None}
        prev = None
        finite = self._all_sum([0.0 if finite else 1.0])[0] == 0.0
        total = self._clip_grads() if finite else float("nan")
        if not finite or not math.isfinite(total):
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            return False
        if not multi:
            step_agent_norms[next(iter(by_agent))] = total
        for group in self.optimizer.param_groups:  # linear warm-up from the group's step count (LoRA: per adapter)
            warm = group.get("warmup_steps", self.settings.lr_warmup_steps)
            group["lr"] = group.get("base_lr", self.settings.lr) * (min(1.0, (self.optimizer_steps + 1) / warm) if warm > 0 else 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        norms.append(total)
        for a, v in step_agent_norms.items():
            agent_norms[a].append(v)
        keys = sorted(step_acc.sums)
        for k2, v in zip(keys, self._all_sum([step_acc.sums[k2] for k2 in keys])):
            acc.sums[k2] += v
        top = self._all_max([step_acc.maxes.get("ratio_max", -math.inf)])[0]  # a padding-only rank has none
        if top > -math.inf:
            acc.maxes["ratio_max"] = max(acc.maxes.get("ratio_max", -math.inf), top)
        return True

    async def update(self, rows: list[Row], *, epochs: int = 1, mini_batches: int = 1,
                     loss: LossSettings | None = None, seed: int = 0) -> dict[str, Any]:
        """PPO/GSPO update on this group's rows (see the module docstring).

        Args:
            rows: the group's rows; rows without response tokens are ignored.
            epochs: passes over the rows.
            mini_batches: optimiser steps per pass (rows shuffled, then split evenly).
            loss: policy-loss settings.
            seed: shuffle seed (the trainer passes one derived from the run seed and step).

        Returns:
            ``{"optimizer_steps", "skipped_steps" (this call), "grad_norm" (mean pre-clip norm over
            the steps), "grad_norm_max", "agent_grad_norm": {agent: mean}, "agent_grad_norm_max",
            loss metrics averaged over the steps (loss, pg_loss, pg_clipfrac, pg_clipfrac_lower,
            ppo_kl, ratio_mean, entropy; ratio_max is the max), "lr" (after the last step), "update_s"}``.
        """
        loss = loss or LossSettings()
        t0 = time.perf_counter()
        if self.settings.sleep_engine:
            await self.engine_sleep()
        rows = [r for r in rows if r.response_ids]
        rng = random.Random(seed)
        acc = Acc()
        agent_norms: dict[str, list[float]] = defaultdict(list)
        norms: list[float] = []
        skipped0, steps0 = self.skipped_steps, self.optimizer_steps
        self.policy.train()
        for _ in range(epochs):
            if not rows:
                break
            order = list(range(len(rows)))
            rng.shuffle(order)
            for chunk in split(order, mini_batches):
                self._optimizer_step([rows[i] for i in chunk], loss, acc, agent_norms, norms)
        n_ok = self.optimizer_steps - steps0
        if n_ok:
            self._engine_stale = True  # the next wake (or generate) syncs the engine
        out: dict[str, Any] = {
            "optimizer_steps": n_ok,
            "skipped_steps": self.skipped_steps - skipped0,
            "grad_norm": sum(norms) / len(norms) if norms else float("nan"),
            "grad_norm_max": max(norms) if norms else float("nan"),
            "agent_grad_norm": {a: sum(v) / len(v) for a, v in agent_norms.items()},
            "agent_grad_norm_max": {a: max(v) for a, v in agent_norms.items()},
        }
        for k, v in acc.sums.items():
            out[k] = v / n_ok if n_ok else float("nan")
        for k, v in acc.maxes.items():
            out[k] = v
        out["lr"] = float(self.optimizer.param_groups[0]["lr"]) if self.optimizer.param_groups else float("nan")
        out["update_s"] = time.perf_counter() - t0
        return out

    # ------------------------------------------------------------------ state

    def weights_finite(self) -> bool:
        ok = all(bool(torch.isfinite(local(p)).all()) for p in self.policy.parameters())
        return self._all_sum([0.0 if ok else 1.0])[0] == 0.0

    async def save(self, folder: str, optimizer_path: str | None = None) -> None:
        """Write the policy as an HF folder (safetensors + config + tokenizer) and, when asked, the
        optimiser state (``torch.save``; load with ``weights_only=True``). Refuses non-finite weights.
        URLs (a checkpoint root under fsspec): written to a staging folder on this node, then uploaded."""
        if is_url(folder):
            with tempfile.TemporaryDirectory(prefix=f"drmas-save-{self.name}-") as stage:
                local_opt = os.path.join(stage, "optim.pt") if optimizer_path is not None else None
                await self.save(os.path.join(stage, "model"), local_opt)
                upload(os.path.join(stage, "model"), folder)
                if optimizer_path is not None:
                    upload(local_opt, optimizer_path)
            return
        if not self.weights_finite():
            raise RuntimeError(f"worker group {self.name}: refusing to checkpoint non-finite weights")
        if self.adapters:  # the adapters in peft's format and a reference to the base, not the base
            self._save_adapters(folder)
        else:
            self.policy.save_pretrained(folder, safe_serialization=True)
            self.tokenizer.save_pretrained(folder)
        if optimizer_path is not None:
            torch.save({"optimizer": self.optimizer.state_dict(), "optimizer_steps": self.optimizer_steps,
                        "skipped_steps": self.skipped_steps}, optimizer_path)

    async def load_optimizer(self, path: str) -> None:
        """Restore the optimiser state written by :meth:`save` (``weights_only=True``); a URL is
        downloaded on this node first."""
        source = path  # a URL: the record's own, where its shards folder is found
        if is_url(path):
            path = str(node_copy(path, owner=self._copy_owner))
        where = "cpu" if self.settings.optimizer_offload == "cpu" else self.device
        state = torch.load(path, map_location=where, weights_only=True)
        if "shards" in state:  # written by a sharded group: its shards, re-cut for this group
            from drmas_trainer.fsdp.checkpoint import load_sharded_optimizer

            load_sharded_optimizer(self, source, state)
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.optimizer_steps = int(state["optimizer_steps"])
        self.skipped_steps = int(state["skipped_steps"])

    async def info(self) -> dict[str, Any]:
        return {"name": self.name, "agents": self.agents, "device": str(self.device),
                "params": sum(p.numel() for p in self.params), "optimizer_steps": self.optimizer_steps,
                "skipped_steps": self.skipped_steps}
