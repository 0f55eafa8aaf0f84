"""`drmas-bench eval --workers N` end to end: spawned worker processes (and Ray actors) playing the
episodes of one run directory.

- the same eval with one process and with two workers gives the same records (compared by key: the
  order of lines is the order episodes finished) and the same summary figures, but for the clock
  fields (scripts/check_identical_runs.py's ``scrub``) and the sections that say how the run went
  (``run``: its folder; ``pool``: how it was split, each worker's engines; ``provenance``): the toy
  suite on the real tiny-random hf engine, and the search suite (BM25 over the mini corpus, 4 calls
  an episode) on the instant test-double engine of scripts/bench_scale.py;
- a split run stopped by SIGTERM keeps its finished episodes, and the same command with another
  number of workers finishes with each sample once; a worker killed with SIGKILL stops the run with
  one line naming it, finished work stays, and a rerun completes; a worker that cannot start (a fake
  engine whose construction fails) is one line naming it;
- the Ray-actor variant on a local Ray with two logical GPUs: the toy records again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from drmas_bench.api import EvalConfig, evaluate

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from check_identical_runs import first_difference, scrub  # noqa: E402

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
TOY = dict(model="tiny-random", suite="toy", n=2, limit=4, max_new_tokens=16, seed=1, progress=False)
OUTSIDE_FIGURES = ("run", "pool", "provenance")  # where the run was, how it was split, when: not results


def records(run: Path) -> dict[tuple, dict]:
    """samples.jsonl by (benchmark, task id, sample), clock fields scrubbed; a repeated key fails."""
    out: dict[tuple, dict] = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        key = (r["task"]["benchmark"], r["task"]["id"], r["sample_idx"])
        assert key not in out, f"{run}: sample {key} written twice"
        out[key] = scrub(r)
    return out


def figures(run: Path) -> dict:
    doc = scrub(json.loads((run / "summary.json").read_text()))
    return {k: v for k, v in doc.items() if k not in OUTSIDE_FIGURES}


def assert_same_run(a: Path, b: Path) -> None:
    ra, rb = records(a), records(b)
    assert ra.keys() == rb.keys()
    diff = [f"{k}: {first_difference(ra[k], rb[k])}" for k in ra if ra[k] != rb[k]]
    assert diff == [], diff[:3]
    fa, fb = figures(a), figures(b)
    assert fa == fb, first_difference(fa, fb)


@pytest.fixture(scope="module")
def toy_one_process(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("toy") / "one"
    evaluate(EvalConfig(**TOY, out=str(run)))
    return run


def test_toy_on_the_hf_engine_two_workers_give_the_one_process_records(toy_one_process, tmp_path):
    s = evaluate(EvalConfig(**TOY, out=str(tmp_path / "two"), workers=2))
    assert s["pool"]["split"]["workers"] == 2 and s["pool"]["split"]["backend"] == "processes"
    assert s["pool"]["split"]["episodes_by_worker"] == [4, 4]  # all 8 dealt at once, to the less loaded
    assert s["provenance"]["eval_config"]["workers"] == 2
    assert_same_run(toy_one_process, tmp_path / "two")


@pytest.fixture()
def double(monkeypatch):
    """The instant test-double engine in the registry, its module importable by spawned workers."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import bench_scale

    bench_scale.register_double()
    yield bench_scale.ENGINE_KIND
    from drmas_bench.engines import ENGINES

    ENGINES.pop(bench_scale.ENGINE_KIND, None)


def test_search_on_the_double_two_workers_give_the_one_process_records(double, data_dir, tmp_path):
    cfg = dict(model="tiny-random", engine=double, suite="search", benchmarks="hotpotqa,2wiki", n=4, limit=15,
               data_dir=str(data_dir), progress=False)
    evaluate(EvalConfig(**cfg, out=str(tmp_path / "one")))
    s = evaluate(EvalConfig(**cfg, out=str(tmp_path / "two"), workers=2))
    assert sum(s["pool"]["split"]["episodes_by_worker"]) == 120
    assert all(len(r["turns"]) == 4 for r in records(tmp_path / "two").values())
    assert_same_run(tmp_path / "one", tmp_path / "two")


def test_a_corrupt_line_is_the_same_one_line_before_any_worker_starts_and_repair_then_resume_works(
        double, data_dir, tmp_path):
    from drmas_bench.run_dir import repair_samples
    from drmas_bench.types import UserError

    run = tmp_path / "run"
    cfg = dict(model="tiny-random", engine=double, suite="search", benchmarks="hotpotqa", n=2, limit=10,
               data_dir=str(data_dir), progress=False, out=str(run), workers=2)
    evaluate(EvalConfig(**cfg))
    lines = (run / "samples.jsonl").read_bytes().splitlines(keepends=True)
    (run / "samples.jsonl").write_bytes(b"".join(lines[:5] + [b"{not json\n"] + lines[7:]))  # two samples lost, a bad line
    with pytest.raises(UserError, match=r"samples.jsonl:6: not a trajectory record \(corrupt line\); run `drmas-bench runs repair"):
        evaluate(EvalConfig(**cfg))
    repair_samples(run)
    s = evaluate(EvalConfig(**cfg))
    assert s["run"]["episodes_run"] == 2 and s["run"]["episodes_resumed"] == 18
    assert len(records(run)) == 20


@dataclass
class CannotLoadOptions:
    max_batch: int = 32


