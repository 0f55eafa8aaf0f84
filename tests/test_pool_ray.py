"""RayPool on a CPU machine: Ray with two *logical* GPUs, three worker groups (one actor each,
``num_gpus=1``), real tiny-random hf engines created inside the actors. One Ray session for the
module."""

from __future__ import annotations

import asyncio
import sys

import pytest

from drmas_bench.pool import EngineSpec, LocalPool
from drmas_bench.types import Request, Sampling, UserError

GROUPS = ("verifier", "searcher", "answerer")


def test_missing_ray_names_the_extra(monkeypatch):
    from drmas_bench.pool import make_pool

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(UserError, match=r"pip install drmas-bench\[ray\]"):
        make_pool("ray", {"a": EngineSpec("hf", "tiny-random")})


ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_session():
    if ray.is_initialized():  # pragma: no cover - another module left one running
        ray.shutdown()
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)  # a new Ray, not a cluster left on this machine
    yield
    ray.shutdown()


def specs(**opts):
    return {g: EngineSpec("hf", "tiny-random", {"device": "cpu", "max_wait_ms": 2, **opts}) for g in GROUPS}


def requests(g: str) -> list[Request]:
    return [Request(g, [{"role": "user", "content": f"{g} question {i}"}], Sampling(temperature=0.0, max_new_tokens=5, seed=i))
            for i in range(3)]


@pytest.mark.slow  # a Ray cluster with three hf engine actors: the end-to-end tier
def test_placement_group_third_actor_waits_for_a_free_gpu(ray_session):
    """The mechanism RayPool relies on, with trivial actors: inside the pool's placement group over
    two GPUs, a third num_gpus=1 actor does not start until one of the first two is gone."""
    from drmas_bench.pool.ray_pool import RayPool

    @ray.remote
    class Trivial:
        def gpu(self) -> list[str]:
            return [str(x) for x in ray.get_gpu_ids()]

    async def main():
        pool = RayPool(specs())
        await pool.start()
        try:
            assert pool.slots == 2 and pool.max_awake == 2 and pool.release_on_sleep
            a, b, c = (Trivial.options(**pool.actor_options()).remote() for _ in range(3))
            # generous bounds: starting two worker processes took over 60 s on a 2-core machine under load
            ga, gb = await asyncio.wait_for(asyncio.gather(a.gpu.remote(), b.gpu.remote()), 240)
            assert sorted(ga + gb) == ["0", "1"]
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(c.gpu.remote()), 3)  # waits: no free logical GPU
            ray.kill(a)
            gc = await asyncio.wait_for(c.gpu.remote(), 240)  # ...then runs on the freed one
            assert gc == ga
            ray.kill(b)
            ray.kill(c)
        finally:
            await pool.close()

    asyncio.run(main())


@pytest.mark.slow  # a Ray cluster with three hf engine actors: the end-to-end tier
def test_three_worker_groups_on_two_gpus(ray_session):
    """Three worker groups, two GPUs: two actors start, the third waits (the pool's policy says Wait:
    both GPUs are held by serving groups), then runs on the GPU the least recently used group
    released; every completion equals LocalPool's for the same seeded requests."""
    from drmas_bench.pool.ray_pool import RayPool

    async def run_ray():
        async with RayPool(specs()) as pool:
            outs = await asyncio.gather(*(pool.generate(g, requests(g)) for g in GROUPS))
            # a second pass: the released group comes back (a new actor) and another one leaves
            back = next(g for _, e, g in pool.timeline if e == "asleep")
            outs2 = await pool.generate(back, requests(back))
            return outs, (back, outs2), pool.stats(), list(pool.timeline)

    async def run_local():
        async with LocalPool(specs()) as pool:
            return [await pool.generate(g, requests(g)) for g in GROUPS]

    outs, (back, outs2), st, timeline = asyncio.run(run_ray())
    ref = asyncio.run(run_local())
    ids = lambda cs: [c.token_ids for c in cs]  # noqa: E731
    assert [ids(o) for o in outs] == [ids(r) for r in ref]
    assert ids(outs2) == ids(ref[GROUPS.index(back)])

    events = [(e, g) for _, e, g in timeline]
    waited = [g for e, g in events if e == "wait"]
    assert len(waited) >= 1
    third = waited[0]
    first_two = [g for e, g in events if e == "load"][:2]
    assert third not in first_two
    released = next(g for e, g in events if e == "asleep")
    assert released in first_two
    # the third group loads only after a first one released its GPU...
    assert events.index(("asleep", released)) < events.index(("load", third))
    # ...and runs on that GPU
    gpu_of = {g: st["groups"][g]["actors"][0]["gpu_ids"] for g in GROUPS}
    assert gpu_of[third] == gpu_of[released]
    assert sorted(gpu_of[first_two[0]] + gpu_of[first_two[1]]) == ["0", "1"]
    assert all(a["gpu_ids"][0] in ("0", "1") for g in GROUPS for a in st["groups"][g]["actors"])
    assert st["slots"] == 2 and st["loads"] == 4 and st["sleeps"] == 2
    assert len(st["groups"][back]["actors"]) == 2  # released, then a new actor
    assert st["peak_rss_bytes"] > 0 and st["requests"] == 12


@pytest.mark.slow  # a Ray cluster with three hf engine actors: the end-to-end tier
def test_actor_errors_and_placement_limits(ray_session):
    from drmas_bench.pool.ray_pool import RayPool

    async def bad_option():
        async with RayPool({"bad": EngineSpec("hf", "tiny-random", {"no_such_option": 1})}) as pool:
            await pool.generate("bad", requests("bad"))

    with pytest.raises(UserError, match=r"worker group 'bad': its Ray actor failed: .*no_such_option"):
        asyncio.run(bad_option())

    async def no_fit():
        await RayPool(specs(), release_on_sleep=False).start()

    with pytest.raises(UserError, match="3 worker groups x 1 GPU do not fit on 2 GPU"):
        asyncio.run(no_fit())

    async def too_many_gpus():
        await RayPool(specs(), num_gpus=4).start()

    with pytest.raises(UserError, match="needs 4 GPU.* cluster has 2"):
        asyncio.run(too_many_gpus())
    with pytest.raises(UserError, match="RayPool needs an EngineSpec"):
        RayPool({"a": object()})
