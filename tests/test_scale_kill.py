"""A loaded search run killed mid-way loses at most the episodes in flight (SIGKILL) or nothing
(SIGTERM), and the same command then finishes it.

The run is `drmas-bench eval --suite search` at concurrency 256 on the instant test-double engine of
scripts/bench_scale.py (registered in the engine registry; the model's cost taken out, so retrieval
over the mini corpus and grading are the whole load). The double appends a byte to a file per
finished episode, a count the kill cannot take back; what is on disk is samples.jsonl's complete
lines. SIGKILL: finished minus written is at most what the runner lets wait for the disk plus the
episodes in flight (``runner.MAX_UNWRITTEN`` + concurrency). The double counts an episode when its
answerer replies, a moment before the runner sees it end, so a whole window finishing at once shows
as up to `concurrency` finished and not yet handed to the recorder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drmas_bench import runner

REPO = Path(__file__).resolve().parents[1]
CONCURRENCY = 256
LIMIT = 60  # per benchmark: 1,920 episodes, the kill at a third (640), twice what may be lost (64 + 256)


def _cmd(run: Path, data_dir: Path, report: Path) -> list[str]:
    return [sys.executable, str(REPO / "scripts" / "bench_scale.py"), "--child", str(report), "--",
            "eval", "--model", "tiny-random", "--engine", "instant-double", "--suite", "search",
            "--benchmarks", "hotpotqa,2wiki", "--n", "16", "--limit", str(LIMIT), "--concurrency", str(CONCURRENCY),
            "--data-dir", str(data_dir), "--out", str(run), "--no-progress"]


def _complete_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_loaded_run_loses_at_most_the_episodes_in_flight(tmp_path, data_dir, sig):
    run, tally = tmp_path / "run", tmp_path / "finished"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "DRMAS_DOUBLE_FINISHED": str(tally)}
    total = 2 * LIMIT * 16
    proc = subprocess.Popen(_cmd(run, data_dir, tmp_path / "r.json"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=_default_signals)
    deadline = time.time() + 600
    while (tally.stat().st_size if tally.exists() else 0) < total // 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, proc.stderr.read().decode()[-800:]
    proc.send_signal(sig)
    rc = proc.wait(120)
    err = proc.stderr.read().decode()
    finished, written = tally.stat().st_size, _complete_lines(run / "samples.jsonl")
    lost = finished - written
    print(f"{signal.Signals(sig).name}: {finished} finished, {written} on disk, {lost} lost")
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL
        assert 0 <= lost <= runner.MAX_UNWRITTEN + CONCURRENCY
    else:
        assert rc == 143 and "stopped by SIGTERM" in err, err[-800:]
        # every episode that finished before the stop is kept; those finishing while it stops may be too
        assert written >= finished - CONCURRENCY and written > 0
    assert written < total
    again = subprocess.run(_cmd(run, data_dir, tmp_path / "r2.json"), env=env, capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0, again.stderr[-800:]
    assert f"{total - written} episodes run, {written} resumed from disk" in again.stdout + again.stderr
    recs = [json.loads(x) for x in (run / "samples.jsonl").read_bytes().splitlines()]
    assert len({(r["task"]["benchmark"], r["task"]["id"], r["sample_idx"]) for r in recs}) == total
