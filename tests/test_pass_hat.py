"""pass^k (all k of k samples succeed) beside pass@k: the estimator against a plain loop over every
k-subset of n samples, its edge cases, and pass^k with CIs in summaries (json and md), leaderboards
(md, wide and long CSV) and sweeps (sweep.json and sweep.md). Run directories are written by hand
(config.yaml + samples.jsonl)."""

from __future__ import annotations

import csv
import io
import itertools
import json
import random
from fractions import Fraction
from math import comb
from pathlib import Path

import pytest
import yaml

from drmas_bench import report, sweep, sweep_design
from drmas_bench.cli import main as cli_main
from drmas_bench.export.source import metric_ci
from drmas_bench.metrics import (
    MACRO,
    MICRO,
    avg_values,
    bootstrap_ci,
    bootstrap_means,
    pass_at_k,
    pass_hat_k,
    pass_hat_n,
    pass_hat_values,
    pass_values,
    questions,
    seed_for,
    summarize,
)
from drmas_bench.report.markdown import format_summary_markdown, sweep_markdown
from drmas_bench.types import UserError

BENCHES = (("aime24", 7), ("math500", 11))


def all_succeed_by_enumeration(n: int, c: int, k: int) -> Fraction:
    """The share of the C(n, k) ways to pick k of the n samples in which every picked one succeeded,
    counted by listing the subsets (samples 0..c-1 are the successes)."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(all(i < c for i in s) for s in subsets), len(subsets))


# ----------------------------------------------------------------------------- the estimator


def test_pass_hat_k_equals_the_subset_loop_on_random_n_c_k():
    rng = random.Random(36)
    cases = {(n, c, k) for n in range(1, 11) for c in (0, n) for k in range(1, n + 1)}  # c = 0 and c = n, every k
    while len(cases) < 260:
        n = rng.randint(1, 12)
        cases.add((n, rng.randint(0, n), rng.randint(1, n)))
    for n, c, k in sorted(cases):
        want = all_succeed_by_enumeration(n, c, k)
        assert pass_hat_k(n, c, k) == pytest.approx(float(want), abs=1e-12), (n, c, k)
    # large n, beyond enumeration: the closed form C(c, k) / C(n, k) in exact arithmetic
    for n, c, k in [(64, 40, 16), (200, 199, 100), (1000, 500, 3), (128, 128, 128), (128, 127, 128)]:
        assert pass_hat_k(n, c, k) == pytest.approx(float(Fraction(comb(c, k), comb(n, k))), rel=1e-9, abs=1e-15)


def test_pass_hat_k_edges_and_its_relation_to_pass_at_k():
    assert pass_hat_k(5, 0, 1) == 0.0 and pass_hat_k(5, 0, 5) == 0.0  # c = 0
    assert pass_hat_k(5, 5, 1) == 1.0 and pass_hat_k(5, 5, 5) == 1.0  # c = n
    assert pass_hat_k(5, 4, 5) == 0.0 and pass_hat_k(5, 2, 3) == 0.0  # k = n needs every sample; c < k: 0
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)  # C(2,2) / C(4,2)
    assert pass_hat_n(4, 4) == 1.0 and pass_hat_n(4, 3) == 0.0 and pass_hat_n(1, 0) == 0.0
    for n, c, k in [(4, 2, 5), (4, 2, 0), (4, 5, 1), (4, -1, 1), (0, 0, 1)]:  # refused like pass_at_k
        with pytest.raises(ValueError, match="pass_hat_k needs"):
            pass_hat_k(n, c, k)
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)
    with pytest.raises(ValueError, match="pass_hat_n needs"):
        pass_hat_n(0, 0)
    for n in range(1, 13):
        for c in range(n + 1):
            hats = [pass_hat_k(n, c, k) for k in range(1, n + 1)]
            assert hats[0] == pytest.approx(c / n) == pass_at_k(n, c, 1)  # k = 1: both are the success rate
            assert all(b <= a + 1e-12 for a, b in zip(hats, hats[1:]))  # never rises with k
            assert all(h <= pass_at_k(n, c, k) + 1e-12 for k, h in enumerate(hats, 1))
            assert hats[-1] == pass_hat_n(n, c)


# ------------------------------------------------------------------------------- summaries


def records(seed: int = 0, n: int = 4) -> list[dict]:
    """Two benchmarks; each question has its own success chance, so pass^k takes every value."""
    rng = random.Random(seed)
    out = []
    for bench, n_q in BENCHES:
        for q in range(n_q):
            p = rng.choice([0.0, 0.3, 0.6, 0.9, 1.0])
            for s in range(n):
                ok = rng.random() < p
                out.append({"task": {"benchmark": bench, "id": f"q{q}", "question": "?", "answers": ["1"], "meta": {}},
                            "sample_idx": s, "correct": ok, "reward": float(ok), "wall_s": 1.0, "turns": []})
    return out


def counts(recs: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    acc: dict[tuple[str, str], list[int]] = {}
    for r in recs:
        slot = acc.setdefault((r["task"]["benchmark"], r["task"]["id"]), [0, 0])
        slot[0] += 1
        slot[1] += bool(r["correct"])
    return {key: (n, c) for key, (n, c) in acc.items()}


def test_summary_has_pass_hat_k_for_every_k_of_pass_at_k_with_cis():
    recs = records(1, n=4)
    s = json.loads(json.dumps(summarize(recs, n_boot=200, seed=5)))
    per_q = counts(recs)
    blocks = {**s["benchmarks"], MICRO: s["micro"], MACRO: s["macro"]}
    for name, blk in blocks.items():
        assert list(blk["pass^k"]) == list(blk["pass@k"]) == ["1", "2", "4"], name
        assert list(blk["ci95"]["pass^k"]) == ["1", "2", "4"], name
        for k, v in blk["pass^k"].items():
            lo, hi = blk["ci95"]["pass^k"][k]
            assert 0.0 <= lo <= v + 1e-12 and v <= hi + 1e-12 <= 1.0 + 1e-12, (name, k)
            assert v <= blk["pass@k"][k] + 1e-12
        assert blk["pass^k"]["1"] == pytest.approx(blk["avg@n"])
        lo, hi = blk["ci95"]["pass^n"]
        assert lo <= blk["pass^n"] <= hi and blk["pass^n"] == pytest.approx(blk["pass^k"]["4"])
    # the values, from the per-question counts with the subset loop
    for bench, _ in BENCHES:
        mine = [v for key, v in per_q.items() if key[0] == bench]
        for k in (1, 2, 4):
            want = sum(all_succeed_by_enumeration(n, c, k) for n, c in mine) / len(mine)
            assert s["benchmarks"][bench]["pass^k"][str(k)] == pytest.approx(float(want), abs=1e-12)
    want_micro = sum(all_succeed_by_enumeration(n, c, 2) for n, c in per_q.values()) / len(per_q)
    assert s["micro"]["pass^k"]["2"] == pytest.approx(float(want_micro), abs=1e-12)
    assert s["macro"]["pass^k"]["2"] == pytest.approx(sum(s["benchmarks"][b]["pass^k"]["2"] for b, _ in BENCHES) / 2)
    # the CIs are the pass@n machinery's: a benchmark's pass^2 CI is the one-column bootstrap of its
    # questions' pass^2 with the benchmark's seed, and adding the pass^ columns left avg@n / pass@n as they were
    qs = [q for q in questions(recs).values() if q.benchmark == "aime24"]
    blk = s["benchmarks"]["aime24"]
    assert blk["ci95"]["pass^k"]["2"] == list(bootstrap_ci(pass_hat_values(qs, 2), 200, seed_for("aime24", 5)))
    alone = bootstrap_means([avg_values(qs), pass_values(qs)], 200, seed_for("aime24", 5))
    assert [blk["ci95"]["avg@n"], blk["ci95"]["pass@n"]] == [list(ci) for ci in alone]
    # the exports (Inspect log, Hub card) name each figure flat and find its CI in the k-indexed dict
    assert metric_ci(blk, "pass^2") == tuple(blk["ci95"]["pass^k"]["2"])
    assert metric_ci(blk, "pass^n") == tuple(blk["ci95"]["pass^n"]) and metric_ci(blk, "pass@2") is None


def test_summary_markdown_shows_pass_hat_k_with_cis_and_uneven_counts():
    recs = records(2, n=2)
    s = summarize(recs, n_boot=50)
    md = format_summary_markdown(s)
    assert "### Reliability (%): pass^k, all k of k samples succeed" in md
    head = next(line for line in md.splitlines() if line.startswith("| benchmark ") and "pass^1" in line)
    assert "pass^1 [95% CI]" in head and "pass^2 [95% CI]" in head and "pass^n" not in head
    row = next(line for line in md.splitlines() if line.startswith(f"| {MICRO} ") and "[" in line
               and line.split("|")[2].strip() == f"{100 * s['micro']['pass^k']['1']:.1f} "
               f"[{100 * s['micro']['ci95']['pass^k']['1'][0]:.1f}, {100 * s['micro']['ci95']['pass^k']['1'][1]:.1f}]")
    assert row
    # a partial run: q0 of aime24 has a third sample; pass^k stops at k = 2, pass^n is every sample present
    extra = {**recs[0], "sample_idx": 2, "correct": False, "reward": 0.0}
    uneven = summarize(recs + [extra], n_boot=50)
    blk = uneven["benchmarks"]["aime24"]
    assert blk["n_varies"] and list(blk["pass^k"]) == ["1", "2"]
    per_q = counts(recs + [extra])
    mine = [(n, c) for key, (n, c) in per_q.items() if key[0] == "aime24"]
    assert blk["pass^n"] == pytest.approx(sum(c == n for n, c in mine) / len(mine))
    md = format_summary_markdown(uneven)
    assert "pass^n [95% CI]" in md and "pass@k and pass^k use k <= 2" in md
    # a summary.json written without pass^k still renders, without the reliability table
    old = json.loads(json.dumps(s))
    for blk in [*old["benchmarks"].values(), old["micro"], old["macro"]]:
        del blk["pass^k"], blk["pass^n"]
    assert "Reliability" not in format_summary_markdown(old)


# ----------------------------------------------------------------------------- leaderboards


def write_run(path: Path, recs: list[dict], n: int) -> Path:
    path.mkdir(parents=True)
    cfg = {"suite": "math", "workflow": "math_refine", "n": n, "benchmarks": [b for b, _ in BENCHES],
           "identity": {"seed": 0, "team": {"solver": "m-" + path.name}, "sampling": {}}}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_leaderboard_pass_hat_columns_equal_the_summary(tmp_path):
    assert [m.name for m in report.parse_metrics("pass^4, PASS^n,pass@4")] == ["pass^4", "pass^n", "pass@4"]
    for bad in ("pass^0", "avg^4", "pass^", "pass^^2"):
        with pytest.raises(UserError, match="not a metric"):
            report.parse_metrics(bad)
    recs_a, recs_b = records(3, n=4), records(4, n=2)
    a = write_run(tmp_path / "runs" / "a", recs_a, 4)
    b = write_run(tmp_path / "runs" / "b", recs_b, 2)
    out = tmp_path / "lb"
    assert cli_main(["leaderboard", str(a), str(b), "--metric", "pass@2,pass^2,pass^4,pass^n", "--ci", "--n-boot", "50",
                     "--no-paper", "--out", str(out)]) == 0
    wide = list(csv.DictReader(io.StringIO((out / "math.csv").read_text())))
    assert {r["metric"] for r in wide} == {"pass@2", "pass^2", "pass^4", "pass^n"}
    cols = [b for b, _ in BENCHES] + [MICRO, MACRO]
    for run, recs in (("a", recs_a), ("b", recs_b)):
        s = summarize(recs, n_boot=20)
        blocks = {**{bench: s["benchmarks"][bench] for bench, _ in BENCHES}, MICRO: s["micro"], MACRO: s["macro"]}
        got = {r["metric"]: r for r in wide if r["run"] == run}
        for col in cols:
            assert float(got["pass^2"][col]) == pytest.approx(100 * blocks[col]["pass^k"]["2"], abs=5e-7)
            assert float(got["pass^n"][col]) == pytest.approx(100 * blocks[col]["pass^n"], abs=5e-7)
            assert got["pass^2"][f"{col} ci_lo"] and got["pass^2"][f"{col} ci_hi"]
        row = report.run_row(report.load_run(tmp_path / "runs" / run), report.parse_metrics("pass^2")[0], False, 20, 0)
        assert row.cells[MICRO].value == s["micro"]["pass^k"]["2"]  # equal: the same function
    assert got["pass^4"][MICRO] == "" and "pass^4 needs at least 4 samples per question; run has n=2" in got["pass^4"]["notes"]
    md = (out / "leaderboard.md").read_text()
    assert "## math: pass^2" in md and "## math: pass^n" in md
    long_rows = list(csv.DictReader(io.StringIO((out / "math_long.csv").read_text())))
    assert ("a", MICRO, "pass^4") in {(r["run"], r["benchmark"], r["metric"]) for r in long_rows}


# ---------------------------------------------------------------------------------- sweeps


def test_sweep_json_and_table_show_pass_hat_k(tmp_path):
    d = sweep_design.design("math_refine", ["solver", "verifier"], "m0", listed=[{"solver": "m0"}, {"solver": "m1"}])
    runs, rows = [], []
    for i, assignment in enumerate(d.assignments):
        recs = records(10 + i, n=4)
        run = report.load_run(write_run(tmp_path / f"s{i}", recs, 4))
        runs.append(run)
        rows.append({"assignment": assignment, "run": run.name, **sweep.assignment_figures(run)})
        s = summarize(recs, n_boot=10)
        assert rows[-1]["pass^k"] == pytest.approx(s["micro"]["pass^k"]) and list(rows[-1]["pass^k"]) == ["1", "2", "4"]
    doc = json.loads(json.dumps(sweep.sweep_document(d, rows, runs, suite="math", prices=None, cache=None, n_boot=20)))
    md = sweep_markdown(doc)
    lines = md.splitlines()
    head = next(line for line in lines if line.startswith("| # |"))
    cells = [c.strip() for c in head.strip("|").split("|")]
    assert cells[3:5] == ["pass@4", "pass^4"]
    first = [c.strip() for c in next(line for line in lines if line.startswith("| 1 |")).strip("|").split("|")]
    assert len(first) == len(cells) and first[4] == f"{100 * doc['assignments'][0]['pass^k']['4']:.1f}"
