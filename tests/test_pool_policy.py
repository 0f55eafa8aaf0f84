"""The pool's dispatch policy (pure) and LocalPool's orchestration of it.

The orchestration tests use ``FakeEngine``, a FAKE engine (tests/fake_engines.py): it generates nothing real,
it only records wake / sleep / generate events and the bytes it claims to hold, so the tests can
check WHEN the pool wakes and sleeps engines. Real engines are exercised in test_pool_local.py.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from fake_engines import FakeEngine, Ledger

from drmas_bench.pool import BudgetError, LocalPool, make_pool
from drmas_bench.pool.policy import (
    ASLEEP,
    AWAKE,
    SLEEPING,
    WAKING,
    GroupState,
    Serve,
    Sleep,
    Wait,
    decide,
    estimate_footprint,
    fmt_bytes,
    make_room,
    order,
    to_hold,
)
from drmas_bench.types import Request, Sampling, UserError

MB = 2**20


def G(name, state=ASLEEP, *, fp=100, serving=0, pending=0, oldest=math.inf, last_used=0.0, held=False):
    return GroupState(name, fp, state, serving, pending, oldest, last_used, held)


# ---------------------------------------------------------------------------------- policy (pure)


def test_nothing_pending_is_none():
    assert decide([G("a", AWAKE), G("b")], 100) is None


def test_most_pending_goes_first():
    gs = [G("a", pending=3, oldest=1.0), G("b", pending=5, oldest=2.0), G("c", pending=4, oldest=0.5)]
    assert [g.name for g in order(gs)] == ["b", "c", "a"]
    assert decide(gs, None) == Serve("b", wake=True)


def test_tie_goes_to_the_oldest_request():
    gs = [G("a", pending=2, oldest=5.0), G("b", pending=2, oldest=3.0), G("c", pending=2, oldest=4.0)]
    assert [g.name for g in order(gs)] == ["b", "c", "a"]
    assert decide(gs, None).group == "b"
    # an exact tie falls back to the name, so the answer is deterministic
    assert decide([G("y", pending=1, oldest=1.0), G("x", pending=1, oldest=1.0)], None).group == "x"


def test_awake_head_is_served_without_waking_even_while_serving():
    gs = [G("a", AWAKE, serving=1, pending=4, oldest=1.0), G("b", pending=1, oldest=0.0)]
    assert decide(gs, 100) == Serve("a")
    assert decide([G("a", WAKING, serving=1, pending=2, oldest=1.0)], 100) == Serve("a")


def test_lru_idle_engines_sleep_until_the_budget_holds():
    gs = [
        G("a", AWAKE, last_used=2.0),
        G("b", AWAKE, last_used=1.0),  # least recently used
        G("c", AWAKE, last_used=3.0),
        G("d", pending=1, oldest=0.0),
    ]
    assert decide(gs, 300) == Serve("d", wake=True, sleep=("b",))
    assert decide(gs, 200) == Serve("d", wake=True, sleep=("b", "a"))
    assert decide(gs, 100) == Serve("d", wake=True, sleep=("b", "a", "c"))
    assert decide(gs, 400) == Serve("d", wake=True)  # fits: nobody sleeps
    assert decide(gs, None) == Serve("d", wake=True)


def test_sleeping_frees_by_footprint_not_by_count():
    gs = [G("small", AWAKE, fp=10, last_used=1.0), G("big", AWAKE, fp=90, last_used=2.0), G("new", fp=50, pending=1, oldest=0)]
    # LRU order is small, big: sleeping small (10) is not enough, big goes too
    assert decide(gs, 100) == Serve("new", wake=True, sleep=("small", "big"))
    assert decide(gs, 140) == Serve("new", wake=True, sleep=("small",))
    assert decide(gs, 150) == Serve("new", wake=True)


def test_never_sleeps_a_serving_or_waking_engine():
    gs = [
        G("busy", AWAKE, serving=1, last_used=0.0),  # least recently used, but serving
        G("waking", WAKING, serving=1, last_used=0.5),
        G("idle", AWAKE, last_used=5.0),
        G("next", pending=3, oldest=0.0),
    ]
    assert decide(gs, 300) == Serve("next", wake=True, sleep=("idle",))
    assert make_room(gs, 100, 300, exclude="next") == ("idle",)


def test_waits_when_serving_engines_hold_the_budget():
    gs = [
        G("a", AWAKE, serving=1, last_used=1.0),
        G("b", WAKING, serving=1, last_used=2.0),
        G("c", pending=9, oldest=0.0),
    ]
    d = decide(gs, 200)
    assert isinstance(d, Wait) and d.group == "c" and d.blocked_by == ("a", "b")
    assert "held by serving a, b" in d.reason
    assert make_room(gs, 100, 200, exclude="c") is None
    # once a finishes (idle), c goes in its place
    gs[0] = G("a", AWAKE, serving=0, last_used=3.0)
    assert decide(gs, 200) == Serve("c", wake=True, sleep=("a",))


def test_a_blocked_head_is_not_overtaken_by_awake_groups():
    gs = [
        G("a", AWAKE, serving=1, pending=1, oldest=0.0),  # awake, could serve without memory...
        G("b", AWAKE, serving=1),
        G("c", pending=5, oldest=1.0),  # ...but c has more pending: strict priority, everyone waits
    ]
    assert isinstance(decide(gs, 200), Wait)
    assert decide(gs, 300) == Serve("c", wake=True)


def test_sleeping_groups_no_longer_count_against_the_budget():
    gs = [G("a", SLEEPING), G("b", AWAKE, serving=1), G("c", pending=1, oldest=0.0)]
    assert decide(gs, 200) == Serve("c", wake=True)  # a's memory is promised to c (the pool waits for a)
    # and a sleeping group with pending requests must be woken again (after its sleep ends)
    gs = [G("a", SLEEPING, pending=2, oldest=0.0)]
    assert decide(gs, 100) == Serve("a", wake=True)


def test_one_engine_larger_than_the_budget_is_an_error_naming_it():
    with pytest.raises(BudgetError) as e:
        decide([G("verifier", fp=300 * MB, pending=1, oldest=0.0)], 200 * MB)
    msg = str(e.value)
    assert "'verifier'" in msg and "300.0 MiB" in msg and "200.0 MiB" in msg and str(300 * MB) in msg
    assert isinstance(e.value, UserError) and e.value.group == "verifier"


def test_max_awake_limits_resident_engines():
    gs = [G("a", AWAKE, last_used=1.0), G("b", AWAKE, serving=1, last_used=0.0), G("c", pending=1, oldest=0.0)]
    assert decide(gs, None, max_awake=3) == Serve("c", wake=True)
    assert decide(gs, None, max_awake=2) == Serve("c", wake=True, sleep=("a",))
    gs[0] = G("a", AWAKE, serving=1)
    d = decide(gs, None, max_awake=2)
    assert isinstance(d, Wait) and d.blocked_by == ("a", "b") and "2 of 2 engines" in d.reason


def test_max_wait_lets_a_starving_group_jump_ahead():
    gs = [G("big", pending=50, oldest=9.0), G("small", pending=1, oldest=1.0)]
    assert decide(gs, None).group == "big"
    assert decide(gs, None, now=10.0, max_wait_s=5.0).group == "small"
    assert decide(gs, None, now=5.0, max_wait_s=5.0).group == "big"


def test_estimate_footprint():
    assert estimate_footprint(7, hint=9, largest_known=11, budget=13) == 7
    assert estimate_footprint(None, hint=9, largest_known=11, budget=13) == 9
    assert estimate_footprint(None, hint=None, largest_known=11, budget=13) == 11
    assert estimate_footprint(None, hint=None, largest_known=11, budget=5) == 5  # never refused for another's size
    assert estimate_footprint(None, hint=None, largest_known=None, budget=13) == 13  # first load runs alone
    assert estimate_footprint(None, hint=None, largest_known=None, budget=None) == 0


def test_fmt_and_state_validation():
    assert fmt_bytes(512) == "512 B" and fmt_bytes(3 * MB) == "3.0 MiB" and fmt_bytes(5 * 2**30) == "5.0 GiB"
    with pytest.raises(ValueError, match="unknown state"):
        GroupState("a", 1, "dozing")


def test_held_groups_sleep_first_least_recently_used_first():
    gs = [G("a", AWAKE, last_used=3.0, held=True), G("b", AWAKE, last_used=1.0, held=True),
          G("c", pending=5, oldest=0.0)]
    assert to_hold(gs) == ("b", "a")
    assert decide(gs, 100) == Sleep(("b", "a"))  # before any request is served
    # a held group that serves finishes its round; one that is waking or sleeping is left alone
    gs = [G("a", AWAKE, serving=1, held=True), G("b", WAKING, serving=1, held=True), G("d", SLEEPING, held=True)]
    assert to_hold(gs) == () and decide(gs, 100) is None


def test_held_groups_are_never_woken_and_do_not_block_the_others():
    gs = [G("h", pending=9, oldest=0.0, held=True), G("x", pending=1, oldest=5.0)]
    assert [g.name for g in order(gs)] == ["x"]  # the held group's requests wait for the release
    assert decide(gs, 100) == Serve("x", wake=True)
    assert decide([G("h", pending=9, oldest=0.0, held=True)], 100) is None
    released = [G("h", pending=9, oldest=0.0), G("x", pending=1, oldest=5.0)]
    assert decide(released, 100) == Serve("h", wake=True)


# ---------------------------------------------------------------------------------- LocalPool + FakeEngine


def req(text: str, agent: str = "a") -> Request:
    return Request(agent, [{"role": "user", "content": text}], Sampling(seed=0))


def fake_pool(ledger: Ledger, names=("v", "s", "a"), fp=100, **opts):
    engines: dict[str, FakeEngine] = {}

    def factory(n):
        def make():
            engines[n] = FakeEngine(n, fp, ledger)
            return engines[n]
        return make

    return LocalPool({n: factory(n) for n in names}, **opts), engines


def test_budget_of_one_engine_serves_an_interleaved_load():
    async def main():
        ledger = Ledger(budget=100)
        pool, engines = fake_pool(ledger, budget_bytes=100)
        async with pool:
            assert ledger.events[:3] == [("load", "v"), ("sleep", "v"), ("load", "s")]

            async def episode(i):
                out = []
                for agent in ("v", "s", "a"):
                    [c] = await pool.generate(agent, [req(f"{i}", agent)])
                    out.append(c.text)
                return out

            results = await asyncio.gather(*(episode(i) for i in range(12)))
            st = pool.stats()
        assert results == [[f"{a}:{i}" for a in ("v", "s", "a")] for i in range(12)]
        assert ledger.peak == 100  # the ledger asserts it at every wake
        assert st["requests"] == 36 and st["groups"]["v"]["requests"] == 12
        assert st["loads"] == 3 and st["wakes"] >= 2 and st["sleeps"] >= st["wakes"]
        assert st["peak_resident_bytes"] == 100
        assert st["budget_bytes"] == 100 and st["peak_rss_bytes"] > 0 and st["peak_memory_kind"] in ("rss", "cuda_max_allocated")
        assert ledger.resident == 0  # close() closed every engine

    asyncio.run(main())


def test_most_pending_group_is_served_first_and_lru_sleeps():
    async def main():
        ledger = Ledger(budget=200)
        pool, engines = fake_pool(ledger, budget_bytes=200)  # after preload: v asleep, s and a awake
        async with pool:
            assert [g for g, st in ((n, pool.stats()["groups"][n]["state"]) for n in "vsa") if st == "awake"] == ["s", "a"]
            await pool.generate("s", [req("x")])  # s is now more recently used than a
            ledger.events.clear()
            # 1 request for s, 3 for v (asleep): v first, and a (LRU idle) sleeps to make room
            outs = await asyncio.gather(pool.generate("s", [req("1")]), pool.generate("v", [req("2"), req("3"), req("4")]))
            assert outs[1][0].text == "v:2"
        ev = ledger.events
        assert ev.index(("sleep", "a")) < ev.index(("wake", "v")) < ev.index(("gen", "v"))
        assert ("sleep", "s") not in ev[: ev.index(("wake", "v"))]

    asyncio.run(main())


def test_queued_groups_go_by_pending_count_not_arrival():
    async def main():
        ledger = Ledger(budget=100)
        gate = asyncio.Event()
        pool = LocalPool({"busy": FakeEngine("busy", 100, ledger, gate=gate),
                          "s": lambda: FakeEngine("s", 100, ledger), "v": lambda: FakeEngine("v", 100, ledger)},
                         budget_bytes=100, preload=False)
        async with pool:
            t0 = asyncio.create_task(pool.generate("busy", [req("0")]))
            await asyncio.sleep(0.01)
            ts = asyncio.create_task(pool.generate("s", [req("1")]))  # older, but 1 pending
            await asyncio.sleep(0.01)
            tv = asyncio.create_task(pool.generate("v", [req("2"), req("3"), req("4")]))  # 3 pending
            await asyncio.sleep(0.01)
            gate.set()
            await asyncio.gather(t0, ts, tv)
        ev = ledger.events
        assert ev.index(("gen", "v")) < ev.index(("load", "s"))
        assert [e for e in ev if e[0] in ("load", "sleep")] == [("load", "busy"), ("sleep", "busy"), ("load", "v"),
                                                                ("sleep", "v"), ("load", "s")]

    asyncio.run(main())


def test_waits_for_a_serving_engine_and_never_sleeps_it():
    async def main():
        ledger = Ledger(budget=100)
        gate = asyncio.Event()
        engines = {"a": FakeEngine("a", 100, ledger, gate=gate)}
        # "b" joins later: the pool must not load it while "a" is busy
        pool = LocalPool({"a": engines["a"], "b": lambda: FakeEngine("b", 100, ledger)}, budget_bytes=100, preload=False)
        async with pool:
            ta = asyncio.create_task(pool.generate("a", [req("slow")]))
            await asyncio.sleep(0.02)
            tb = asyncio.create_task(pool.generate("b", [req("hi")] * 5))  # more pending, but a is serving
            await asyncio.sleep(0.05)
            assert not tb.done() and ("load", "b") not in ledger.events and engines["a"].is_awake
            gate.set()
            assert (await tb)[0].text == "b:hi" and (await ta)[0].text == "a:slow"
        ev = ledger.events
        assert ev.index(("done", "a")) < ev.index(("sleep", "a")) < ev.index(("load", "b"))

    asyncio.run(main())


def test_engine_larger_than_the_budget_is_an_error():
    async def main():
        ledger = Ledger(budget=None)
        pool = LocalPool({"small": lambda: FakeEngine("small", 50, ledger),
                          "huge": lambda: FakeEngine("huge", 500, ledger)}, budget_bytes=100)
        with pytest.raises(BudgetError, match=r"worker group 'huge' needs 500 B .* budget is 100 B"):
            await pool.start()
        assert ledger.resident == 0  # start() cleaned up after itself

        # lazily (no preload) the error reaches the callers of that group only
        pool = LocalPool({"small": lambda: FakeEngine("small", 50, Ledger(None)),
                          "huge": lambda: FakeEngine("huge", 500, Ledger(None))}, budget_bytes=100, preload=False)
        async with pool:
            with pytest.raises(BudgetError, match="'huge'"):
                await pool.generate("huge", [req("x")])
            with pytest.raises(BudgetError, match="'huge'"):  # known footprint now: refused at once
                await pool.generate("huge", [req("x")])
            assert (await pool.generate("small", [req("y")]))[0].text == "small:y"

    asyncio.run(main())


def test_budget_models_and_unlimited():
    async def main():
        ledger = Ledger(budget=200)
        pool, _ = fake_pool(ledger, budget_models=2, preload=False)
        async with pool:
            outs = await asyncio.gather(*(pool.generate(n, [req(str(i))]) for i in range(6) for n in "vsa"))
            assert pool.budget_bytes == 200
        assert len(outs) == 18 and ledger.peak <= 200

        ledger = Ledger(budget=None)
        pool, _ = fake_pool(ledger)
        async with pool:
            await asyncio.gather(*(pool.generate(n, [req("x")]) for n in "vsa"))
            st = pool.stats()
        assert st["wakes"] == 0 and st["sleeps"] == 0 and ledger.peak == 300 and st["budget_bytes"] is None

    asyncio.run(main())


def test_views_stand_in_for_the_runtime_engines():
    from drmas_bench.agents.team import TeamSpec, WorkerGroupSpec
    from drmas_bench.runner import TeamRuntime

    async def main():
        ledger = Ledger(budget=100)
        pool, _ = fake_pool(ledger, names=("big", "small"), budget_models=1)
        team = TeamSpec("search_route", {"verifier": "big", "searcher": "small", "answerer": "small"},
                        {"big": WorkerGroupSpec("big", "m1"), "small": WorkerGroupSpec("small", "m2")})
        async with pool:
            rt = TeamRuntime(team, pool.views(), Sampling())
            a = await rt.generate("verifier", req("q"))
            b = await rt.generate("answerer", req("q"))
            view = pool.view("small")
            assert view.is_awake and view.footprint_bytes() == 100
            await view.close()  # a no-op: the pool owns the engine
            assert view.is_awake
        assert (a.text, b.text) == ("big:q", "small:q")

    asyncio.run(main())


def test_errors_are_one_line_and_close_fails_queued_requests():
    async def main():
        ledger = Ledger(budget=100)
        gate = asyncio.Event()
        pool = LocalPool({"a": FakeEngine("a", 100, ledger, gate=gate),
                          "b": lambda: FakeEngine("b", 100, ledger)}, budget_bytes=100, preload=False)
        with pytest.raises(UserError, match="unknown worker group 'zzz'; the pool has: a, b"):
            await pool.generate("zzz", [req("x")])
        assert await pool.generate("a", []) == []
        ta = asyncio.create_task(pool.generate("a", [req("x")]))
        await asyncio.sleep(0.02)
        tb = asyncio.create_task(pool.generate("b", [req("y")]))
        await asyncio.sleep(0.02)
        closing = asyncio.create_task(pool.close())
        await asyncio.sleep(0.01)
        gate.set()
        await closing
        assert (await ta)[0].text == "a:x"  # a running round finishes
        with pytest.raises(UserError, match="closed before the request was served"):
            await tb
        with pytest.raises(UserError, match="is closed"):
            await pool.generate("a", [req("x")])

    asyncio.run(main())
    with pytest.raises(UserError, match="budget_bytes or budget_models, not both"):
        LocalPool({"a": FakeEngine("a", 1, Ledger(None))}, budget_bytes=1, budget_models=1)
    with pytest.raises(UserError, match="unknown pool 'k8s'"):
        make_pool("k8s", {})
    with pytest.raises(UserError, match="expected an EngineSpec"):
        LocalPool({"a": 42})


def test_a_failing_engine_fails_only_its_requests():
    class Broken(FakeEngine):
        async def generate(self, requests):
            raise RuntimeError("boom")

    async def main():
        ledger = Ledger(budget=None)
        pool = LocalPool({"ok": FakeEngine("ok", 1, ledger), "bad": Broken("bad", 1, ledger)})
        async with pool:
            res = await asyncio.gather(pool.generate("bad", [req("x")]), pool.generate("ok", [req("y")]),
                                       return_exceptions=True)
            assert isinstance(res[0], RuntimeError) and res[1][0].text == "ok:y"
            assert pool.stats()["groups"]["bad"]["errors"] == 1

    asyncio.run(main())


def test_a_cancelled_caller_is_not_served():
    async def main():
        ledger = Ledger(budget=100)
        gate = asyncio.Event()
        pool = LocalPool({"a": FakeEngine("a", 100, ledger, gate=gate), "b": lambda: FakeEngine("b", 100, ledger)},
                         budget_bytes=100, preload=False)
        async with pool:
            ta = asyncio.create_task(pool.generate("a", [req("x")]))
            await asyncio.sleep(0.01)
            tb = asyncio.create_task(pool.generate("b", [req("y")]))
            await asyncio.sleep(0.01)
            tb.cancel()
            await asyncio.sleep(0.01)
            gate.set()
            await ta
            await asyncio.sleep(0.02)
            assert ("load", "b") not in ledger.events and pool.stats()["groups"]["b"]["requests"] == 0
        assert tb.cancelled()

    asyncio.run(main())


def adopted_pool(ledger, names=("v", "s", "a"), fp=100, keeps=True, **opts):
    from fake_engines import FakeWeightsEngine

    from drmas_bench.pool import Adopted

    engines = {n: FakeWeightsEngine(n, fp, ledger, keeps_weights_asleep=keeps) for n in names}  # awake, as handed over
    ledger.budget = None  # adopted awake, over the budget, until held asleep
    return LocalPool({n: Adopted(e, fp, awake=True, model=n) for n, e in engines.items()}, preload=False, **opts), engines


def test_adopted_engines_are_held_asleep_served_in_place_and_not_closed():
    async def main():
        ledger = Ledger(budget=None)
        pool, engines = adopted_pool(ledger, budget_bytes=100)
        async with pool:
            assert ledger.resident == 300 and pool.stats()["loads"] == 0  # adopted: nothing loaded
            await pool.hold_asleep()
            assert ledger.resident == 0 and all(pool.state_of(n) == ASLEEP for n in engines)
            ledger.budget, ledger.peak = 100, 0  # from here the ledger fails the test if the pool breaks the budget
            # requests for held groups wait; the release serves them, one engine awake at a time
            task = asyncio.ensure_future(asyncio.gather(*(pool.generate(n, [req(str(i), n)]) for i in range(4) for n in "vsa")))
            await asyncio.sleep(0.05)
            assert not task.done() and ledger.resident == 0
            pool.release()
            outs = await task
            assert sorted(o[0].text for o in outs)[:2] == ["a|initial|0|0", "a|initial|0|1"]
            st = pool.stats()
            assert st["wakes"] >= 3 and st["loads"] == 0 and ledger.peak == 100
            await pool.hold_asleep(["v", "s", "a"])
            assert ledger.resident == 0
        assert all(not e._awake for e in engines.values())
        assert ("close",) not in ledger.events
        engines["v"].ledger.budget = None
        await engines["v"].wake()  # still usable: the pool let go without closing it
        assert (await engines["v"].generate([req("z", "v")]))[0].text == "v|initial|0|z"

    asyncio.run(main())


def test_hold_asleep_waits_for_a_running_round():
    async def main():
        ledger = Ledger(budget=None)
        pool, engines = adopted_pool(ledger, names=("v",))
        gate = asyncio.Event()
        engines["v"].gate = gate
        async with pool:
            running = asyncio.ensure_future(pool.generate("v", [req("x", "v")]))
            await asyncio.sleep(0.01)
            hold = asyncio.ensure_future(pool.hold_asleep())
            await asyncio.sleep(0.01)
            assert not hold.done() and engines["v"]._awake  # never slept under a running round
            gate.set()
            await hold
            assert (await running)[0].text == "v|initial|0|x" and not engines["v"]._awake
            ev = ledger.events
            assert ev.index(("done", "v")) < ev.index(("sleep", "v"))

    asyncio.run(main())
