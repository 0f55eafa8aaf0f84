"""Typed views of stored trajectory records (`drmas_bench.records`): what a reader sees of a record
the runner wrote, of an older or hand-made one, and of a Trajectory."""

from __future__ import annotations

import dataclasses

import pytest

from drmas_bench.records import CallView, RecordView, TurnView, view, views
from drmas_bench.types import Completion, Request, Sampling, Task, Trajectory, Turn


def written() -> Trajectory:
    req = Request(agent="solver", messages=[{"role": "user", "content": "2+2?"}], sampling=Sampling(temperature=0.6))
    turns = [Turn("solver", "wg0", 0, req, Completion("\\boxed{4}", prompt_tokens=5, completion_tokens=3, latency_s=0.5,
                                                       notes=["cut"])),
             Turn("verifier", "wg1", 1, req, Completion("<verify>approve</verify>", usage="unknown", finish="length",
                                                         cache_hit=True, cached_latency_s=2.0, cached_usd=0.01),
                  valid=False)]
    return Trajectory(Task(id="q1", benchmark="b", question="2+2?", answers=["4"], meta={"level": 1}), sample_idx=3,
                      turns=turns, final_answer="4", reward=1.0, extra={"grade": "timeout", "round1_correct": 0},
                      wall_s=1.5, cost_usd=0.02)


def test_a_written_record_reads_back_as_its_writer_wrote_it():
    traj = written()
    for source in (traj, traj.to_dict()):
        r = view(source)
        assert (r.benchmark, r.task_id, r.question, r.answers, dict(r.task_meta)) == ("b", "q1", "2+2?", ("4",), {"level": 1})
        assert r.key == ("b", "q1", 3) and r.final_answer == "4" and r.reward == 1.0 and r.correct
        assert (r.wall_s, r.cost_usd, r.grade, r.round1_correct) == (1.5, 0.02, "timeout", False)
        s, v = r.turns
        assert (s.agent, s.wg, s.turn, s.valid, s.text) == ("solver", "wg0", 0, True, "\\boxed{4}")
        assert (s.call.prompt_tokens, s.call.completion_tokens, s.call.tokens, s.call.notes) == (5, 3, 8, ("cut",))
        assert s.call.usage_known and not s.call.cache_hit and s.messages[0]["content"] == "2+2?"
        assert s.sampling["temperature"] == 0.6
        assert (v.valid, v.call.usage_known, v.call.finish, v.call.cache_hit, v.call.cached_usd) == (False, False, "length",
                                                                                                    True, 0.01)
        assert [t.agent for t in r.agent_turns("verifier")] == ["verifier"]
    assert view(view(traj)) == view(traj)  # a view is returned as it is


def test_an_old_or_hand_made_record_reads_with_the_writers_defaults():
    r = view({"task": {"benchmark": "b", "id": 7}, "correct": True, "turns": [{"agent": "x"}, {}]})
    assert r.task_id == "7" and r.sample_idx is None and r.reward == 1.0 and r.correct  # only `correct`: reward 1.0
    assert r.extra == {} and r.env is None and r.env_steps is None and r.grade is None and r.round1_correct is None
    assert [t.agent for t in r.turns] == ["x", "?"]
    assert r.turns[0] == TurnView(agent="x")  # valid by default, no call recorded
    assert r.turns[0].call == CallView() and r.turns[0].call.usage == "server" and not r.turns[0].call.tokens_recorded
    assert view({"task": {"benchmark": "b", "id": "q"}, "reward": None, "correct": False}).reward == 0.0


def test_the_env_record_is_read_only_when_it_has_steps():
    steps = [{"action": "<search>x</search>", "query": "x", "done": False}]
    assert view({"task": {"benchmark": "b", "id": "q"}, "extra": {"env": {"steps": steps}}}).env_steps == steps
    assert view({"task": {"benchmark": "b", "id": "q"}, "extra": {"env": {"steps": "?"}}}).env_steps is None
    assert view({"task": {"benchmark": "b", "id": "q"}, "extra": "not a mapping"}).extra == {}


def test_views_are_frozen():
    r = views([written()])[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.reward = 0.0  # type: ignore[misc]
    assert isinstance(r, RecordView)
