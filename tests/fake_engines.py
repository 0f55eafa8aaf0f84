"""FAKE engines for orchestration tests (the pool's scheduling, the trainer's rollout engines).

They generate nothing real: ``FakeEngine`` echoes the prompt and records its lifecycle in a
:class:`Ledger` that counts the bytes the awake engines claim and fails the test the moment a
budget is broken; ``FakeWeightsEngine`` also holds a "weights version" (a digest of the tensors its
last ``update_weights`` got) that every completion carries, so a test sees which weights served a
request, and may drop its weights on sleep like an SGLang engine whose memory saver releases them.
Real engines are exercised in test_pool_local.py and test_engines_*.py.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any, Iterable

from drmas_bench.types import Completion, Request


class Ledger:
    """What the FAKE engines claim to hold; fails the test if the budget is ever broken."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.resident = 0
        self.peak = 0
        self.events: list[tuple[str, str]] = []

    def take(self, name: str, n: int) -> None:
        self.resident += n
        self.peak = max(self.peak, self.resident)
        assert self.budget is None or self.resident <= self.budget, f"{name} broke the budget: {self.resident}"


class FakeEngine:
    """A FAKE engine for orchestration tests only: no model, completions echo the prompt."""

    name = "fake"

    def __init__(self, model: str, footprint: int, ledger: Ledger, delay: float = 0.005,
                 gate: asyncio.Event | None = None) -> None:
        self.model = model
        self.fp = footprint
        self.ledger = ledger
        self.delay = delay
        self.gate = gate
        self._awake = True
        self.calls = 0
        ledger.take(model, footprint)
        ledger.events.append(("load", model))

    @property
    def is_awake(self) -> bool:
        return self._awake

    def footprint_bytes(self) -> int:
        return self.fp

    async def generate(self, requests: list[Request]) -> list[Completion]:
        assert self._awake, f"{self.model} asked to generate while asleep"
        self.calls += 1
        self.ledger.events.append(("gen", self.model))
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.delay)
        self.ledger.events.append(("done", self.model))
        return [Completion(text=f"{self.model}:{r.messages[-1]['content']}") for r in requests]

    async def sleep(self) -> None:
        assert self._awake
        await asyncio.sleep(0.001)
        self._awake = False
        self.ledger.resident -= self.fp
        self.ledger.events.append(("sleep", self.model))

    async def wake(self) -> None:
        assert not self._awake
        await asyncio.sleep(0.001)
        self.ledger.take(self.model, self.fp)
        self._awake = True
        self.ledger.events.append(("wake", self.model))

    async def close(self) -> None:
        if self._awake:
            self.ledger.resident -= self.fp
        self._awake = False


class FakeWeightsEngine(FakeEngine):
    """A FAKE engine with weights: ``update_weights`` stores a digest of the tensors (the "version");
    a completion is ``model|version|seed|prompt``. ``keeps_weights_asleep=False``: ``sleep`` drops the
    version (as SGLang releasing its weights) and ``generate`` before the next update fails."""

    def __init__(self, model: str, footprint: int, ledger: Ledger, *, keeps_weights_asleep: bool = True,
                 delay: float = 0.002) -> None:
        super().__init__(model, footprint, ledger, delay=delay)
        self.keeps_weights_asleep = keeps_weights_asleep
        self.version: str | None = "initial"
        self.updates = 0

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        assert self._awake, f"{self.model}: update_weights while asleep"
        h = hashlib.sha256()
        for name, t in named_tensors:
            h.update(name.encode())
            h.update(t.detach().float().cpu().numpy().tobytes())
        self.version = h.hexdigest()[:12]
        self.updates += 1
        self.ledger.events.append(("update", self.model))

    async def generate(self, requests: list[Request]) -> list[Completion]:
        assert self.version is not None, f"{self.model}: generate with weights its sleep dropped (no sync since)"
        out = await super().generate(requests)
        return [Completion(text=f"{self.model}|{self.version}|{r.sampling.seed}|{r.messages[-1]['content']}")
                for r, c in zip(requests, out)]

    async def sleep(self) -> None:
        await super().sleep()
        if not self.keeps_weights_asleep:
            self.version = None
