"""What a newcomer meets on a first day: an offline hub that fails fast, flags from other
harnesses that get a hint, a progress bar that moves, and a summary.md that says what it measured
and shows every agent of the team."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from conftest import busy_factor
from drmas_bench.cli import main
from drmas_bench.types import Completion, Request, Task, Trajectory, Turn, UserError


# ------------------------------------------------------------------------- the hub, offline


@pytest.fixture()
def dead_hub(monkeypatch):
    """HF_ENDPOINT at a local port nobody listens on: connection refused at once, network or not."""
    from drmas_bench.benchmarks import catalog

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "DRMAS_DATA_DIR"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    catalog.hub_unreachable.cache_clear()
    yield
    catalog.hub_unreachable.cache_clear()


def test_unreachable_hub_fails_fast_naming_both_fixes(dead_hub, capsys):
    from drmas_bench.benchmarks import load_tasks

    t0 = time.monotonic()
    with pytest.raises(UserError) as e:
        load_tasks("aime24", None)
    assert time.monotonic() - t0 < 10 * busy_factor()  # datasets' own retries took ~25 s here
    msg = str(e.value)
    assert "unreachable" in msg and "--data-dir" in msg and "DRMAS_DATA_DIR" in msg and "network access" in msg
    assert "\n" not in msg
    assert main(["data", "show", "aime24"]) == 2
    assert "aime24" in capsys.readouterr().err


# ------------------------------------------------------------------------- habits from lm-eval


def test_lm_eval_flags_get_our_names(capsys):
    with pytest.raises(SystemExit) as e:
        main(["eval", "--model", "tiny-random", "--tasks", "hotpotqa", "--batch-size=8"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: drmas-bench eval" in err  # the command's own usage, not the top-level one
    assert "unrecognized arguments: --tasks hotpotqa --batch-size=8" in err
    for ours in ("--benchmarks", "--suite", "--max-batch", "--concurrency"):
        assert ours in err
    with pytest.raises(SystemExit):
        main(["data", "check", "--frobnicate"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --frobnicate" in err and "in drmas-bench:" not in err


# ------------------------------------------------------------------------- progress


class SlowEngine:
    """Answers the toy's solver and checker correctly after a pause, like a batch on a slow CPU."""

    async def generate(self, requests: list[Request]) -> list[Completion]:
        await asyncio.sleep(0.4)
        return [Completion("<answer>2</answer>" if r.agent == "solver" else "<verdict>approve</verdict>",
                           prompt_tokens=5, completion_tokens=3) for r in requests]


def test_progress_moves_before_any_episode_finishes(capsys):
    import drmas_bench.suites.toy.toy  # noqa: F401 - registers "toy"
    from drmas_bench.agents.team import TeamSpec, WorkerGroupSpec
    from drmas_bench.runner import EpisodeRun, TeamRuntime, run_episodes
    from drmas_bench.types import Sampling
    from drmas_bench.workflows.base import get_workflow

    team = TeamSpec("toy", {"solver": "wg", "checker": "wg"}, {"wg": WorkerGroupSpec("wg", "fake")})
    tasks = [Task("t1", "toy", "What is 1 + 1?", ["2"])]
    got: list = []
    stats = asyncio.run(run_episodes(tasks, 2, EpisodeRun(TeamRuntime(team, {"wg": SlowEngine()}, Sampling()),
                                                          get_workflow("toy"), progress=True, on_finished=got.extend)))
    assert stats.episodes == 2 and all(t.correct for t in got)
    frames = capsys.readouterr().err.split("\r")
    # both episodes run in lockstep and finish together; the calls already show while none has
    assert any(" 0/2 " in f and "calls=1" in f for f in frames), frames
    assert any(" 2/2 " in f and "calls=4" in f for f in frames), frames


# ------------------------------------------------------------------------- summary.md


def _summary_with_run() -> dict:
    from drmas_bench.metrics import summarize

    task = Task("t1", "toy", "What is 1 + 1?", ["2"])
    trajs = [Trajectory(task, i, turns=[Turn("solver", "shared", 0, Request("solver", []),
                                             Completion("2", prompt_tokens=5, completion_tokens=1))],
                        reward=1.0, wall_s=0.1) for i in range(2)]
    s = summarize(trajs, n_boot=20)
    s["run"] = {"dir": "runs/x", "workflow": "toy", "episodes_run": 2, "episodes_resumed": 0, "suite": "toy",
                "benchmarks": ["toy"], "team": {"solver": {"worker_group": "shared", "model": "smollm2-135m-instruct"},
                                                "checker": {"worker_group": "shared", "model": "smollm2-135m-instruct"}}}
    s["provenance"] = {"started_at": "2026-12-01T10:00:00Z", "finished_at": "2026-12-01T10:01:00Z"}
    return s


def test_summary_header_names_suite_model_and_date():
    from drmas_bench.report.markdown import format_summary_markdown

    md = format_summary_markdown(_summary_with_run())
    assert md.startswith("# toy suite (toy): smollm2-135m-instruct, 2026-12-01 10:01:00 UTC\n")


def test_agents_table_shows_the_model_and_an_agent_never_called():
    from drmas_bench.report.markdown import format_summary_markdown

    md = format_summary_markdown(_summary_with_run())
    table = md[md.index("### At what cost"):].splitlines()
    solver = next(line for line in table if line.startswith("| solver"))
    checker = next(line for line in table if line.startswith("| checker"))
    assert "smollm2-135m-instruct" in solver and "| shared " in solver and "| 2 " in solver
    assert "smollm2-135m-instruct" in checker and "| 0 " in checker and "0.00" in checker
    # a summary without its team (an older run) still renders, naming the worker group only
    bare = _summary_with_run()
    del bare["run"]
    md = format_summary_markdown(bare)
    assert not md.startswith("# ") and "| solver" in md and "checker" not in md
