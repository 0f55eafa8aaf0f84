"""The chain every call passes between an episode and its engine, built once per run.

    episode -> runtime -> limits meter -> call cache -> engine (a pool's view of a worker group)

- **call cache** (``cache.CachedEngine``, innermost): a request it holds is served without the
  engine; what the engine computes is stored once it returns. It sits on the pool's view because
  there every engine and pool meet a request and its worker group's model identity.
- **limits** (``limits.LimitedEngine``, outside the cache, so a hit is free): each request is
  checked against ``--max-usd`` / ``--max-tokens`` before it goes out and counted when it comes back;
  the same meter gates each episode's start (``runner.run_episodes``).
- **cost**: each call's dollars under the price sheet, ``pricing.call_cost`` (a cached call's
  original dollars are recorded beside it) and each finished trajectory's ``cost_usd``.

:class:`CallChain` holds the three parts; ``api.run`` builds it from the plan and the resources it
opened, the runner asks it for the gate and the trajectories' cost, and the trainer runs without one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

from drmas_bench.call_cache import CachedEngine, CallCache, group_identity
from drmas_bench.limits import LimitedEngine, Meter
from drmas_bench.pricing import PriceSheet, call_cost, trajectory_cost
from drmas_bench.types import Completion, Trajectory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallChain:
    """A run's call cache, spending meter and price sheet (each None when off), applied to every
    worker group's engine by :meth:`wrap`."""

    prices: PriceSheet | None = None
    call_cache: CallCache | None = None
    meter: Meter | None = None

    def call_cost(self, wg: str, c: Completion) -> float | None:
        """One call's dollars under the price sheet (None: no sheet, or the call's usage is unknown)."""
        return call_cost(c, self.prices, wg) if self.prices is not None else None

    def cost(self, traj: Trajectory) -> float:
        """A finished trajectory's known calls' dollars (0 without a price sheet)."""
        return trajectory_cost(traj, self.prices) if self.prices is not None else 0.0

    def wrap(self, engines: dict[str, Any], team: Any, models: dict[str, dict], *, here: bool = True) -> dict[str, Any]:
        """``{wg: engine}`` with the cache, then the meter, around each of ``engines`` (``pool.views()``).
        A group's cache identity: its engine, options and ``models[wg]`` (the plan's
        ``identity["models"]``; a remote group, absent there, by its name, URL and served model).
        ``here``: the models are on this machine (not a Ray pool's nodes)."""
        out = dict(engines)
        if self.call_cache is not None:
            for wg, engine in engines.items():
                g = team.worker_groups[wg]
                opts = dict(g.options, **({"base_url": g.base_url} if getattr(g, "base_url", None) else {}))
                ident = group_identity(g.engine, g.model, models.get(wg), opts, here=here)
                labels = {"model": str(g.model), "content": str((models.get(wg) or {}).get("content") or ""),
                          "engine": g.engine}
                price = partial(self.call_cost, wg) if self.prices is not None else None
                out[wg] = CachedEngine(engine, self.call_cache, ident, labels, price)
            logger.info(f"[eval] call cache {self.call_cache.path}")
        if self.meter is not None:
            out = {wg: LimitedEngine(e, self.meter, wg) for wg, e in out.items()}
        return out
