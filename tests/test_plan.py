"""`plan.plan` is pure (it resolves and checks, opens nothing) and `api.run` owns what a run opens
(the call cache, the retriever, the run directory, the pool) and closes it, also when the episodes
fail or a stop signal arrives (SIGTERM reaches the run as KeyboardInterrupt)."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from drmas_bench import api
from drmas_bench.api import EvalConfig, evaluate
from drmas_bench.call_cache import DB_NAME
from drmas_bench.plan import plan, resolve
from drmas_bench.run_dir import RunLock
from drmas_bench.types import UserError

TOY = EvalConfig(model="tiny-random", suite="toy", n=1, limit=1, max_new_tokens=8, progress=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_plan_opens_no_cache_and_no_retriever(tmp_path, monkeypatch):
    """The cache folder is not made and a retriever server that is down is not asked: a plan is
    the configuration checked. The run opens both, before its run directory is touched."""
    opened = []
    monkeypatch.setattr(api, "open_retriever", lambda spec: opened.append(spec))
    cfg = replace(TOY, cache=str(tmp_path / "calls"), out=str(tmp_path / "run"))
    p = plan(cfg)
    assert p.call_cache_dir == str(tmp_path / "calls") and not (tmp_path / "calls").exists()
    assert p.retriever_spec is None and opened == [] and not (tmp_path / "run").exists()
    evaluate(cfg)
    assert (tmp_path / "calls" / DB_NAME).is_file() and (tmp_path / "run" / "summary.json").is_file()


def test_a_retriever_that_is_down_fails_the_run_not_the_plan(tmp_path, data_dir):
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    cfg = EvalConfig(model="tiny-random", suite="search", benchmarks="hotpotqa", limit=1, n=1, data_dir=str(data_dir),
                     retriever=url, out=str(tmp_path / "run"), progress=False)
    assert plan(cfg).retriever_spec == url
    with pytest.raises(UserError, match=f"retriever {url}"):
        evaluate(cfg)
    assert not (tmp_path / "run").exists()  # refused before the run directory was touched


class FakeRetriever:
    """A fake retriever that only records whether it was closed (the run's ownership is tested)."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("stop", [RuntimeError("a bug mid-run"), KeyboardInterrupt()])
def test_the_run_closes_what_it_opened_when_the_episodes_fail(tmp_path, monkeypatch, stop):
    fake = FakeRetriever()
    closed = []
    real_open = api.CallCache.open

    def open_cache(d):
        c = real_open(d)
        real_close = c.close
        c.close = lambda: (closed.append(d), real_close())
        return c

    async def boom(*a, **k):
        raise stop

    monkeypatch.setattr(api, "open_retriever", lambda spec: fake)
    monkeypatch.setattr(api.CallCache, "open", staticmethod(open_cache))
    monkeypatch.setattr(api.runner, "run_episodes", boom)
    p = plan(replace(TOY, cache=str(tmp_path / "c"), out=str(tmp_path / "run")))
    p = replace(p, inputs=replace(p.inputs, retriever_spec="bm25:unused"))
    with pytest.raises((UserError, KeyboardInterrupt)):
        api.run(p)
    assert fake.closed and closed == [str(tmp_path / "c")]
    RunLock(tmp_path / "run").release()  # the run directory's lock was released (else: "in use by another")


def test_resolve_reads_the_team_file_once(tmp_path, monkeypatch):
    import drmas_bench.plan as plan_mod

    team = {"workflow": "toy", "worker_groups": {"g": {"model": "tiny-random"}}, "agents": {"solver": "g", "checker": "g"}}
    (tmp_path / "team.yaml").write_text(yaml.safe_dump(team))
    reads = []
    real = plan_mod.read_yaml
    monkeypatch.setattr(plan_mod, "read_yaml", lambda p, what: (reads.append(Path(p)), real(p, what))[1])
    import drmas_bench.agents.team as team_mod

    monkeypatch.setattr(team_mod, "read_yaml", lambda p, what: (reads.append(Path(p)), real(p, what))[1])
    r = resolve(EvalConfig(team=str(tmp_path / "team.yaml"), suite="toy"))
    assert r.wf.name == "toy" and reads == [tmp_path / "team.yaml"]


def test_a_plan_builds_no_alias_and_the_run_does(tmp_path, monkeypatch):
    """An alias not built yet is a step of the plan (nothing written to the cache), not a build."""
    from drmas_bench.needs import Pending

    cache = tmp_path / "cache"
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(cache))
    p = plan(replace(TOY, out=str(tmp_path / "run")))
    assert isinstance(p, Pending) and not cache.exists()
    assert [(s.action, s.source, s.dest) for s in p.todo] == [("build alias", "tiny-random", cache / "models" / "tiny-random")]
