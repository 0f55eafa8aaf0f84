"""The pool: many worker groups (one engine each) on one accelerator pool, asleep until needed.

    from drmas_bench.pool import EngineSpec, make_pool
    pool = make_pool("local", {"solver": EngineSpec("hf", "tiny-random")}, budget_models=1)
    async with pool:
        completions = await pool.generate("solver", requests)
        engines = pool.views()          # drop-in `engines` dict for TeamRuntime
        print(pool.stats())             # wakes / sleeps per worker group, seconds waking, peak memory

- ``policy.py``: the pure dispatch rules (most pending first, LRU sleeping, never a busy engine).
- ``groups.py``: a worker group (``EngineSpec``, what the pool keeps and reports of it);
  ``base.py``: the scheduler every pool shares.
- ``local.py``: ``LocalPool``, engines in this process (default).
- where an engine runs and which options it gets (``host_engine``, ``fit_options``, ``ChildEngine``)
  is engine knowledge: ``drmas_bench.engines.hosting``.
- ``ray_pool.py``: ``RayPool``, one Ray actor per worker group in a placement group over GPUs
  (needs ``pip install drmas-bench[ray]``; ray itself is imported only when a RayPool is made).

See docs/pool.md.
"""

from __future__ import annotations

from typing import Any, Mapping

from drmas_bench.pool.base import Adopted, PoolBase, PoolEngineView
from drmas_bench.pool.groups import EngineSpec, specs_from_team
from drmas_bench.pool.local import LocalPool
from drmas_bench.pool.policy import BudgetError
from drmas_bench.pool.ray_pool import RayPool  # imports ray only when a RayPool is made (cluster.import_ray)
from drmas_bench.registry import Registry

POOLS: Registry[type[PoolBase]] = Registry("pool")  # --pool's choices
POOLS.register("local", LocalPool)
POOLS.register("ray", RayPool)


def make_pool(kind: str, groups: Mapping[str, Any], **options: Any) -> PoolBase:
    """A pool of ``kind`` (``local`` or ``ray``) over ``groups`` ({worker group: EngineSpec, ...});
    ``options`` are the pool's options (see ``LocalPool`` / ``RayPool``); an unknown kind is one UserError."""
    return POOLS.get(kind)(groups, **options)


__all__ = ["Adopted", "BudgetError", "EngineSpec", "LocalPool", "POOLS", "PoolBase", "PoolEngineView", "RayPool",
           "make_pool", "specs_from_team"]
