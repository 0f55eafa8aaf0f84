"""LocalPool with real hf engines: the runner routed through pool views, identical results under
any budget, and (SmolLM2, in a subprocess) peak RSS within one model's footprint plus a stated
overhead when the budget is one model.

Run this file as a script for the subprocess half: ``python tests/test_pool_local.py rss MODEL``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("psutil")

from drmas_bench.pool import EngineSpec, LocalPool  # noqa: E402
from drmas_bench.types import Request, Sampling  # noqa: E402

MiB = 2**20
# What a serving engine needs beyond its weights at the subprocess load below (activations, KV
# cache, logits, three tokenizers, allocator slack), over a baseline taken after the imports that
# loading does. Measured ~36-40 MiB for SmolLM2 at this load (CPU, float32, 3 episodes; ~120 MiB at
# scripts/bench_pool.py's 24 episodes), also when spawned by a 2.5 GB parent; the bound leaves room
# for noise and is far below a second model (513 MiB). (It was once 320 MiB because the peak was read
# from ru_maxrss, which holds the spawning pytest process's own peak: see peak_rss_bytes.)
RSS_OVERHEAD = 160 * MiB
AGENTS = ("verifier", "searcher", "answerer")


def tiny_specs(names=AGENTS, **opts):
    return {n: EngineSpec("hf", "tiny-random", {"device": "cpu", "max_wait_ms": 2, **opts}) for n in names}


def req(agent: str, text: str, seed: int, n: int = 6, t: float = 0.0) -> Request:
    return Request(agent, [{"role": "user", "content": text}], Sampling(temperature=t, max_new_tokens=n, seed=seed))


async def search_like_load(pool, episodes: int, n: int, t: float = 0.0) -> list[list[int]]:
    """verifier -> searcher -> answerer per episode, each prompt carrying the previous output."""

    async def episode(e: int) -> list[list[int]]:
        [v] = await pool.generate("verifier", [req("verifier", f"question {e}", 1000 + e, n, t)])
        [s] = await pool.generate("searcher", [req("searcher", f"q{e} {v.text[:40]}", 2000 + e, n, t)])
        await asyncio.sleep(0.002 * (e % 3))
        [a] = await pool.generate("answerer", [req("answerer", f"q{e} {s.text[:40]}", 3000 + e, n, t)])
        return [v.token_ids, s.token_ids, a.token_ids]

    return [ids for ep in await asyncio.gather(*(episode(e) for e in range(episodes))) for ids in ep]


def test_budget_one_equals_unlimited_tiny():
    async def run(**opts):
        async with LocalPool(tiny_specs(), **opts) as pool:
            out = await search_like_load(pool, episodes=6, n=6)
            return out, pool.stats()

    limited, st1 = asyncio.run(run(budget_models=1))
    unlimited, st0 = asyncio.run(run())
    assert limited == unlimited and len(limited) == 18
    fp = st1["groups"]["verifier"]["footprint_bytes"]
    assert fp > 1_000_000 and st1["budget_bytes"] == fp
    assert st1["peak_resident_bytes"] == fp and st0["peak_resident_bytes"] == 3 * fp
    assert st1["wakes"] >= 2 and st1["sleeps"] >= st1["wakes"] and st1["wake_s"] > 0
    assert st0["wakes"] == 0 and st0["sleeps"] == 0
    assert all(st1["groups"][a]["requests"] == 6 for a in AGENTS)
    json.dumps(st1)  # the run summary stores it as JSON


def test_runner_through_pool_views_matches_plain_engines():
    from drmas_bench.agents.team import TeamSpec, WorkerGroupSpec
    from drmas_bench.engines import make_engine
    from drmas_bench.runner import EpisodeRun, TeamRuntime, run_episodes
    from drmas_bench.suites.toy.benchmarks import make_toy_tasks
    from drmas_bench.workflows.base import get_workflow

    import drmas_bench.suites.toy.toy  # noqa: F401 - registers "toy"

    wf = get_workflow("toy")
    team = TeamSpec("toy", {"solver": "wg_solver", "checker": "wg_checker"},
                    {w: WorkerGroupSpec(w, "tiny-random", options={"device": "cpu"}) for w in ("wg_solver", "wg_checker")})
    sampling = Sampling(temperature=0.0, max_new_tokens=8)
    tasks = make_toy_tasks(4)

    async def with_pool():
        from drmas_bench.pool import specs_from_team

        async with LocalPool(specs_from_team(team), budget_models=1) as pool:
            runtime = TeamRuntime(team, pool.views(), sampling)
            got: list = []
            await run_episodes(tasks, 2, EpisodeRun(runtime, wf, seed=3, progress=False, on_finished=got.extend))
            return got, pool.stats()

    async def plain():
        engines = {w: make_engine("hf", "tiny-random", device="cpu") for w in team.worker_groups}
        got: list = []
        await run_episodes(tasks, 2, EpisodeRun(TeamRuntime(team, engines, sampling), wf, seed=3, progress=False,
                                                on_finished=got.extend))
        for e in engines.values():
            await e.close()
        return got

    pooled, st = asyncio.run(with_pool())
    ref = asyncio.run(plain())
    key = lambda t: (t.task.id, t.sample_idx)  # noqa: E731
    a = [[(tu.agent, tu.wg, tu.completion.token_ids) for tu in t.turns] for t in sorted(pooled, key=key)]
    b = [[(tu.agent, tu.wg, tu.completion.token_ids) for tu in t.turns] for t in sorted(ref, key=key)]
    assert a == b and len(a) == 8
    assert st["peak_resident_bytes"] == st["budget_bytes"]


def test_engine_load_error_names_the_worker_group(tmp_path):
    async def main():
        pool = LocalPool({"ok": EngineSpec("hf", "tiny-random", {"device": "cpu"}),
                          "bad": EngineSpec("hf", "tiny-random", {"no_such_option": 1})})
        with pytest.raises(Exception, match=r"worker group 'bad'.*no_such_option"):
            await pool.start()

    asyncio.run(main())


# ---------------------------------------------------------------------------------- RSS (subprocess)


def _rss_worker(model: str) -> dict:
    """Budget 1 model, then (same process, after the budget-1 peak is recorded) unlimited."""
    import psutil
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from drmas_bench.engines.base import resolve_model_path
    from drmas_bench.engines.footprint import peak_rss_bytes  # not ru_maxrss: it holds the parent's peak

    # the baseline holds the code loading imports (torch, transformers, the architecture's modeling
    # module, tokenizer classes), not the weights
    path = resolve_model_path(model)
    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(path))]
    AutoTokenizer.from_pretrained(path)
    base = psutil.Process().memory_info().rss

    async def run(budget):
        specs = {a: EngineSpec("hf", model, {"device": "cpu"}) for a in AGENTS}
        async with LocalPool(specs, budget_models=budget) as pool:
            out = await search_like_load(pool, episodes=3, n=4, t=0.7)
            return out, pool.stats()

    limited, st1 = asyncio.run(run(1))
    peak1 = peak_rss_bytes()
    unlimited, st0 = asyncio.run(run(None))
    peak0 = peak_rss_bytes()
    return {"base": base, "peak_budget1": peak1, "peak_unlimited": peak0,
            "footprint": st1["groups"]["verifier"]["footprint_bytes"], "wakes": st1["wakes"],
            "same": limited == unlimited, "n": len(limited)}


@pytest.mark.slow
def test_budget_one_keeps_peak_rss_within_one_model_smollm2():
    from drmas_bench.models import ALIASES, cache_dir

    if not (cache_dir() / "models" / "smollm2-135m-instruct").is_dir() and "smollm2-135m-instruct" in ALIASES:
        pytest.skip("smollm2-135m-instruct is not prepared (drmas-bench models prepare smollm2-135m-instruct)")
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "rss", "smollm2-135m-instruct"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    fp = r["footprint"]
    assert fp > 400 * MiB  # float32 SmolLM2: the weights dominate the noise
    over = r["peak_budget1"] - r["base"]
    assert over <= fp + RSS_OVERHEAD, f"budget 1: {over / MiB:.0f} MiB over base, footprint {fp / MiB:.0f} MiB"
    assert r["peak_unlimited"] - r["base"] >= 2.5 * fp  # the unlimited run really holds three models
    assert r["same"] and r["n"] == 9 and r["wakes"] >= 2


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "rss":
        print(json.dumps(_rss_worker(sys.argv[2])))
    else:
        sys.exit("usage: python tests/test_pool_local.py rss MODEL")


def test_peak_rss_is_the_process_own_not_its_parents():
    """A child spawned by an 800 MB parent: peak_rss_bytes reports the child's own peak (ru_maxrss
    would report the parent's, which is how the budget test above once read 800 MiB of 'overhead')."""
    code = (
        "import subprocess, sys\n"
        "ballast = bytearray(800 * 2**20)\n"
        "for i in range(0, len(ballast), 4096): ballast[i] = 1\n"
        "child = 'import resource; from drmas_bench.engines.footprint import peak_rss_bytes; "
        "print(peak_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True, check=True).stdout)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    own, maxrss = (int(x) for x in out.split())
    assert own < 300 * MiB, own / MiB
    if sys.platform.startswith("linux"):
        assert maxrss > 800 * MiB  # the kernel behaviour this guards against is still there
