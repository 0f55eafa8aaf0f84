"""Ray resources checked up front, on a local Ray cluster with one *logical* GPU:
a demand the cluster cannot meet is a one-line error before any actor exists; an actor Ray cannot
place is a one-line error after ``timeout_s``, never a hang; an actor's exception reaches the
controller as one line and its traceback reaches the driver's log."""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import busy_factor
from drmas_bench.types import Request, Sampling, UserError

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def one_gpu():
    if ray.is_initialized():  # pragma: no cover - another module left one running
        ray.shutdown()
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=True)  # a new Ray, not a cluster left on this machine
    yield
    ray.shutdown()


def test_math_recipe_on_one_gpu_is_a_one_line_error_before_any_actor(one_gpu, data_dir, tmp_path):
    from drmas_trainer.config.train import load_config
    from drmas_trainer.trainer import train

    cfg = load_config("math_qwen3_4b", {"model": "tiny-random", "device": "cpu", "data.data_dir": str(data_dir),
                                        "data.limit": 4, "rollout.prompts_per_step": 2, "steps": 1, "epochs": None,
                                        "fsdp.ranks": 1})  # one unsharded group per GPU (the recipe shards over 4)
    t0 = time.monotonic()
    with pytest.raises(UserError) as e:
        train(cfg, tmp_path / "run", use_ray=True, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and time.monotonic() - t0 < 30 * busy_factor()
    assert "needs 2 GPU but the Ray cluster has 1 GPU" in msg
    assert "solver, verifier" in msg and "ray.gpus_per_worker=0.5" in msg and "--shared" in msg
    assert not ray.util.list_named_actors() and ray.available_resources().get("GPU") == 1.0  # nothing placed


def test_unplaceable_actor_times_out_with_one_line(one_gpu):
    from drmas_trainer.config.train import AgentConfig
    from drmas_trainer.ray_workers import RayWorkerHandle, check_worker_demand

    @ray.remote(num_gpus=1, num_cpus=0)
    class Holder:  # another job holding the only GPU
        def ping(self) -> int:
            return 1

    holder = Holder.remote()
    ray.get(holder.ping.remote())
    try:
        check_worker_demand(type("R", (), {"gpus_per_worker": 1.0})(), {"solver": None})  # fits the cluster in total
        h = RayWorkerHandle.spawn("solver", ["solver"], AgentConfig(), "tiny-random", gpus=1.0, device="cpu")

        async def go():
            t0 = time.monotonic()
            with pytest.raises(UserError) as e:
                await h.ready(timeout_s=2)
            waited = time.monotonic() - t0
            t0 = time.monotonic()
            await h.close()  # never placed: must not wait for an answer
            return str(e.value), waited, time.monotonic() - t0

        msg, waited, closing = asyncio.run(go())
        assert 2 <= waited < 10 and closing < 5
        assert "\n" not in msg and "worker group 'solver': Ray could not place its actor (1 GPU) within 2 s" in msg
        assert "cluster: 1 GPU; free now: 0 GPU" in msg
    finally:
        ray.kill(holder)


@pytest.mark.slow  # Ray actors failing in a real cluster: the end-to-end tier
def test_actor_failures_are_one_line_and_reach_the_driver_log(one_gpu, capfd):
    from drmas_trainer.config.train import AgentConfig
    from drmas_trainer.ray_workers import RayWorkerHandle

    async def go():
        bad = RayWorkerHandle.spawn("bad", ["solver"], AgentConfig(), "/nonexistent/model", gpus=0.0, device="cpu")
        try:
            with pytest.raises(UserError) as e1:  # the worker's own UserError, as is
                await bad.ready(timeout_s=30)
        finally:
            await bad.close()
        ok = RayWorkerHandle.spawn("ok", ["solver"], AgentConfig(), "tiny-random", gpus=0.0, device="cpu")
        try:
            await ok.ready(timeout_s=30)
            with pytest.raises(UserError) as e2:  # an unexpected exception inside the actor
                await ok._call("no_such_method")
        finally:
            await ok.close()
        return str(e1.value), str(e2.value)

    m1, m2 = asyncio.run(go())
    assert "\n" not in m1 and m1.startswith("worker group 'bad'") and "/nonexistent/model: no such model directory" in m1
    assert "\n" not in m2 and m2.startswith("worker group 'ok' (Ray actor):") and "no_such_method" in m2
    err = ""
    for _ in range(40):  # the actor's stderr is streamed to the driver asynchronously
        err += capfd.readouterr().err
        if "Traceback" in err and "no_such_method" in err:
            break
        time.sleep(0.25)
    assert "Traceback" in err and "no_such_method" in err


def test_ray_pool_actor_demands_are_checked_and_waits_bounded(one_gpu):
    from drmas_bench.pool import EngineSpec
    from drmas_bench.pool.ray_pool import RayPool

    spec = {"a": EngineSpec("hf", "tiny-random", {"device": "cpu"})}

    async def start(**kw):
        pool = RayPool(spec, gpus_per_group=0, **kw)
        try:
            await pool.start()
            await pool.generate("a", [Request("a", [{"role": "user", "content": "hi"}], Sampling(max_new_tokens=2))])
        finally:
            await pool.close()

    # a custom resource the cluster does not have at all: one line before any actor
    with pytest.raises(UserError, match=r"^a RayPool worker-group actor needs 1 nosuch but the Ray cluster has 0 nosuch"):
        asyncio.run(start(actor_options={"resources": {"nosuch": 1}}))
    # CPUs that exist but are held: the actor waits at most placement_timeout_s
    held = ray.remote(num_cpus=2)(type("HoldCPUs", (), {"ping": lambda self: 1})).remote()
    ray.get(held.ping.remote())
    try:
        t0 = time.monotonic()
        with pytest.raises(UserError, match=r"worker group 'a': Ray could not place its actor \(1 CPU\) within 2 s "
                                            r"\(cluster: 2 CPU; free now: 0 CPU\)"):
            asyncio.run(start(actor_options={"num_cpus": 1}, placement_timeout_s=2))
        assert time.monotonic() - t0 < 15 * busy_factor()
    finally:
        ray.kill(held)
