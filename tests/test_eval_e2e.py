"""`drmas-bench eval` end to end with the real in-process engine on the tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drmas_bench.cli import main

pytestmark = pytest.mark.slow

TOY = ["eval", "--model", "tiny-random", "--suite", "toy", "--no-progress", "--max-new-tokens", "12"]


def _samples(run: Path) -> dict[tuple, dict]:
    out = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        key = (r["task"]["benchmark"], r["task"]["id"], r["sample_idx"])
        assert key not in out, f"duplicated trajectory {key}"
        out[key] = r
    return out


def _essence(r: dict) -> tuple:
    return (r["final_answer"], r["correct"], tuple((t["agent"], t["completion"]["text"], t["valid"]) for t in r["turns"]))


def test_toy_eval_writes_records_and_summary(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(TOY + ["--n", "2", "--limit", "6", "--out", str(run)]) == 0
    recs = _samples(run)
    assert len(recs) == 12
    for r in recs.values():
        assert r["turns"][0]["agent"] == "solver" and r["turns"][0]["wg"] == "shared"
        for t in r["turns"]:
            c = t["completion"]
            assert 0 < c["completion_tokens"] <= 12 and c["prompt_tokens"] > 0 and c["latency_s"] >= 0
            assert t["request"]["sampling"]["seed"] is not None
    summary = json.loads((run / "summary.json").read_text())
    assert (run / "summary.md").read_text().startswith("# toy suite (toy): tiny-random, ")  # suite, model, date
    assert "avg@n" in capsys.readouterr().out
    assert summary["run"]["episodes_run"] == 12
    # the same command again resumes: nothing to run, same records
    assert main(TOY + ["--n", "2", "--limit", "6", "--out", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["run"]["episodes_resumed"] == 12
    assert _samples(run) == recs
    # a changed configuration refuses to mix into the old run dir
    assert main(TOY + ["--n", "2", "--limit", "6", "--out", str(run), "--temperature", "0.9"]) == 2
    assert "different configuration" in capsys.readouterr().err


def test_sigkill_midway_then_resume_equals_uninterrupted(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    args = TOY + ["--n", "2", "--limit", "24", "--concurrency", "8", "--flush-every", "4"]
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    subprocess.run([sys.executable, "-m", "drmas_bench", *args, "--out", str(ref)], check=True, env=env,
                   capture_output=True)
    proc = subprocess.Popen([sys.executable, "-m", "drmas_bench", *args, "--out", str(killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = killed / "samples.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not samples.exists() or len(samples.read_bytes().splitlines()) < 8):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = len(samples.read_bytes().splitlines())
    assert 8 <= partial < 48, "the kill should land midway"
    # simulate the worst case of a kill during an append: a cut-off last line
    with open(samples, "ab") as f:
        f.write(b'{"task": {"benchmark": "toy", "id": "toy-1')
    r = subprocess.run([sys.executable, "-m", "drmas_bench", *args, "--out", str(killed)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    a, b = _samples(ref), _samples(killed)
    assert set(a) == set(b) and len(a) == 48
    assert {k: _essence(v) for k, v in a.items()} == {k: _essence(v) for k, v in b.items()}
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (ref, killed))
    assert sb["run"]["episodes_resumed"] == partial
    for key in ("benchmarks", "micro", "macro"):
        if key in sa:
            assert _strip_latency(sa[key]) == _strip_latency(sb[key])


def _strip_latency(x):
    if isinstance(x, dict):
        return {k: _strip_latency(v) for k, v in x.items() if "latency" not in k and "wall" not in k}
    if isinstance(x, list):
        return [_strip_latency(v) for v in x]
    return x


def test_bad_inputs_exit_with_one_line(tmp_path, capsys):
    team = tmp_path / "team.yaml"
    team.write_text("worker_groups: {a: {model: tiny-random}}\nagents: {solver: a, judge: a}\n")
    assert main(["eval", "--team", str(team), "--suite", "toy", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown agent 'judge'" in err
    assert main(["eval", "--model", str(tmp_path / "nope"), "--suite", "toy", "--out", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err
    assert main(["eval", "--model", "tiny-random", "--suite", "toy", "--benchmarks", "", "--out", str(tmp_path / "r3")]) == 2
    assert "selection is empty" in capsys.readouterr().err


def test_retriever_down_stops_before_any_episode(tmp_path, capsys):
    import socket

    data = tmp_path / "data" / "qa" / "bamboogle"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text(json.dumps({"id": "q0", "question": "Who?", "golden_answers": ["x"]}) + "\n")
    with socket.socket() as s:  # a free loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    rc = main(["eval", "--model", "tiny-random", "--suite", "search", "--benchmarks", "bamboogle", "--n", "1",
               "--data-dir", str(tmp_path / "data"), "--retriever", f"http://127.0.0.1:{port}", "--out", str(run),
               "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"127.0.0.1:{port}" in err[0]
    assert not (run / "samples.jsonl").exists()
