"""Run directories under stress: stop signals, resumes of the wrong samples, bad files.

The table ``CASES``: each case damages a copy of one real finished run (tiny-random, toy suite,
5 questions x 2 samples) or writes a bad input, runs one command in-process, and checks its exit
code, the one line it must print, and what must still be on disk afterwards. The signal tests
below it send real signals to real subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
import yaml

from drmas_bench.cli import main

REPO = Path(__file__).resolve().parent.parent
EVAL = ["eval", "--model", "tiny-random", "--suite", "toy", "--n", "2", "--limit", "5", "--no-progress", "--out", "run"]
GARBAGE = b'{"task": {"benchmark": "toy", "id": "x"}, "sample_'  # a line cut by hand, with its newline


# ---------------------------------------------------------------------------------- damage


def _lines(run: Path) -> list[bytes]:
    return (run / "samples.jsonl").read_bytes().splitlines(keepends=True)


def no_config(d: Path) -> None:
    (d / "run" / "config.yaml").unlink()


def no_config_no_stamps(d: Path) -> None:
    """Samples as written before they carried their run's stamp, and config.yaml gone."""
    no_config(d)
    recs = [json.loads(x) for x in _lines(d / "run")]
    (d / "run" / "samples.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "run"}) + "\n"
                                                     for r in recs))


def config_says_hot(d: Path) -> None:
    """config.yaml hand-edited to T=1.0 (the samples were drawn at 0.6)."""
    p = d / "run" / "config.yaml"
    cfg = yaml.safe_load(p.read_text())
    for s in cfg["identity"]["sampling"].values():
        s["temperature"] = 1.0
    p.write_text(yaml.safe_dump(cfg, sort_keys=False))


def garbage_line(d: Path) -> None:
    lines = _lines(d / "run")
    (d / "run" / "samples.jsonl").write_bytes(b"".join(lines[:3] + [GARBAGE + b"\n"] + lines[3:]))


def latin1_line(d: Path) -> None:
    lines = _lines(d / "run")
    (d / "run" / "samples.jsonl").write_bytes(b"".join(lines[:1] + [b'{"caf\xe9": 1}\n'] + lines[1:]))


def turnless_line(d: Path) -> None:
    """Valid JSON with a sample key but no turns: not a trajectory the readers can use."""
    lines = _lines(d / "run")
    rec = {k: v for k, v in json.loads(lines[0]).items() if k != "turns"}
    (d / "run" / "samples.jsonl").write_bytes(b"".join(lines + [json.dumps(rec).encode() + b"\n"]))


def config_not_yaml(d: Path) -> None:
    (d / "run" / "config.yaml").write_text("identity: {team: [\n")


def empty_run_beside(d: Path) -> None:
    """A folder of two run dirs, one started but stopped before its first flush."""
    (d / "all").mkdir()
    shutil.copytree(d / "run", d / "all" / "done")
    (d / "all" / "started").mkdir()
    shutil.copy(d / "all" / "done" / "config.yaml", d / "all" / "started" / "config.yaml")


def empty_folder_beside(d: Path) -> None:
    """An empty folder (a study's runs/ before its first eval) beside a finished run."""
    (d / "nothing").mkdir()


def only_empty_run(d: Path) -> None:
    (d / "run" / "samples.jsonl").unlink()


