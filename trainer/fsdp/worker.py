"""A worker group sharded over N ranks with FSDP2: one :class:`ShardedWorkerGroup` per rank, each in
its own process, together one group (``fsdp.ranks`` of a recipe; ``drmas_trainer.fsdp.ray_group`` places
them as Ray actors, :func:`drmas_trainer.fsdp.sharding.spawn_ranks` as local processes).

    wg = ShardedWorkerGroup("solver", ["solver"], settings, model_path, rank=r, world=N,
                            init_method="tcp://HOST:PORT", device="auto")
    await wg.update(rows, ...)     # every rank gets every row and trains on its share

It is :class:`~drmas_trainer.worker.WorkerGroup` with the policy sharded (``drmas_trainer.fsdp.sharding``)
and the hooks that make the update data parallel:

- **rows**: every rank receives all of the group's rows and shuffles them identically; each
  agent's rows of a mini-batch are cut into ``world`` contiguous pieces, rank r takes piece r and
  forms its micro-batches of ``micro_batch_size`` rows. Ranks with fewer micro-batches run
  padding ones (a real row, loss weight 0), so every rank runs as many forwards and backwards as
  the others (FSDP's collectives pair them up). Weights are the single-process ones (a micro-batch's
  tokens or rows over the whole mini-batch's), so the reduced gradient is the mini-batch's.
- **norms**: the global gradient norm (for clipping and logging) and the per-agent norms of a shared
  group are sums of squares over each rank's shard, all-reduced; clipping scales every shard by
  the same ``min(1, clip / (norm + 1e-6))`` as ``torch.nn.utils.clip_grad_norm_``.
- **non-finite steps**: a rank that meets a non-finite loss goes on (the others are waiting in
  collectives); the ranks agree on skipping the step by an all-reduce of the flag.
- **metrics**: the loss metrics' weighted sums are all-reduced (``ratio_max``: maximised), so every
  rank returns the group's figures; recomputed old log-probs are gathered from all ranks.
- **weights out**: ``named_weights`` all-gathers one tensor at a time (``full_tensor``), so each
  rank's engine gets the full weights bucket by bucket (the engine packs them), never the whole
  model at once; LoRA groups gather the adapters only.
- **save**: rank 0 writes the consolidated HF folder (what ``eval --model`` loads) from tensors
  gathered one at a time; the optimiser state is written per rank with
  ``torch.distributed.checkpoint`` (``drmas_trainer.fsdp.checkpoint``), loadable with any rank count.
  Under an fsspec URL checkpoint root each rank saves into a staging folder of its own and
  uploads its files; on resume each rank downloads its own copy of the parts it reads.
"""

from __future__ import annotations

import json as _json
import math
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from drmas_bench.checkpoints.copies import node_copy
from drmas_bench.checkpoints.layout import is_url, upload
from drmas_bench.engines.base import resolve_model_path
from drmas_bench.models.adapters import BASE_FILE, base_record, save_adapter
from drmas_bench.models.loading import load_causal_lm
from drmas_trainer import lora
from drmas_trainer.config.train import AgentConfig
from drmas_trainer.fsdp import sharding as fsdp
from drmas_trainer.optim import local
from drmas_trainer.rows import chunks, split
from drmas_trainer.worker import WorkerGroup

__all__ = ["ShardedWorkerGroup"]


