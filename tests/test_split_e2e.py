"""`drmas-bench eval --workers N` end to end: spawned worker processes (and Ray actors) playing the
episodes of one run directory.

- the same eval with one process and with two workers gives the same records (compared by key: the
  order of lines is the order episodes finished) and the same summary figures, but for the clock
  fields (scripts/check_identical_runs.py's ``scrub``) and the sections that say how the run went
  (``run``: its folder; ``pool``: how it was split, each worker's engines; ``provenance``): the toy
  suite on the real tiny-random hf engine, and the search suite (BM25 over the mini corpus, 4 calls
  an episode) on the instant test-double engine of scripts/bench_scale.py, there as a split run that
  a killed worker stopped and a two-worker rerun finished;
- a split run stopped by SIGTERM keeps its finished episodes, and the same command with one process
  finishes with each sample once; a worker killed with SIGKILL stops the run with one line naming
  it and finished work stays; a corrupt line in that run is then the one-process run's one line,
  before any worker starts, and after ``runs repair`` the rerun completes; a worker that cannot
  start (a fake engine whose construction fails) is one line naming it;
- the Ray-actor variant on a local Ray with two logical GPUs: the toy records again, and a third
  worker is one line.

What keeps it short: only the SIGTERM run is a CLI process of its own (the signal must reach the
command's handler); every other command runs in this process, the SIGKILL run's coordinator too
(its signal goes to a worker). The search runs are 120 episodes: ``ThrottledDouble`` keeps a run
playing, episodes still finishing, until the signal lands, whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from drmas_bench.api import EvalConfig, evaluate

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from bench_scale import ENGINE_KIND, InstantDoubleEngine, register_double  # noqa: E402
from check_identical_runs import first_difference, scrub  # noqa: E402
from conftest import busy_factor  # noqa: E402

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
    # the reproducibility block's batching is how the run was split (workers, concurrency), and
    # batching_changed says a resume was split otherwise (flagged for an engine that is not
    # batch-invariant, as the instant double is): the run's history, not a result
    for key in ("batching", "batching_changed"):
        doc.get("reproducibility", {}).pop(key, None)
    return {k: v for k, v in doc.items() if k not in OUTSIDE_FIGURES}


def assert_same_run(a: Path, b: Path) -> None:
    ra, rb = records(a), records(b)
    assert ra.keys() == rb.keys()
    diff = [f"{k}: {first_difference(ra[k], rb[k])}" for k in ra if ra[k] != rb[k]]
    assert diff == [], diff[:3]
    fa, fb = figures(a), figures(b)
    assert fa == fb, first_difference(fa, fb)


def _lines(run: Path) -> int:
    p = run / "samples.jsonl"
    return p.read_bytes().count(b"\n") if p.is_file() else 0


def _wait(until, what: str, timeout_s: float = 600) -> None:
    deadline = time.time() + timeout_s
    while not until():
        assert time.time() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def _gone(pids: list[int]) -> bool:
    def alive(p: int) -> bool:
        try:
            return psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.time() + 30
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return not any(alive(p) for p in pids)


# ------------------------------------------------------------------------------- the search runs' double


class ThrottledDouble(InstantDoubleEngine):
    """A test double: scripts/bench_scale.py's instant double (the same replies; registered under the
    same kind, so a run's identity and records are the instant double's) that, with $SLOW_AFTER=K in
    its environment, answers each call SLOW_S late once this process has finished K episodes: the
    run goes on at a few episodes a second, so a signal sent then lands while episodes finish."""

    async def generate(self, requests: list) -> list:
        after = os.environ.get("SLOW_AFTER")
        if after is not None and InstantDoubleEngine.finished >= int(after):
            await asyncio.sleep(SLOW_S)
        return await super().generate(requests)


SLOW_S = 0.5
BENCHES, LIMIT, N, CONCURRENCY = "hotpotqa,2wiki", 15, 4, 4
TOTAL = 2 * LIMIT * N  # 120 episodes, 4 calls each; a worker plays at most CONCURRENCY at once
SLOW_AFTER = TOTAL // 6  # per worker: about a third of the run at full speed, then about 2 s an episode
# a CLI process with the throttled double in the registry under the instant double's kind
CHILD = ("import sys; sys.path[:0] = sys.argv[1:3]; from drmas_bench.engines import ENGINES; "
         f"ENGINES[{ENGINE_KIND!r}] = '{__name__}:ThrottledDouble'; "
         "from drmas_bench.cli import main; sys.exit(main(sys.argv[3:]))")


def _argv(run: Path, data_dir: Path, workers: int) -> list[str]:
    return ["eval", "--model", "tiny-random", "--engine", ENGINE_KIND, "--suite", "search", "--benchmarks", BENCHES,
            "--n", str(N), "--limit", str(LIMIT), "--concurrency", str(CONCURRENCY), "--data-dir", str(data_dir),
            "--out", str(run), "--no-progress", "--workers", str(workers)]


def _ready_pids(log_text: str) -> list[int]:
    ready = [line for line in log_text.splitlines() if "workers ready" in line]
    return [int(pid) for pid in re.findall(r"PID (\d+)", ready[0])] if ready else []


# ------------------------------------------------------------------------------- toy on the hf engine


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
    assert _lines(tmp_path / "run") == 0


# ------------------------------------------------------------------------------- search on the double


@pytest.fixture(scope="module")
def double():
    """The instant test-double engine in this process's registry (spawned workers import it from
    scripts/, which this module put on sys.path)."""
    register_double()
    yield ENGINE_KIND
    from drmas_bench.engines import ENGINES

    ENGINES.unregister(ENGINE_KIND)


@pytest.fixture(scope="module")
def search_one_process(double, data_dir, tmp_path_factory) -> Path:
    """The one-process run (the CLI's main in this process) every split search run is compared with."""
    from drmas_bench.cli import main

    run = tmp_path_factory.mktemp("search") / "one"
    assert main(_argv(run, data_dir, 1)) == 0
    assert len(records(run)) == TOTAL and all(len(r["turns"]) == 4 for r in records(run).values())
    return run


def _finish_again(run: Path, data_dir: Path, workers: int, resumed: int) -> None:
    """The same command in this process (no signal here) with the instant double: it plays only what
    is missing."""
    from drmas_bench.cli import main

    assert main(_argv(run, data_dir, workers)) == 0
    s = json.loads((run / "summary.json").read_text())
    assert (s["run"]["episodes_run"], s["run"]["episodes_resumed"]) == (TOTAL - resumed, resumed)


def test_sigterm_keeps_the_finished_episodes_and_a_one_process_rerun_finishes(double, search_one_process,
                                                                               data_dir, tmp_path):
    run, log = tmp_path / "run", tmp_path / "log.txt"
    cmd = [sys.executable, "-c", CHILD, str(Path(__file__).parent), str(REPO / "scripts"), *_argv(run, data_dir, 2)]
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(cmd, env={**ENV, "SLOW_AFTER": str(SLOW_AFTER)}, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        _wait(lambda: proc.poll() is not None or (_lines(run) >= TOTAL // 3 and len(_ready_pids(log.read_text())) == 2),
              "a third of the run on disk")
        assert proc.poll() is None, log.read_text()[-800:]
        pids = _ready_pids(log.read_text())
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(180)
    finally:
        if proc.poll() is None:  # failed before the signal: its workers end with its pipes
            proc.kill()
            proc.wait(30)
    err = log.read_text()
    assert rc == 143 and "stopped by SIGTERM" in err, err[-800:]
    kept = _lines(run)
    assert TOTAL // 3 <= kept < TOTAL
    assert _gone(pids), "the workers outlived their coordinator"
    _finish_again(run, data_dir, 1, kept)  # resumed with another number of workers
    assert_same_run(search_one_process, run)  # each sample once (records() fails on a repeat), the same records


def test_a_sigkilled_worker_and_a_corrupt_line_are_one_line_each_and_a_two_worker_rerun_gives_the_one_process_run(
        double, search_one_process, data_dir, tmp_path, monkeypatch, capsys, caplog):
    """The coordinator is this process (the CLI's main; the signal goes to a worker, not to it): a
    thread kills worker 1 once a third of the run is on disk."""
    from drmas_bench.cli import main
    from drmas_bench.engines import ENGINES
    from drmas_bench.run_dir import repair_samples
    from drmas_bench.types import UserError

    run = tmp_path / "run"
    pids: list[int] = []

    def kill_worker_1() -> None:
        def ready() -> list[int]:
            return _ready_pids("\n".join(r.getMessage() for r in list(caplog.records)))

        _wait(lambda: len(ready()) == 2 and _lines(run) >= TOTAL // 3, "a third of the run on disk")
        pids.extend(ready())
        os.kill(pids[1], signal.SIGKILL)

    with monkeypatch.context() as m:  # the throttled double, here and in the workers spawned from here
        m.setitem(ENGINES, ENGINE_KIND, f"{__name__}:ThrottledDouble")
        m.setenv("SLOW_AFTER", str(SLOW_AFTER))
        killer = threading.Thread(target=kill_worker_1, daemon=True)
        killer.start()
        rc = main(_argv(run, data_dir, 2))
        killer.join(5)
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert rc == 2 and "Traceback" not in err and len(pids) == 2, err[-800:]
    assert last.startswith(f"drmas-bench: error: split worker 1 of 2 (PID {pids[1]})") and "died (killed by SIGKILL) while playing episodes" in last
    assert f"finished samples are saved in {run / 'samples.jsonl'}; re-run to resume" in last
    kept = _lines(run)
    assert TOTAL // 3 <= kept < TOTAL
    assert _gone(pids), "the other worker outlived the stopped run"

    # two samples lost and a bad line in their place: the one-process run's one line, no worker started
    lines = (run / "samples.jsonl").read_bytes().splitlines(keepends=True)
    (run / "samples.jsonl").write_bytes(b"".join(lines[:5] + [b"{not json\n"] + lines[7:]))
    caplog.clear()
    with pytest.raises(UserError, match=r"samples.jsonl:6: not a trajectory record \(corrupt line\); run `drmas-bench runs repair"):
        evaluate(EvalConfig(model="tiny-random", engine=double, suite="search", benchmarks=BENCHES, n=N, limit=LIMIT,
                            data_dir=str(data_dir), progress=False, out=str(run), workers=2))
    assert not [r for r in caplog.records if "starting 2 workers" in r.getMessage()]
    repair_samples(run)
    _finish_again(run, data_dir, 2, kept - 2)
    assert_same_run(search_one_process, run)


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
    from drmas_bench.types import UserError

    s = evaluate(EvalConfig(**TOY, out=str(tmp_path / "ray"), workers=2, pool="ray"))
    assert s["pool"]["split"]["backend"] == "ray" and sum(s["pool"]["split"]["episodes_by_worker"]) == 8
    assert_same_run(toy_one_process, tmp_path / "ray")
    # both actors, one logical GPU each, are gone (ray.kill returns before the cluster takes their GPUs back)
    deadline = time.time() + 10 * busy_factor()
    while ray_session.available_resources().get("GPU") != 2 and time.time() < deadline:
        time.sleep(0.1)
    assert ray_session.available_resources().get("GPU") == 2
    with pytest.raises(UserError, match="each worker actor takes one GPU and the Ray cluster has 2"):
        evaluate(EvalConfig(**TOY, out=str(tmp_path / "three"), workers=3, pool="ray"))
