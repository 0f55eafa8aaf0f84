"""The runner (`runner.run_episodes` with its `EpisodeRun` context): every (task, sample) not yet in
the run directory runs once, is graded by its benchmark's family and appended in flush batches; the
call chain (`calls.CallChain`) prices each trajectory and its limits meter gates each episode. The
engine is a fake (named so): what is tested is the orchestration around it."""

from __future__ import annotations

import asyncio
import json

from drmas_bench.agents.team import TeamSpec, WorkerGroupSpec
from drmas_bench.calls import CallChain
from drmas_bench.limits import Limits, Meter
from drmas_bench.pricing import PriceSheet
from drmas_bench.run_dir import RunDir
from drmas_bench.runner import EpisodeRun, TeamRuntime, run_episodes
from drmas_bench.suites.toy.benchmarks import make_toy_tasks
from drmas_bench.types import Completion, Sampling
from drmas_bench.workflows import get_workflow

TEAM = TeamSpec("toy", {"solver": "wg", "checker": "wg"}, {"wg": WorkerGroupSpec("wg", "fake")})


class FakeEngine:
    """A fake engine: the right sum (from the question) for the solver, approve for the checker; it
    counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, requests):
        self.calls += len(requests)
        out = []
        for r in requests:
            if r.agent == "solver":
                a, b = (int(x) for x in r.messages[-1]["content"].split("?")[0].split("is ")[1].split(" + "))
                out.append(Completion(f"<answer>{a + b}</answer>", prompt_tokens=10, completion_tokens=4))
            else:
                out.append(Completion("<verdict>approve</verdict>", prompt_tokens=20, completion_tokens=5))
        return out


def _run(tasks, n, ctx):
    return asyncio.run(run_episodes(tasks, n, ctx))


def test_each_sample_runs_once_and_a_rerun_resumes(tmp_path):
    tasks = make_toy_tasks(5)
    engine = FakeEngine()
    store = RunDir(tmp_path / "run", {"identity": {}})
    stats = _run(tasks[:3], 2, EpisodeRun(TeamRuntime(TEAM, {"wg": engine}, Sampling()), get_workflow("toy"), store,
                                           flush_every=4, progress=False))
    assert (stats.episodes, stats.skipped, engine.calls) == (6, 0, 12)  # solver + checker per episode
    stats = _run(tasks, 2, EpisodeRun(TeamRuntime(TEAM, {"wg": engine}, Sampling()), get_workflow("toy"), store,
                                      progress=False))
    store.close()
    assert (stats.episodes, stats.skipped, engine.calls) == (4, 6, 20)
    recs = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert sorted((r["task"]["id"], r["sample_idx"]) for r in recs) == sorted((t.id, i) for t in tasks for i in range(2))
    assert all(r["correct"] for r in recs)  # graded by the toy family


def test_the_call_chain_prices_each_trajectory():
    prices = PriceSheet.from_dict({"models": {"fake": {"input_per_1m": 1e6, "output_per_1m": 2e6}}}).with_aliases(
        {"wg": "fake"})
    got: list = []
    _run(make_toy_tasks(2), 1, EpisodeRun(TeamRuntime(TEAM, {"wg": FakeEngine()}, Sampling()), get_workflow("toy"),
                                          calls=CallChain(prices=prices), progress=False, on_finished=got.extend))
    # solver: 10 prompt + 4 completion tokens; checker: 20 + 5; $1 per prompt token, $2 per completion token
    assert [t.cost_usd for t in got] == [10 + 8 + 20 + 10] * 2


def test_a_token_limit_stops_new_episodes_and_says_which():
    """The chain's meter counts every call (its engine wrapper) and gates each episode's start: the
    run stops once 100 tokens are spent, the calls of episodes already started are kept."""
    chain = CallChain(meter=Meter(Limits(max_tokens=100, where={"max_tokens": "--max-tokens"})))
    engines = chain.wrap({"wg": FakeEngine()}, TEAM, {})
    got: list = []
    stats = _run(make_toy_tasks(20), 1, EpisodeRun(TeamRuntime(TEAM, engines, Sampling()), get_workflow("toy"),
                                                   calls=chain, concurrency=1, progress=False, on_finished=got.extend))
    assert stats.stopped is not None and "--max-tokens" in str(stats.stopped)
    spent = sum(tu.completion.prompt_tokens + tu.completion.completion_tokens for t in got for tu in t.turns)
    assert 0 < len(got) < 20 and 100 <= spent <= 100 + 39  # at most one episode (39 tokens) past the limit
