"""The team is built once: the user's explicit values are inputs to build_team, applied to new worker
groups, so the team a file describes is never edited afterwards."""

from __future__ import annotations

import pytest

from drmas_bench.agents.explicit import Explicit, apply_explicit
from drmas_bench.agents.team import build_team
from drmas_bench.types import UserError

AGENTS = ("solver", "checker")


def _team_file(tmp_path):
    p = tmp_path / "team.yaml"
    p.write_text("workflow: toy\nsampling: {temperature: 0.9}\n"
                 "worker_groups:\n  a: {model: tiny-random, options: {max_batch: 8}}\n  b: tiny-random\n"
                 "agents: {solver: a, checker: b}\n")
    return str(p)


def test_explicit_values_make_a_new_team_and_leave_the_given_one(tmp_path):
    base = build_team("toy", AGENTS, team_file=_team_file(tmp_path))
    before = base.to_dict()
    given = Explicit(workflow="toy", max_batch=4, engine_args={"dtype": "float32"}, sampling={"temperature": 0.5})
    team = apply_explicit(base, given, None, False)
    assert base.to_dict() == before and base.flag_sampling == {}  # nothing edited in place
    assert {n: g.options for n, g in team.worker_groups.items()} == {
        "a": {"max_batch": 4, "dtype": "float32"}, "b": {"max_batch": 4, "dtype": "float32"}}
    assert team.sampling == {"temperature": 0.9} and team.flag_sampling == {"temperature": 0.5}


def test_build_team_takes_the_explicit_values_as_inputs(tmp_path):
    team = build_team("toy", AGENTS, team_file=_team_file(tmp_path), explicit=Explicit(max_batch=2))
    assert [g.options["max_batch"] for g in team.worker_groups.values()] == [2, 2]
    with pytest.raises(UserError, match="--engine-args nope: not an option of the hf engine"):
        build_team("toy", AGENTS, team_file=_team_file(tmp_path), explicit=Explicit(engine_args={"nope": 1}))
