"""Summaries and leaderboards do not depend on the order of the lines in samples.jsonl (bootstrap CIs
included), and a leaderboard's CSV file name, which comes from a run's config.yaml, cannot point
outside --out. Run directories are written here by hand (config.yaml + samples.jsonl)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from drmas_bench import report
from drmas_bench.cli import main as cli_main
from drmas_bench.metrics import summarize
from drmas_bench.types import UserError


def records(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for bench, n_q in (("aime24", 12), ("math500", 20)):
        for q in range(n_q):
            p = rng.random()
            for s in range(4):
                ok = rng.random() < p
                out.append({"task": {"benchmark": bench, "id": f"q{q}", "question": "?", "answers": ["1"], "meta": {}},
                            "sample_idx": s, "correct": ok, "reward": float(ok), "wall_s": rng.random(),
                            "cost_usd": rng.random() * 1e-3, "extra": {"em": float(ok), "f1": rng.random()},
                            "turns": [{"agent": "solver", "wg": "m", "step": 0, "valid": True,
                                       "completion": {"prompt_tokens": rng.randint(10, 99), "completion_tokens": 5,
                                                      "latency_s": rng.random()}}]})
    return out


def shuffled(recs: list[dict], seed: int) -> list[dict]:
    out = list(recs)
    random.Random(seed).shuffle(out)
    return out


def test_summary_is_identical_for_shuffled_lines():
    recs = records()
    base = summarize(recs, n_boot=300)
    assert base["micro"]["ci95"]["avg@n"][0] < base["micro"]["ci95"]["avg@n"][1]  # a CI with some width
    for seed in (1, 2, 3):
        assert json.dumps(summarize(shuffled(recs, seed), n_boot=300), sort_keys=True) == json.dumps(base, sort_keys=True)
    # the seed still matters: identical because of the order, not because the CI ignores resampling
    assert summarize(recs, n_boot=300, seed=1)["micro"]["ci95"] != base["micro"]["ci95"]


def write_run(path: Path, recs: list[dict], suite: str = "math") -> Path:
    path.mkdir(parents=True)
    cfg = {"suite": suite, "workflow": "math_refine", "n": 4, "benchmarks": ["aime24", "math500"],
           "identity": {"seed": 0, "team": {}, "sampling": {}}}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_leaderboard_cis_are_identical_for_shuffled_lines(tmp_path):
    recs = records()
    a = report.load_run(write_run(tmp_path / "a", recs))
    b = report.load_run(write_run(tmp_path / "b", shuffled(recs, 7)))
    metric = report.parse_metrics("avg@n")[0]
    row_a, row_b = (report.run_row(r, metric, ci=True, n_boot=300, seed=0) for r in (a, b))
    assert {k: (c.value, c.ci) for k, c in row_a.cells.items()} == {k: (c.value, c.ci) for k, c in row_b.cells.items()}


@pytest.mark.parametrize("suite", ["../../escape", "/tmp/abs", "a/b", "..", "x..y", "sp ace", ""])
def test_leaderboard_refuses_a_suite_that_is_not_a_plain_file_name(tmp_path, capsys, suite):
    run = write_run(tmp_path / "run1", records(), suite=suite)
    out = tmp_path / "lb" / "out"
    rc = cli_main(["leaderboard", str(run), "--out", str(out), "--no-paper", "--n-boot", "10"])
    err = capsys.readouterr().err
    assert rc != 0 and "the suite of run run1" in err and "cannot name an output file" in err
    assert not out.exists() and not (tmp_path / "escape.csv").exists() and not (tmp_path / "lb" / "escape.csv").exists()


def test_leaderboard_writes_a_safe_suite_inside_out(tmp_path, capsys):
    run = write_run(tmp_path / "run1", records(), suite="math-v2.1_x")
    out = tmp_path / "lb"
    assert cli_main(["leaderboard", str(run), "--out", str(out), "--no-paper", "--n-boot", "10"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["leaderboard.html", "leaderboard.md", "math-v2.1_x.csv",
                                                    "math-v2.1_x_long.csv"]
    with pytest.raises(UserError, match="'sub/x'"):
        report.data_file_name(out, "sub/x", ".csv", "the suite of run r")
