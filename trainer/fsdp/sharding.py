"""The distributed pieces of a sharded worker group: the process group of its ranks, FSDP2
(``fully_shard``) over the group's mesh, and small collectives on Python numbers.

    init_group(rank, world, "tcp://127.0.0.1:29500")   # NCCL on GPU, gloo on CPU (backend "auto")
    shard_policy(policy, world, device, bf16=True)     # every decoder layer, then the root
    all_reduce([1.0, 2.0])                              # -> sums over the ranks

Each worker group is its own world: its ranks are separate processes (Ray actors in a placement
group, ``drmas_trainer.fsdp.ray_group``, or processes started by :func:`spawn_ranks`), and two groups
never share a process group, so their collectives cannot interleave.

**Sharding.** Every module whose class the model lists in ``_no_split_modules`` (the decoder
layers of a Hugging Face causal LM) becomes one FSDP unit, then the root (embeddings, final norm,
output head). Parameters, gradients and the optimiser state built on them are sharded on dim 0 over
the ranks; a unit's parameters are all-gathered for its forward and backward and freed after
(``reshard_after_forward``). FSDP averages gradients over the ranks when it reduce-scatters them;
the group multiplies each micro-batch's loss by the world size (``_grad_scale``), so the shards
hold the sum over ranks, i.e. exactly the single-process gradient of the mini-batch. With
``dtype: bfloat16`` the units all-gather bf16 copies of the parameters and reduce gradients in
float32 (``MixedPrecisionPolicy``); the master weights stay float32.
"""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from drmas_bench.types import UserError
from drmas_trainer.logprobs import token_logprobs

__all__ = ["all_gather_objects", "all_reduce", "backend_for", "free_port", "init_group", "shard_policy", "spawn_ranks"]

#: how long a rank waits for the others at start-up and in a collective
TIMEOUT = timedelta(minutes=30)


def backend_for(device: torch.device, backend: str = "auto") -> str:
    """``auto``: NCCL for CUDA devices, gloo otherwise."""
    if backend != "auto":
        return backend
    return "nccl" if device.type == "cuda" else "gloo"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (rank 0 picks the group's rendezvous port with it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def init_group(rank: int, world: int, init_method: str, device: torch.device, backend: str = "auto") -> None:
    """Join the group's process group (a no-op when this process already belongs to one of the
    same size). ``init_method``: ``tcp://HOST:PORT`` of rank 0."""
    if dist.is_initialized():
        if dist.get_world_size() != world:
            raise UserError(f"this process already belongs to a process group of {dist.get_world_size()} ranks, "
                            f"not {world}")
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_for(device, backend), init_method=init_method, rank=rank, world_size=world,
                            timeout=TIMEOUT)


def _units(policy: Any) -> list[torch.nn.Module]:
    """The modules that become FSDP units: those of the classes in ``_no_split_modules``."""
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    names = set(getattr(base, "_no_split_modules", None) or ())
    return [m for m in policy.modules() if type(m).__name__ in names]


class LogprobForward(torch.nn.Module):
    """The FSDP root of a sharded group: its forward is ``token_logprobs`` of the policy, so the
    parameters outside the decoder layers (embeddings, final norm, output head, which the chunked
    log-prob path reads directly rather than through their modules' forwards) are gathered for the
    whole forward and their gradients reduced after the whole backward."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, batch: dict[str, torch.Tensor], **kwargs: Any) -> Any:
        return token_logprobs(self.policy, batch, **kwargs)


def shard_policy(policy: torch.nn.Module, world: int, device: torch.device, *, bf16: bool = False,
                 reshard_after_forward: bool = True) -> LogprobForward:
    """Apply FSDP2 to ``policy`` in place over a 1-D mesh of ``world`` ranks (module docstring);
    returns the root to run forwards through (:class:`LogprobForward`)."""
    mesh = init_device_mesh(device.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for unit in _units(policy):
        fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    root = LogprobForward(policy)
    fully_shard(root, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return root


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """``values`` summed (``op="max"``: maximised) over the ranks, in float64."""
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return [float(v) for v in t.cpu()]


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _rank_main(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, queue: Any, device: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    init_group(rank, world, f"tcp://127.0.0.1:{port}", dev, "auto")
    try:
        result = fn(rank, world, *args)
        buf = io.BytesIO()  # tensors as bytes: a shared-memory handle would die with this process
        torch.save(result, buf)
        queue.put((rank, buf.getvalue(), None))
    except BaseException as e:  # noqa: BLE001 - the parent reports it
        queue.put((rank, None, f"{type(e).__name__}: {e}"))
        raise
    finally:
        dist.destroy_process_group()


def spawn_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 900.0,
                device: str = "cpu") -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` fresh processes on this machine (the torchrun
    layout without torchrun: gloo on CPU; ``device="cuda"``: rank r on GPU r, NCCL) and return their
    results in rank order (tensors, numbers, strings, lists and dicts of them); ``fn`` must be
    importable (a module-level function). A failing rank is a RuntimeError naming it."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, fn, args, queue, device), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors = []
    for _ in range(world):
        rank, result, error = queue.get()
        if error:
            errors.append(f"rank {rank}: {error}")
            break
        results[rank] = torch.load(io.BytesIO(result), weights_only=True)
    for p in procs:
        p.join(timeout=timeout_s if not errors else 5)
        if p.is_alive():
            p.kill()
    if errors:
        raise RuntimeError("; ".join(errors))
    return [results[r] for r in range(world)]