def duplicate_ids(d: Path) -> None:
    f = d / "data" / "math" / "aime24" / "test.jsonl"
    f.parent.mkdir(parents=True)
    f.write_text("".join(json.dumps({"id": i, "problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                         for i in (1, 2, 3, 2)))


def model_without_tokenizer(d: Path) -> None:
    from drmas_bench.models import resolve_model

    shutil.copytree(resolve_model("tiny-random"), d / "notok")
    (d / "notok" / "tokenizer.json").unlink()


def _checkpoint(d: Path, step: int, complete: bool) -> None:
    from drmas_bench.models import resolve_model

    ck = d / "ckpt" / f"step_{step}"
    shutil.copytree(resolve_model("tiny-random"), ck / "models" / "shared")
    (ck / "team.yaml").write_text("workflow: toy\nworker_groups: {shared: models/shared}\n"
                                  "agents: {solver: shared, checker: shared}\n")
    (ck / "trainer_state.json").write_text(json.dumps({"step": step, "cursor": 0}))
    if complete:
        (ck / "COMPLETE").write_text(f"step {step}\n")


def incomplete_checkpoint(d: Path) -> None:
    _checkpoint(d, 0, complete=True)
    _checkpoint(d, 1, complete=False)


# ---------------------------------------------------------------------------------- what must be kept


def samples_unchanged(d: Path, before: dict[str, bytes]) -> None:
    assert (d / "run" / "samples.jsonl").read_bytes() == before["samples"]


def refused_untouched(d: Path, before: dict[str, bytes]) -> None:
    """Refused before anything was written: the samples as they were, no config rebuilt."""
    samples_unchanged(d, before)
    assert not (d / "run" / "config.yaml").exists()


def refused_config_kept(d: Path, before: dict[str, bytes]) -> None:
    samples_unchanged(d, before)
    assert (d / "run" / "config.yaml").read_bytes() == before["config"]


def rebuilt(d: Path, before: dict[str, bytes]) -> None:
    samples_unchanged(d, before)
    cfg = yaml.safe_load((d / "run" / "config.yaml").read_text())
    assert cfg["identity"]["sampling"]["solver"]["temperature"] == 0.6 and cfg["n"] == 2
    s = json.loads((d / "run" / "summary.json").read_text())
    assert s["run"]["episodes_resumed"] == 10 and s["run"]["episodes_run"] == 0


def quarantined(d: Path, before: dict[str, bytes]) -> None:
    run = d / "run"
    good = [x for x in before["samples"].splitlines(keepends=True) if not x.startswith(GARBAGE)]
    assert (run / "samples.jsonl").read_bytes() == b"".join(good) and len(good) == 10
    assert (run / "samples.jsonl.quarantine").read_bytes() == GARBAGE + b"\n"


def quarantined_bytes(d: Path, before: dict[str, bytes]) -> None:
    assert (d / "run" / "samples.jsonl.quarantine").read_bytes() == b'{"caf\xe9": 1}\n'
    assert len(_lines(d / "run")) == 10


def nothing_written(d: Path, before: dict[str, bytes]) -> None:
    assert not (d / "run2").exists() or not (d / "run2" / "config.yaml").exists()


def both_runs_kept(d: Path, before: dict[str, bytes]) -> None:
    assert (d / "all" / "done" / "samples.jsonl").read_bytes() == before["samples"]
    assert sorted(p.name for p in (d / "all" / "started").iterdir()) == ["config.yaml"]


OTHER = ["eval", "--model", "smollm2-135m-instruct", "--temperature", "1.0", "--suite", "toy", "--n", "2",
         "--limit", "5", "--no-progress", "--out", "run"]
DUP = ["eval", "--model", "tiny-random", "--benchmarks", "aime24", "--data-dir", "data", "--n", "1",
       "--max-new-tokens", "4", "--no-progress", "--out", "run2"]
TOY1 = ["--suite", "toy", "--n", "1", "--limit", "1", "--no-progress", "--out", "run2"]
REPAIR_LINE = "run `drmas-bench runs repair run` to move unreadable lines aside"
PRICES = str(REPO / "leaderboards" / "prices.example.yaml")

# (case id, damage, argv, exit code, stream, text its one line must hold, what must be kept)
CASES: list[tuple[str, Callable[[Path], None], list[str], int, str, str, Callable]] = [
    ("resume-no-config-other-model", no_config, OTHER, 2, "err",
     "was not made by this configuration (it has solver temperature 0.6 (now 1.0), model of shared "
     "tiny-random:", refused_untouched),
    ("resume-no-config-same-command", no_config, EVAL, 0, "err",
     "run/config.yaml was missing: rebuilt from this command, whose stamp all 10 kept samples carry", rebuilt),
    ("resume-no-config-unstamped", no_config_no_stamps, EVAL, 2, "err",
     "records no model (written before samples carried their run's stamp) and config.yaml is missing, so what "
     "made it cannot be checked; restore run/config.yaml", 
     refused_untouched),
    ("resume-config-edited", config_says_hot, EVAL[:-2] + ["--temperature", "1.0", "--out", "run"], 2, "err",
     "run/samples.jsonl:1: sample (toy, ", refused_config_kept),
    ("eval-bad-line", garbage_line, EVAL, 2, "err", "run/samples.jsonl:4: not a trajectory record (corrupt line); "
     + REPAIR_LINE, samples_unchanged),
    ("eval-turnless-line", turnless_line, EVAL, 2, "err", "run/samples.jsonl:11: not a trajectory record", samples_unchanged),
    ("eval-config-not-yaml", config_not_yaml, EVAL, 2, "err",
     "delete it to rebuild it from this command (every kept sample's stamp is checked against it)",
     refused_config_kept),
    ("leaderboard-bad-line", garbage_line, ["leaderboard", "run"], 2, "err", REPAIR_LINE, samples_unchanged),
    ("compare-bad-line", garbage_line, ["compare", "run", "run"], 2, "err", REPAIR_LINE, samples_unchanged),
    ("repair-bad-line", garbage_line, ["runs", "repair", "run"], 0, "out",
     "run/samples.jsonl: moved 1 unreadable line(s) (line 4) to run/samples.jsonl.quarantine; kept 10 samples",
     quarantined),
    ("repair-not-utf8", latin1_line, ["runs", "repair", "run"], 0, "out", "moved 1 unreadable line(s) (line 2)",
     quarantined_bytes),
    ("repair-clean", lambda d: None, ["runs", "repair", "run"], 0, "out",
     "run/samples.jsonl: every line is readable (10 samples); nothing to repair", samples_unchanged),
    ("leaderboard-skips-empty-run", empty_run_beside, ["leaderboard", "all"], 0, "err",
     "warning: skipping all/started: the run has no finished samples yet", both_runs_kept),
    ("leaderboard-only-empty", only_empty_run, ["leaderboard", "run"], 2, "err",
     "none of the 1 run directories holds finished samples yet", lambda d, b: None),
    ("cost-skips-empty-run", empty_run_beside, ["cost", "--runs", "all", "--prices", PRICES], 0, "err",
     "[cost] warning: skipping all/started: the run has no finished samples yet", both_runs_kept),
    ("cost-skips-empty-folder", empty_folder_beside, ["cost", "--runs", "nothing", "run", "--prices", PRICES], 0, "err",
     "[cost] warning: skipping nothing: an empty folder (no run directory in it yet)", samples_unchanged),
    ("cost-only-empty", only_empty_run, ["cost", "--runs", "run", "--prices", PRICES], 2, "err",
     "cost: none of the 1 run directories holds finished samples yet", lambda d, b: None),
    ("benchmark-duplicate-ids", duplicate_ids, DUP, 2, "err",
     "test.jsonl:4: duplicate ids in aime24: '2' is already at data/math/aime24/test.jsonl:2", nothing_written),
    ("model-without-tokenizer", model_without_tokenizer, ["eval", "--model", "notok"] + TOY1, 2, "err",
     "the tokenizer does not work (2 tokens in its vocabulary", nothing_written),
    ("checkpoint-incomplete", incomplete_checkpoint, ["eval", "--model", "ckpt/step_1"] + TOY1, 2, "err",
     "ckpt/step_1: an incomplete checkpoint (no COMPLETE marker: its save did not finish), not evaluated; "
     "the newest complete one beside it is ckpt/step_0", nothing_written),
    ("checkpoint-incomplete-group", incomplete_checkpoint, ["eval", "--model", "ckpt/step_1/models/shared"] + TOY1,
     2, "err", "ckpt/step_1: an incomplete checkpoint", nothing_written),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """One real run: tiny-random on 5 toy questions x 2 samples (10 stamped samples)."""
    base = tmp_path_factory.mktemp("finished")
    cwd = os.getcwd()
    os.chdir(base)
    try:
        assert main(EVAL) == 0
    finally:
        os.chdir(cwd)
    assert len(_lines(base / "run")) == 10
    return base / "run"


@pytest.mark.parametrize("damage,argv,code,stream,expected,kept", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_run_dir_case(finished_run, tmp_path, monkeypatch, capsys, damage, argv, code, stream, expected, kept):
    shutil.copytree(finished_run, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    damage(tmp_path)
    before = {name: (tmp_path / "run" / f).read_bytes() for name, f in (("samples", "samples.jsonl"), ("config", "config.yaml"))
              if (tmp_path / "run" / f).is_file()}
    assert main(list(argv)) == code
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("drmas-bench: error:")]
    if code:
        assert len(errors) == 1, err
        assert expected in errors[0], errors[0]
        assert "--fresh" not in errors[0] or "sample (toy, " in errors[0]  # offered for other runs' samples, never a bad line
    else:
        assert not errors, err
        assert expected in (out if stream == "out" else err), (out, err)
    kept(tmp_path, before)


def test_repair_is_idempotent_and_the_eval_then_resumes(finished_run, tmp_path, monkeypatch, capsys):
    shutil.copytree(finished_run, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    garbage_line(tmp_path)
    assert main(["runs", "repair", "run"]) == 0
    after = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    assert main(["runs", "repair", "run"]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == after
    assert main(EVAL) == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["run"]["episodes_resumed"] == 10 and s["run"]["episodes_run"] == 0


def test_smaller_rerun_summary_leaderboard_and_cost_agree(finished_run, tmp_path, monkeypatch):
    """A smaller --limit / --n over a bigger run: the run reports the latest command's selection (3
    questions x 1 sample), in its summary as in the leaderboard and cost tables over the dir; the
    other samples stay on disk and count again when the bigger command is run."""
    from drmas_bench import report
    from drmas_bench.metrics import MICRO
    from drmas_bench.pricing import load_prices

    shutil.copytree(finished_run, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    prices = load_prices(REPO / "leaderboards" / "prices.example.yaml")
    for argv, questions, n in ((EVAL[:5] + ["--n", "1", "--limit", "3", "--no-progress", "--out", "run"], 3, 1),
                               (EVAL, 5, 2)):
        assert main(argv) == 0
        s = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert (s["micro"]["questions"], s["micro"]["n"], s["micro"]["samples"]) == (questions, n, questions * n)
        assert s["run"]["episodes_run"] == 0  # the smaller selection is inside the bigger one
        run = report.load_runs(["run"])[0]  # what leaderboard and cost read
        row = report.run_row(run, report.parse_metrics("avg@n")[0], ci=False, n_boot=20, seed=0)
        assert row.cells[MICRO].value == s["micro"]["avg@n"]
        cost = report.team_cost(run, prices)
        assert (cost.questions, cost.trajectories, cost.avg) == (questions, questions * n, s["micro"]["avg@n"])
        assert len(_lines(tmp_path / "run")) == 10  # nothing was deleted


# ---------------------------------------------------------------------------------- error.log


def test_traceback_on_a_full_disk_goes_elsewhere_and_says_where(tmp_path, monkeypatch):
    """/dev/full answers every write with ENOSPC, like a full disk: the traceback goes to a temporary
    file (named in the result), and a real file whose write failed is removed, not left empty."""
    from drmas_bench import log

    try:
        raise ValueError("deep in a run")
    except ValueError as e:
        exc = e
    if Path("/dev/full").exists():
        where = log.write_traceback(exc, "/dev/full")
        assert where is not None and where != Path("/dev/full")
        assert "ValueError: deep in a run" in where.read_text()
        where.unlink()
    real_fsync, calls = os.fsync, []

    def full_once(fd):
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_once)
    target = tmp_path / "error.log"
    where = log.write_traceback(exc, target)
    assert not target.exists()  # no empty error.log left behind
    assert where != target and "deep in a run" in where.read_text()
    msg = str(log.unexpected(exc, "run stopped", log=where))
    assert f"traceback in {where}" in msg
    where.unlink()


def test_eval_error_on_a_full_run_dir_names_where_the_traceback_went(tmp_path, monkeypatch, capsys):
    import drmas_bench.log as log_mod
    import drmas_bench.runner as runner

    async def boom(*a, **k):
        raise RuntimeError("a bug mid-run")

    real_append = log_mod._append
    monkeypatch.setattr(runner, "run_episodes", boom)
    monkeypatch.setattr(log_mod, "_append", lambda p, t: False if p.name == "error.log" else real_append(p, t))
    monkeypatch.chdir(tmp_path)
    assert main(EVAL) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("drmas-bench: error:")][0]
    where = Path(re.search(r"traceback in (\S+?);", err).group(1))
    assert where.parent != tmp_path / "run" and "a bug mid-run" in where.read_text()
    assert not (tmp_path / "run" / "error.log").exists()
    where.unlink()


# ---------------------------------------------------------------------------------- stop signals


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _default_signals() -> None:
    """In the child: SIGINT and SIGHUP as a terminal's foreground job has them, whatever pytest inherited
    (a background job ignores SIGINT, nohup ignores SIGHUP)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class _Progress:
    """Reads a subprocess's stderr in a thread; ``done`` is the last episode count of its progress bar."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.text, self.done = "", 0
        self._t = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._t.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for chunk in iter(lambda: proc.stderr.read1(4096), b""):
            self.text += chunk.decode("utf-8", "replace")
            counts = re.findall(r"episodes:.*?\b(\d+)/\d+", self.text[-2000:])
            if counts:
                self.done = int(counts[-1])

    def join(self) -> str:
        self._t.join(10)
        return self.text


def _stop_midway(args: list[str], cwd: Path, sig: signal.Signals, saved_before: int) -> int:
    """Starts ``python ARGS``, sends SIG once the run's progress bar shows 18+ finished episodes and
    checks the stop: exit 128 + signum, the one-line message, every finished episode on disk. Returns
    how many episodes samples.jsonl then holds."""
    proc = subprocess.Popen([sys.executable, *args], env=_env(), cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=_default_signals)
    bar = _Progress(proc)
    try:
        deadline = time.time() + 240
        while bar.done < 18 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        seen = bar.done  # this run's episodes only: a resumed run's bar counts what is left to do
        proc.send_signal(sig)
        if sig == signal.SIGTERM:  # as `timeout` does: to the command, then to its whole process group
            proc.send_signal(sig)
        rc = proc.wait(120)
    finally:  # an interrupted or failed test leaves no eval child running
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = bar.join()
    assert 18 <= seen < 80 - saved_before, f"{sig.name} should land mid-run (saw {seen} episodes): {err[-600:]}"
    assert rc == 128 + sig, err[-600:]
    assert f"drmas-bench: stopped by {sig.name} (finished work is kept on disk)" in err
    saved = len(_lines(cwd / "run"))
    assert saved >= saved_before + seen, (saved, saved_before, seen)  # one flush of 16 before; the stop flushed the rest
    return saved


@pytest.mark.slow
def test_stop_signals_keep_finished_episodes_and_each_rerun_resumes(tmp_path):
    """With the default --flush-every 16, a stop signal after 18+ finished episodes (one flush of 16,
    the rest in the buffer) leaves every finished episode in samples.jsonl and exits 128 + signum;
    the same command resumes them. One run of 80 episodes takes both signals in turn: stopped by
    SIGTERM (sent twice in a row, as `timeout` delivers it), resumed and stopped by SIGHUP, then
    resumed to the end, each rerun keeping what the runs before it finished."""
    args = ["-m", "drmas_bench", "eval", "--model", "tiny-random", "--suite", "toy", "--n", "2", "--limit", "40",
            "--concurrency", "2", "--out", str(tmp_path / "run")]
    after_term = _stop_midway(args, tmp_path, signal.SIGTERM, 0)
    kept = _lines(tmp_path / "run")
    after_hup = _stop_midway(args, tmp_path, signal.SIGHUP, after_term)
    assert _lines(tmp_path / "run")[:after_term] == kept  # the rerun appended; it did not redo or rewrite
    r = subprocess.run([sys.executable, *args, "--no-progress"], env=_env(), cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-600:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["run"]["episodes_resumed"] == after_hup and s["run"]["episodes_run"] == 80 - after_hup
    assert len(_lines(tmp_path / "run")) == 80


def test_stop_while_a_batch_is_graded_keeps_that_batch(tmp_path, monkeypatch):
    """A stop (the main task cancelled, as asyncio does on SIGINT / SIGTERM) that lands while a flush
    is grading its batch: the grading is finished and the batch stored, and so is every episode that
    finished while the flush ran (done, but not yet taken by the loop); nothing finished is lost."""
    import asyncio
    from dataclasses import replace

    import drmas_bench.runner as runner
    import drmas_bench.suites.toy.toy  # noqa: F401 - registers "toy"
    from drmas_bench.agents.team import TeamSpec, WorkerGroupSpec
    from drmas_bench.run_dir import RunDir
    from drmas_bench.suites.toy.benchmarks import make_toy_tasks
    from drmas_bench.types import Completion, Sampling
    from drmas_bench.workflows.base import get_workflow

    class Quick:  # an engine that answers in 20 ms: the solver "1", the checker approves
        async def generate(self, reqs):
            await asyncio.sleep(0.02)
            return [Completion(text="<verdict>approve</verdict>" if r.agent == "checker" else "<answer>1</answer>",
                               completion_tokens=3) for r in reqs]

    grading, real_grade = threading.Event(), runner.grade_trajectories

    def slow_grade(*args, **kwargs):
        grading.set()
        time.sleep(0.5)
        return real_grade(*args, **kwargs)

    monkeypatch.setattr(runner, "grade_trajectories", slow_grade)
    toy = get_workflow("toy")
    finished = []

    async def counted(ep, **opts):
        await toy.fn(ep, **opts)
        finished.append(ep.task.id)

    wf = replace(toy, fn=counted)
    team = TeamSpec("toy", {"solver": "g", "checker": "g"}, {"g": WorkerGroupSpec("g", "fake")})
    store = RunDir(tmp_path / "run", {"identity": {}})

    async def stop_mid_grading():
        rt = runner.TeamRuntime(team, {"g": Quick()}, Sampling())
        task = asyncio.create_task(runner.run_episodes(make_toy_tasks(40), 4, runner.EpisodeRun(
            rt, wf, store, flush_every=4, concurrency=2, progress=False)))
        while not grading.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(stop_mid_grading())
    store.close()
    kept = store.records()
    assert 4 <= len(kept) < 160 and len(kept) == len(finished)
    assert all(r["correct"] in (True, False) and r["extra"] is not None for r in kept)


_SYNC_STOP = """
import os, signal, sys, time
from drmas_bench import signals
if sys.argv[1] == "ignore-sigint":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
if sys.argv[1] == "nohup":
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
sig = signal.SIGHUP if sys.argv[1] == "nohup" else signal.SIGTERM
try:
    with signals.stop_signals_as_interrupt():
        try:
            os.kill(os.getpid(), sig)
            time.sleep(3)
            print("still running")
        finally:
            print("finally ran")
except KeyboardInterrupt:
    print("interrupted")
    sys.exit(signals.exit_code())
"""


@pytest.mark.parametrize("mode,code,printed", [
    ("plain", 143, ["finally ran", "interrupted"]),  # synchronous work (index builds): KeyboardInterrupt at once
    ("ignore-sigint", 143, ["finally ran", "interrupted"]),  # SIGINT ignored (a script's background job): still stops
    ("nohup", 0, ["still running", "finally ran"]),  # an ignored SIGHUP stays ignored
])
def test_stop_signals_outside_asyncio(mode, code, printed):
    r = subprocess.run([sys.executable, "-c", _SYNC_STOP, mode], capture_output=True, text=True, timeout=60, env=_env(),
                       preexec_fn=_default_signals)
    assert r.returncode == code, r.stderr
    assert r.stdout.split() == " ".join(printed).split()


@pytest.mark.slow
def test_index_build_stopped_by_sigterm_leaves_no_temporary_copy(tmp_path, data_dir):
    """A BM25 build of the mini corpus stopped mid-way: exit 143, no manifest (incomplete) and no
    half-written passage store left; the same command then builds the index."""
    cmd = [sys.executable, "-m", "drmas_bench", "retrieval", "index", "--corpus",
           str(data_dir / "corpus" / "mini_corpus.jsonl"), "--out", str(tmp_path / "idx")]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_default_signals)
    bar = _Progress(proc)
    deadline = time.time() + 120
    while not re.search(r"tokenize:.*?\b[1-9]\d{3,}/", bar.text) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(60)
    err = bar.join()
    assert rc == 143, err[-600:]
    assert "stopped by SIGTERM" in err
    assert not (tmp_path / "idx" / "drmas_index.json").exists()
    assert not [p.name for p in (tmp_path / "idx").iterdir() if ".tmp" in p.name]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-600:]
    assert (tmp_path / "idx" / "drmas_index.json").is_file()


def test_ray_init_does_not_take_sigterm_away(monkeypatch):
    """ray.init makes SIGTERM sys.exit(15) in the driver (no flush, exit 15); starting Ray through
    pool.cluster.init_ray (eval's Ray pool, the trainer) puts the stop handler back."""
    ray = pytest.importorskip("ray")
    from drmas_bench import signals
    from drmas_bench.pool import cluster

    def fake_init(**kwargs):  # what ray.init does to the driver's SIGTERM, without starting Ray
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(cluster, "should_ship", lambda *a: False)
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # an earlier real ray.init in this process may have set one
    try:
        with signals.stop_signals_as_interrupt():
            assert cluster.init_ray(None, num_cpus=1) is True
            assert signal.getsignal(signal.SIGTERM) is signals._as_interrupt
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.slow
def test_train_stopped_by_sigterm_keeps_its_checkpoints_and_resumes(tmp_path):
    """The trainer under SIGTERM: exit 143 after the first checkpoint, the checkpoints and metrics it
    finished kept, and --resume continues to the last step. Four steps: the signal lands when step 1's
    checkpoint is complete, so steps 2 to 4 are the margin for it to land mid-run."""
    micro = ["sft.steps=0", "save_every=1", "rollout.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=6",
             "data.size=40", "agent_defaults.micro_batch_size=16", "val.before_train=false", "val.every=0"]
    cmd = [sys.executable, "-m", "drmas_bench", "train", "--recipe", "tiny", "--out", str(tmp_path / "t"), "--steps", "4",
           "--local", "--no-progress"]
    for s in micro:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, env=_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_default_signals)
    marker = tmp_path / "t" / "ckpt" / "step_1" / "COMPLETE"
    deadline = time.time() + 240
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(120)
    err = proc.stderr.read().decode()
    assert rc == 143, err[-800:]
    assert "stopped by SIGTERM" in err
    from drmas_trainer.checkpoint import latest_checkpoint

    step, _ = latest_checkpoint(tmp_path / "t" / "ckpt")
    assert 1 <= step < 4
    steps_logged = [json.loads(x)["step"] for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert steps_logged[:step] == list(range(1, step + 1))
    r = subprocess.run(cmd + ["--resume"], env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-800:]
    steps_logged = [json.loads(x)["step"] for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert steps_logged == list(range(1, 5))
