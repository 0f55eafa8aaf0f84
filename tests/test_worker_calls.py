"""The worker group's methods as the controller calls them on a remote group (`ray_workers.WorkerCalls`,
shared by one Ray actor's handle and a sharded group's): the same names and parameters as the local
`worker.WorkerGroup`, each sent under its own name with its own arguments, and a sharded group's
collective call sent to every rank with rank 0's answer back. The ranks here are fakes that record
what they are sent (orchestration only: no Ray, no model)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from drmas_trainer.fsdp.ray_group import ShardedRayHandle
from drmas_trainer.ray_workers import RayWorkerHandle, WorkerCalls
from drmas_trainer.worker import WorkerGroup

# each forwarded method with the arguments a controller passes it (names from WorkerGroup's signatures)
CALLS: dict[str, tuple[tuple, dict]] = {
    "generate": ((["req"],), {}), "start_engine": ((), {}), "update": ((["row"],), {"epochs": 2}),
    "score_rows": ((["row"],), {"reference": True}), "sft": ((["ex"],), {"steps": 3, "lr": 0.1, "batch_size": 2}),
    "sync_weights": ((), {}), "engine_sleep": ((), {}), "engine_wake": ((), {}), "engine_info": ((), {}),
    "save": (("/tmp/folder", "/tmp/optim"), {}), "load_optimizer": (("/tmp/optim",), {}),
}


def forwarded() -> list[str]:
    return [n for n, f in vars(WorkerCalls).items() if not n.startswith("_") and inspect.iscoroutinefunction(f)]


class FakeRank:
    """Stands for a rank's `RayWorkerHandle`: records every `_call` and answers with its rank."""

    def __init__(self, rank: int) -> None:
        self.rank, self.sent = rank, []

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.sent.append((method, args, kwargs))
        return {"rank": self.rank}


class FakeActorHandle(FakeRank, WorkerCalls):
    """A one-actor handle whose actor is a recorder."""


def test_the_remote_methods_are_the_local_worker_groups():
    assert sorted(forwarded()) == sorted(CALLS)
    for name in forwarded():
        local = getattr(WorkerGroup, name)
        assert inspect.iscoroutinefunction(local), name
        positional = [p for p in inspect.signature(local).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        remote = [p for p in inspect.signature(getattr(WorkerCalls, name)).parameters.values()
                  if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert [p.name for p in remote] == [p.name for p in positional], name
    assert issubclass(RayWorkerHandle, WorkerCalls) and issubclass(ShardedRayHandle, WorkerCalls)


def test_each_method_is_sent_under_its_own_name_with_its_arguments():
    h = FakeActorHandle(0)
    for name, (args, kwargs) in CALLS.items():
        assert asyncio.run(getattr(h, name)(*args, **kwargs)) == {"rank": 0}
    assert h.sent == [(name, args, kwargs) for name, (args, kwargs) in CALLS.items()]


def test_a_sharded_groups_collective_call_reaches_every_rank_and_rank_0_answers():
    ranks = [FakeRank(0), FakeRank(1), FakeRank(2)]
    h = ShardedRayHandle("solver", ranks, None, [])  # type: ignore[arg-type]
    for name, (args, kwargs) in CALLS.items():
        if name != "generate":  # not collective: spread over the ranks' engines
            assert asyncio.run(getattr(h, name)(*args, **kwargs)) == {"rank": 0}
    want = [(name, args, kwargs) for name, (args, kwargs) in CALLS.items() if name != "generate"]
    assert all(r.sent == want for r in ranks)
