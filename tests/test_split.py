"""A split run's parts that take seconds: how the coordinator deals episodes and takes them back
(with fake workers: plain objects that keep what they were sent), the plan a worker is built from,
the flag and the checks on it. The split runs themselves (spawned processes, Ray actors, SIGTERM,
a killed worker) are in tests/test_split_e2e.py (slow)."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from drmas_bench.cli import main
from drmas_bench.split import Dispatcher
from drmas_bench.types import Task, Trajectory, UserError


class FakeWorker:
    """A fake worker: keeps every batch of (item, task index, sample) it is sent."""

    def __init__(self) -> None:
        self.sent: list[list[tuple[int, int, int]]] = []

    def send(self, items):
        self.sent.append(list(items))


# a plan without a local model to check (nothing is called: a plan opens nothing)
REMOTE = {"model": "m", "engine": "openai", "base_url": "http://127.0.0.1:9/v1"}
TASKS = [Task(str(i), "toy", f"{i} + 1", [str(i + 1)]) for i in range(4)]


def _dispatcher(n: int) -> tuple[Dispatcher, list[FakeWorker]]:
    workers = [FakeWorker() for _ in range(n)]
    d = Dispatcher(TASKS)
    d.attach(workers)
    return d, workers


def _back(traj_task_index: int, sample: int) -> Trajectory:
    t = Trajectory(task=None, sample_idx=sample, final_answer=f"a{traj_task_index}")  # type: ignore[arg-type]
    return t


def test_episodes_go_to_the_least_loaded_worker_in_one_message_per_turn_and_come_back_with_their_task():
    async def main_():
        d, (w0, w1) = _dispatcher(2)
        plays = [asyncio.ensure_future(d.play(TASKS[i % 4], i // 4)) for i in range(6)]
        await asyncio.sleep(0)  # the plays queue their items
        await asyncio.sleep(0)  # the flush sends them
        assert [len(b) for b in w0.sent] == [3] and [len(b) for b in w1.sent] == [3]  # dealt evenly, one message each
        assert d.load == [3, 3]
        # worker 1 is fast: everything it holds comes back, so the next three all go to it
        d.deliver(1, [(item, _back(ti, s), None) for item, ti, s in w1.sent[0]])
        more = [asyncio.ensure_future(d.play(TASKS[i % 4], 2 + i // 4)) for i in range(3)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(w1.sent) == 2 and len(w1.sent[1]) == 3 and len(w0.sent) == 1
        d.deliver(0, [(item, _back(ti, s), None) for item, ti, s in w0.sent[0]])
        d.deliver(1, [(item, _back(ti, s), None) for item, ti, s in w1.sent[1]])
        got = await asyncio.gather(*plays, *more)
        for traj, (task_i, sample) in zip(got, [(i % 4, i // 4) for i in range(6)] + [(i % 4, 2 + i // 4) for i in range(3)]):
            assert traj.task is TASKS[task_i] and traj.sample_idx == sample and traj.final_answer == f"a{task_i}"
        assert d.episodes == [3, 6] and d.load == [0, 0]

    asyncio.run(main_())


def test_an_episode_error_from_a_worker_is_raised_by_its_play():
    async def main_():
        d, (w0,) = _dispatcher(1)
        play = asyncio.ensure_future(d.play(TASKS[0], 0))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        d.deliver(0, [(w0.sent[0][0][0], None, ValueError("the workflow failed"))])
        with pytest.raises(ValueError, match="the workflow failed"):
            await play

    asyncio.run(main_())


def test_a_dead_worker_fails_what_it_held_and_every_later_play_but_not_what_came_back():
    async def main_():
        d, (w0, w1) = _dispatcher(2)
        plays = [asyncio.ensure_future(d.play(TASKS[i], 0)) for i in range(4)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        d.deliver(0, [(w0.sent[0][0][0], _back(0, 0), None)])  # one of worker 0's came back before it died
        err = UserError("split worker 0 of 2 (PID 1) died (killed by SIGKILL) while playing episodes")
        d.died(0, err)
        d.deliver(1, [(item, _back(ti, s), None) for item, ti, s in w1.sent[0]])  # worker 1's come back
        results = await asyncio.wait_for(asyncio.gather(*plays, return_exceptions=True), 10)
        held_by_0 = {ti for _, ti, _ in w0.sent[0][1:]}
        assert isinstance(results[w0.sent[0][0][1]], Trajectory)
        assert held_by_0 and all(results[i] is err for i in held_by_0)
        assert sum(isinstance(r, Trajectory) for r in results) == 1 + len(w1.sent[0])
        with pytest.raises(UserError, match="died"):
            await d.play(TASKS[0], 1)

    asyncio.run(main_())


def test_a_cancelled_play_drops_its_late_result():
    async def main_():
        d, (w0,) = _dispatcher(1)
        play = asyncio.ensure_future(d.play(TASKS[0], 0))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        play.cancel()
        await asyncio.gather(play, return_exceptions=True)
        assert d.load == [0]
        d.deliver(0, [(w0.sent[0][0][0], _back(0, 0), None)])  # nothing waits for it: ignored
        assert d.episodes == [0] and d.load == [0]

    asyncio.run(main_())


def test_a_worker_is_built_from_the_plan_with_its_workflow_and_benchmarks_by_name(tmp_path):
    from drmas_bench.api import EvalConfig, plan
    from drmas_bench.engines import ENGINES
    from drmas_bench.split.worker import plan_blob, plan_from_blob

    p = plan(EvalConfig(suite="toy", n=2, limit=3, out=str(tmp_path / "run"), workers=2, **REMOTE))
    blob = plan_blob(p)
    assert pickle.loads(blob)["engines"] == {"openai": ENGINES["openai"]}
    q = plan_from_blob(blob)
    assert q.wf is p.wf and q.benches == p.benches and q.tasks == p.tasks and q.team == p.team
    assert q.config_doc == p.config_doc and q.sampling == p.sampling and q.cfg.workers == 2


def test_workers_is_provenance_not_identity_and_limits_need_one_process(tmp_path):
    from drmas_bench.api import EvalConfig, plan

    one = plan(EvalConfig(suite="toy", n=2, limit=3, out=str(tmp_path / "run"), **REMOTE))
    two = plan(EvalConfig(suite="toy", n=2, limit=3, out=str(tmp_path / "run"), workers=2, **REMOTE))
    assert one.config_doc["identity"] == two.config_doc["identity"]
    assert two.config_doc["provenance"]["eval_config"]["workers"] == 2
    with pytest.raises(UserError, match="spending limits .* need one process"):
        plan(EvalConfig(suite="toy", limit=3, out=str(tmp_path / "r2"), workers=2, max_tokens=1000, **REMOTE))
    with pytest.raises(UserError, match="--workers must be an integer >= 1, got 0"):
        plan(EvalConfig(suite="toy", out=str(tmp_path / "r3"), workers=0, **REMOTE))


def test_help_documents_workers(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--workers N split the episodes over N worker processes" in out
    assert "with --pool ray, N Ray actors" in out and "resumes with any N" in out