def _publish(local: str, target: str) -> None:
    """A staged file or folder to its place: uploaded to a URL, copied to a local path."""
    if is_url(target):
        upload(local, target)
    elif os.path.isdir(local):
        shutil.copytree(local, target, dirs_exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        shutil.copy2(local, target)


def _is_dtensor(t: Any) -> bool:
    return hasattr(t, "full_tensor")


class ShardedWorkerGroup(WorkerGroup):
    """Rank ``rank`` of a worker group of ``world`` ranks (module docstring).

    Args:
        rank, world: this process's rank and the group's size.
        init_method: ``tcp://HOST:PORT`` where rank 0 listens (the same for all ranks).
        backend: ``auto`` (NCCL on CUDA, gloo on CPU), ``nccl`` or ``gloo``.
        reshard_after_forward: free each unit's gathered parameters after its forward (FSDP2).
        The rest: as :class:`~drmas_trainer.worker.WorkerGroup`.
    """

    def __init__(self, name: str, agents: list[str], settings: AgentConfig, model_path: str, *, rank: int,
                 world: int, init_method: str, backend: str = "auto", reshard_after_forward: bool = True,
                 **kwargs: Any) -> None:
        device = kwargs.get("device", "auto")
        dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                           "cpu" if device == "auto" else device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        kwargs["device"] = str(dev)
        fsdp.init_group(rank, world, init_method, dev, backend)
        self.rank, self.world = rank, world
        self._copy_owner = f"rank{rank}"  # a URL checkpoint's parts: each rank reads its own node copy
        self._grad_scale = float(world)  # FSDP averages over the ranks; the sum is the mini-batch's gradient
        self._reshard = reshard_after_forward
        super().__init__(name, agents, settings, model_path, **kwargs)

    # ------------------------------------------------------------------ hooks of WorkerGroup

    def _wrap_policy(self) -> None:
        self._root = fsdp.shard_policy(self.policy, self.world, self.device, bf16=self.compute_dtype == torch.bfloat16,
                                       reshard_after_forward=self._reshard)
        if self.adapters:  # fully_shard replaced the parameters: the adapters' lists are the new ones
            self.adapter_params = {n: lora.adapter_params(self.policy, n) for n in self.adapters}

    def _share(self, items: list) -> list[tuple[list, bool]]:
        mbs = self.settings.micro_batch_size
        pieces = split(items, self.world)
        mine = pieces[self.rank] if self.rank < len(pieces) else []
        n = max((math.ceil(len(p) / mbs) for p in pieces), default=0)
        out = [(c, True) for c in chunks(mine, mbs)]
        return out + [(items[:1], False)] * (n - len(out))

    def _all_sum(self, values: list[float]) -> list[float]:
        return fsdp.all_reduce(values) if values else []

    def _all_max(self, values: list[float]) -> list[float]:
        return fsdp.all_reduce(values, op="max") if values else []

    def _merge_rows(self, out: list[list[float]]) -> list[list[float]]:
        merged = [list(x) for x in out]
        for theirs in fsdp.all_gather_objects(out):
            for k, lp in enumerate(theirs):
                if lp and not merged[k]:
                    merged[k] = lp
        return merged

    def _full(self, t: Tensor) -> Tensor:
        return t.full_tensor() if _is_dtensor(t) else t  # type: ignore[attr-defined]

    def _logprobs(self, batch: dict[str, Tensor], **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        return self._root(batch, **kwargs)

    def _clip_grads(self) -> float:
        """The pre-clip global norm over every rank's shard; full weights clipped against
        ``grad_clip``, LoRA each adapter against its own (as WorkerGroup)."""
        sets = ([(self.params, self.settings.grad_clip)] if not self.adapters else
                [(ps, self.adapters[n].grad_clip) for n, ps in self.adapter_params.items()])
        sq = self._all_sum([sum(float(local(p.grad).double().square().sum()) for p in ps if p.grad is not None)
                            for ps, _ in sets])
        for (ps, clip), s in zip(sets, sq):
            coef = min(1.0, clip / (math.sqrt(s) + 1e-6)) if clip > 0 and math.isfinite(s) else 1.0
            if coef < 1.0:
                for p in ps:
                    if p.grad is not None:
                        local(p.grad).mul_(coef)
        return math.sqrt(sum(sq))

    async def score_rows(self, rows: list[Any], *, recompute: bool = True, reference: bool = False) -> dict[str, Any]:
        out = await super().score_rows(rows, recompute=recompute)
        if reference:  # KL in the reward: the frozen reference policy's log-probs, each rank its share
            out["ref_logprobs"] = self._reference_logprobs(rows)
        return out

    def _reference_logprobs(self, rows: list[Any]) -> list[list[float]]:
        """``drmas_trainer.reference_policy``'s log-probs with the rows split over the ranks, each
        rank as many forwards. LoRA: the frozen base is the sharded policy with its adapters off, run
        through the policy's FSDP root. Full weights: the frozen copy is sharded too
        (:meth:`_reference_root`), so a GPU holds 1/N of it, not all of it."""
        out: list[list[float]] = [[] for _ in rows]
        live = [k for k, r in enumerate(rows) if r.response_ids]
        with torch.no_grad():
            if self.adapters:
                with self.policy.disable_adapter():
                    self._logprobs_into(rows, live, out)
            else:
                self._logprobs_into(rows, live, out, root=self._reference_root())
        return self._merge_rows(out)

    def _reference_root(self) -> fsdp.LogprobForward:
        """The full-weight group's frozen reference copy (the recipe's model, never a checkpoint), in
        the compute dtype, sharded over the ranks like the policy (FSDP2, no mixed-precision cast: its
        parameters already are in the compute dtype); loaded at its first use and kept."""
        root = getattr(self, "_reference_sharded", None)
        if root is None:
            ref = load_causal_lm(resolve_model_path(self.settings.model or self.model_path), dtype=self.compute_dtype)
            ref.eval().requires_grad_(False)
            # on the CPU until fully_shard moves each unit's shard to the device: the whole copy never is there
            root = fsdp.shard_policy(ref, self.world, self.device, reshard_after_forward=True)
            root.eval()
            self._reference_sharded = root
        return root

    def adapter_weights(self) -> Iterator[tuple[str, dict[str, Any], dict[str, Tensor]]]:
        for name, config, tensors in super().adapter_weights():
            yield name, config, {k: self._full(v) for k, v in tensors.items()}

    # ------------------------------------------------------------------ state

    def _full_state(self) -> dict[str, Tensor]:
        """The policy's state dict gathered one tensor at a time; rank 0 keeps host copies, the
        other ranks only take part in the gathers."""
        out: dict[str, Tensor] = {}
        for k, v in self.policy.state_dict().items():
            full = self._full(v).detach()
            if self.rank == 0:
                out[k] = full.to("cpu", copy=True)
            del full
        return out

    async def save(self, folder: str, optimizer_path: str | None = None) -> None:
        """Rank 0: the consolidated HF folder (or a LoRA group's adapters); every rank: its shard of
        the optimiser state (``drmas_trainer.fsdp.checkpoint``). Every rank must call it. URLs (an fsspec
        checkpoint root): :meth:`_save_staged`."""
        if is_url(folder) or (optimizer_path is not None and is_url(optimizer_path)):
            await self._save_staged(folder, optimizer_path)
            return
        if not self.weights_finite():
            raise RuntimeError(f"worker group {self.name}: refusing to checkpoint non-finite weights")
        if self.adapters:  # each engine start folder is written per rank; the checkpoint by rank 0
            self._save_adapters(folder, write=self.rank == 0)
        else:
            state = self._full_state()
            if self.rank == 0:
                os.makedirs(folder, exist_ok=True)
                self.policy.save_pretrained(folder, state_dict=state, safe_serialization=True)
                self.tokenizer.save_pretrained(folder)
            del state
        if optimizer_path is not None:
            from drmas_trainer.fsdp.checkpoint import save_sharded_optimizer

            save_sharded_optimizer(self, optimizer_path)
        dist.barrier()

    async def _save_staged(self, folder: str, optimizer_path: str | None) -> None:
        """Save into a staging folder of this rank's own (the ranks need not share a disk), then
        publish: rank 0 its model folder and the optimiser record, every rank its own ``.distcp``
        shard file (rank 0 also the shards' ``.metadata``), file by file into the ``.dcp`` folder
        beside the record. A barrier at the end: when any rank returns, every file is there."""
        with tempfile.TemporaryDirectory(prefix=f"drmas-save-{self.name}-rank{self.rank}-") as stage:
            model = os.path.join(stage, "model")
            opt = os.path.join(stage, posixpath.basename(optimizer_path)) if optimizer_path is not None else None
            await self.save(model, opt)  # ends with a barrier: every rank's shard is written
            if self.rank == 0:
                _publish(model, folder)
                if opt is not None and optimizer_path is not None:
                    _publish(opt, optimizer_path)
            if opt is not None and optimizer_path is not None:
                shards = Path(opt).with_suffix(".dcp")
                into = f"{posixpath.dirname(optimizer_path)}/{shards.name}"
                for f in sorted(shards.iterdir()):  # this rank's files only: another rank's are never touched
                    _publish(str(f), f"{into}/{f.name}")
        dist.barrier()

    def _gathered_adapters(self) -> dict[str, dict[str, Tensor]]:
        """Every adapter's float32 tensors, gathered (every rank must call it)."""
        return {name: {k: self._full(v).detach().cpu() for k, v in lora.adapter_tensors(self.policy, name).items()}
                for name in self.adapters}

    def _save_adapters(self, folder: str, base: str | None = None, write: bool = True) -> None:
        """A LoRA group's model folder (as WorkerGroup's) from the gathered adapters; ``write``
        False: only take part in the gathers (ranks other than 0 when saving a checkpoint)."""
        gathered = self._gathered_adapters()
        if not write:
            return
        record = base_record(str(base or self.base_ref))
        os.makedirs(folder, exist_ok=True)
        for name, tensors in gathered.items():
            save_adapter(self.policy, name, os.path.join(folder, name), record["name"], record, state=tensors)
        self.tokenizer.save_pretrained(folder)
        with open(os.path.join(folder, BASE_FILE), "w", encoding="utf-8") as f:
            _json.dump(record, f, indent=1, sort_keys=True)

    async def load_optimizer(self, path: str) -> None:
        """Restore optimiser state written by a sharded group (any rank count) or by a
        single-process group (its full state, cut into this rank's shards)."""
        from drmas_trainer.fsdp.checkpoint import load_plain_optimizer

        local_path = str(node_copy(path, owner=self._copy_owner)) if is_url(path) else path
        state = torch.load(local_path, map_location="cpu", weights_only=True)
        if "shards" in state:
            await super().load_optimizer(path)
            return
        load_plain_optimizer(self, state["optimizer"])
        self.optimizer_steps = int(state["optimizer_steps"])
        self.skipped_steps = int(state["skipped_steps"])

    async def info(self) -> dict[str, Any]:
        out = await super().info()
        out.update(rank=self.rank, world=self.world, backend=dist.get_backend(),
                   params=sum(p.numel() for p in self.params))  # numel of a DTensor is the full size
        return out

    async def close(self) -> None:
        await super().close()
        if dist.is_initialized():
            dist.destroy_process_group()