class CannotLoadEngine:
    """A fake engine for the worker that cannot start: its construction fails with a user's error, as
    a model folder missing on a worker's machine would."""

    name = "cannot-load"
    Options = CannotLoadOptions

    def __init__(self, model: str, **options):
        from drmas_bench.types import UserError

        raise UserError(f"model {model}: no weights on this machine")


def test_a_worker_that_cannot_start_is_one_line_naming_it_and_nothing_is_recorded(monkeypatch, tmp_path):
    from drmas_bench.engines import ENGINES
    from drmas_bench.types import UserError

    monkeypatch.setitem(ENGINES, "cannot-load", f"{__name__}:CannotLoadEngine")
    with pytest.raises(UserError, match=r"^split worker [01] of 2 \(PID \d+\) could not start: worker group 'shared': "
                                        r"model tiny-random: no weights on this machine$"):
        evaluate(EvalConfig(model="tiny-random", engine="cannot-load", suite="toy", n=1, limit=2, progress=False,
                            out=str(tmp_path / "run"), workers=2))
    assert not (tmp_path / "run" / "samples.jsonl").exists() or _lines(tmp_path / "run") == 0


# ------------------------------------------------------------------------------- stops and deaths


def _cmd(run: Path, data_dir: Path, workers: int) -> list[str]:
    """The search suite on the double (scripts/bench_scale.py registers it), 2 x 150 questions x 16."""
    return [sys.executable, str(REPO / "scripts" / "bench_scale.py"), "--child", str(run.parent / "report.json"), "--",
            "eval", "--model", "tiny-random", "--engine", "instant-double", "--suite", "search",
            "--benchmarks", "hotpotqa,2wiki", "--n", "16", "--limit", "150", "--data-dir", str(data_dir),
            "--out", str(run), "--no-progress", "--workers", str(workers)]


TOTAL = 2 * 150 * 16


def _lines(run: Path) -> int:
    p = run / "samples.jsonl"
    return p.read_bytes().count(b"\n") if p.is_file() else 0


def _start(run: Path, data_dir: Path, workers: int, log: Path) -> tuple[subprocess.Popen, list[int]]:
    """The split run, started; returns once its workers are ready and a third of it is on disk."""
    proc = subprocess.Popen(_cmd(run, data_dir, workers), env=ENV, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    deadline = time.time() + 600
    while _lines(run) < TOTAL // 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, log.read_text()[-800:]
    ready = [line for line in log.read_text().splitlines() if "workers ready" in line]
    pids = [int(pid) for pid in re.findall(r"PID (\d+)", ready[0])]
    assert len(pids) == workers and all(psutil.pid_exists(p) for p in pids)
    return proc, pids


def _finish_again(run: Path, data_dir: Path, workers: int, kept: int) -> None:
    again = subprocess.run(_cmd(run, data_dir, workers), env=ENV, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-800:]
    assert f"{TOTAL - kept} episodes run, {kept} resumed from disk" in again.stdout + again.stderr
    assert len(records(run)) == TOTAL  # each sample exactly once (records() fails on a repeat)


def _gone(pids: list[int]) -> bool:
    deadline = time.time() + 30
    while time.time() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
        time.sleep(0.1)
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


def test_sigterm_keeps_the_finished_episodes_and_a_rerun_with_one_worker_finishes(data_dir, tmp_path):
    run, log = tmp_path / "run", tmp_path / "log.txt"
    proc, pids = _start(run, data_dir, 2, log)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(180)
    err = log.read_text()
    assert rc == 143 and "stopped by SIGTERM" in err, err[-800:]
    kept = _lines(run)
    assert TOTAL // 3 <= kept < TOTAL
    assert _gone(pids), "the workers outlived their coordinator"
    _finish_again(run, data_dir, 1, kept)  # resumed with another number of workers


def test_a_worker_killed_with_sigkill_is_one_line_naming_it_and_a_rerun_completes(data_dir, tmp_path):
    run, log = tmp_path / "run", tmp_path / "log.txt"
    proc, pids = _start(run, data_dir, 2, log)
    os.kill(pids[1], signal.SIGKILL)
    rc = proc.wait(180)
    last = log.read_text().strip().splitlines()[-1]
    assert rc == 2 and "Traceback" not in log.read_text(), log.read_text()[-800:]
    assert last.startswith(f"drmas-bench: error: split worker 1 of 2 (PID {pids[1]})") and "died (killed by SIGKILL) while playing episodes" in last
    assert f"finished samples are saved in {run / 'samples.jsonl'}; re-run to resume" in last
    kept = _lines(run)
    assert TOTAL // 3 <= kept < TOTAL
    assert _gone(pids), "the other worker outlived the stopped run"
    _finish_again(run, data_dir, 2, kept)


# ------------------------------------------------------------------------------- Ray actors


@pytest.fixture()
def ray_session():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # pragma: no cover - another module left one running
        ray.shutdown()
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_actors_on_logical_gpus_give_the_one_process_records(toy_one_process, ray_session, tmp_path):
    s = evaluate(EvalConfig(**TOY, out=str(tmp_path / "ray"), workers=2, pool="ray"))
    assert s["pool"]["split"]["backend"] == "ray" and sum(s["pool"]["split"]["episodes_by_worker"]) == 8
    assert ray_session.available_resources().get("GPU") == 2  # both actors, one logical GPU each, are gone
    assert_same_run(toy_one_process, tmp_path / "ray")
    from drmas_bench.types import UserError

    with pytest.raises(UserError, match="each worker actor takes one GPU and the Ray cluster has 2"):
        evaluate(EvalConfig(**TOY, out=str(tmp_path / "three"), workers=3, pool="ray"))
