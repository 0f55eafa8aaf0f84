"""`drmas-bench sweep`: the designs, the Pareto flags and the paired differences against plain
references, the files it writes, a SIGKILL mid-sweep, and equality with independent evals."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from drmas_bench import sweep, sweep_design
from drmas_bench.cli import main
from drmas_bench.types import UserError

MATH = ("solver", "verifier")
SEARCH = ("verifier", "searcher", "answerer")


# ----------------------------------------------------------------------------------- planning


def test_combinations_every_one_in_product_order():
    d = sweep_design.design("search_route", SEARCH, "D", candidates={"searcher": ["A", "B"], "verifier": ["X", "Y", "Z"]})
    assert d.kind == "combinations" and d.possible == 6 and len(d.assignments) == 6
    # the workflow's agent order, the first agent varying slowest; the unnamed answerer keeps --model
    assert d.assignments[:3] == [{"verifier": "X", "searcher": "A", "answerer": "D"},
                                 {"verifier": "X", "searcher": "B", "answerer": "D"},
                                 {"verifier": "Y", "searcher": "A", "answerer": "D"}]
    assert d.baseline == d.assignments[0]
    assert len({tuple(a.items()) for a in d.assignments}) == 6


def test_budget_keeps_baseline_then_single_swaps_then_the_rest():
    cands = {"verifier": ["big", "small"], "searcher": ["big", "small"], "answerer": ["big", "small"]}
    d = sweep_design.design("search_route", SEARCH, None, candidates=cands, max_assignments=5,
                     baseline={"verifier": "big", "searcher": "big", "answerer": "big"})
    big = {a: "big" for a in SEARCH}
    assert d.kind == "budget" and d.possible == 8
    assert d.assignments == [big, {**big, "verifier": "small"}, {**big, "searcher": "small"},
                             {**big, "answerer": "small"},
                             {"verifier": "big", "searcher": "small", "answerer": "small"}]  # first left in product order
    # a baseline the candidates lack is run first
    d2 = sweep_design.design("math_refine", MATH, "m0", candidates={"solver": ["a", "b"]}, baseline={"solver": "c"})
    assert d2.assignments[0] == {"solver": "c", "verifier": "m0"} and len(d2.assignments) == 3


def test_listed_set_in_file_order(tmp_path):
    f = tmp_path / "picks.yaml"
    f.write_text("- {solver: a}\n- {solver: b, verifier: c}\n")
    d = sweep_design.design("math_refine", MATH, "m0", listed=sweep_design.read_assignments(f))
    assert d.kind == "listed"
    assert d.assignments == [{"solver": "a", "verifier": "m0"}, {"solver": "b", "verifier": "c"}]
    assert d.candidates == {"solver": ["a", "b"], "verifier": ["m0", "c"]}
    j = tmp_path / "picks.json"
    j.write_text(json.dumps([{"solver": "a"}, {"solver": "a"}]))
    with pytest.raises(UserError, match="repeats"):
        sweep_design.design("math_refine", MATH, "m0", listed=sweep_design.read_assignments(j))


@pytest.mark.parametrize("kwargs, match", [
    ({"candidates": {"solvr": ["a"]}}, "unknown agent 'solvr'; the math_refine workflow's agents: solver, verifier"),
    ({"listed": [{"judge": "a"}]}, "entry 1: unknown agent 'judge'"),
    ({"candidates": {"solver": ["a"]}, "baseline": {"critic": "a"}}, "--baseline: unknown agent 'critic'"),
    ({"candidates": {"solver": ["a"]}, "max_assignments": 0}, "at least 1"),
    ({"listed": [{"solver": "a"}], "max_assignments": 2}, "--max-assignments"),
    ({}, "--candidates"),
])
def test_bad_designs_are_one_line(kwargs, match):
    with pytest.raises(UserError, match=match) as e:
        sweep_design.design("math_refine", MATH, "m0", **kwargs)
    assert "\n" not in str(e.value)


def test_no_model_for_an_unnamed_agent():
    with pytest.raises(UserError, match="no model for agent.*verifier.*--model"):
        sweep_design.design("math_refine", MATH, None, candidates={"solver": ["a", "b"]})


@pytest.mark.parametrize("items, match", [(["solver"], "AGENT=MODEL"), (["solver="], "AGENT=MODEL"),
                                          (["solver=a", "solver=b"], "given twice"), (["solver=a,a"], "listed twice")])
def test_bad_candidates(items, match):
    with pytest.raises(UserError, match=match):
        sweep_design.parse_candidates(items)


def test_unknown_model_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "sw"
    rc = main(["sweep", "--suite", "toy", "--model", "tiny-random", "--candidates", "solver=tiny-random,no-such-model",
               "--out", str(out), "--n", "1", "--limit", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "no-such-model" in err
    assert not (out / "runs").exists()


def test_plan_prints_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", "--suite", "math", "--model", "m0", "--candidates", "solver=a,b", "--candidates",
                 "verifier=c,d", "--max-assignments", "3", "--out", str(out), "--plan"]) == 0
    text = capsys.readouterr().out
    assert "3 assignments (budget; 4 possible)" in text and "[baseline]" in text
    assert text.count("-> runs/") == 3 and not out.exists()


def test_run_names_stable_and_distinct():
    asg = [{"solver": "x/m"}, {"solver": "y/m"}, {"solver": "z"}]
    names = sweep_design.run_names(asg)
    assert len(set(names)) == 3 and names[2] == "solver=z" and names == sweep_design.run_names(asg)


# -------------------------------------------------------------------------------- Pareto, pairs


def _front_by_loop(points):
    """A point is on the front unless another is at least as cheap and as accurate, one strictly."""
    out = []
    for i, (c, a) in enumerate(points):
        if c is None:
            out.append(False)
            continue
        beaten = False
        for j, (c2, a2) in enumerate(points):
            if j != i and c2 is not None and c2 <= c and a2 >= a and (c2 < c or a2 > a):
                beaten = True
        out.append(not beaten)
    return out


def test_pareto_flags_match_a_plain_loop():
    hand = [(1.0, 0.5), (2.0, 0.7), (2.0, 0.6), (3.0, 0.7), (0.5, 0.1), (None, 0.9), (1.0, 0.5)]
    assert sweep.pareto_flags(hand) == _front_by_loop(hand) == [True, True, False, False, True, False, True]
    rng = random.Random(3)
    for _ in range(200):
        pts = [(rng.choice([None, *range(5)]), rng.randint(0, 4) / 4) for _ in range(rng.randint(1, 9))]
        assert sweep.pareto_flags(pts) == _front_by_loop(pts)


def _run(name, rates, n=4):
    from drmas_bench.report.runs import Run

    recs = [{"task": {"benchmark": "b", "id": f"q{i}"}, "sample_idx": s, "reward": float(s < c)}
            for i, c in enumerate(rates) for s in range(n)]
    return Run(path=Path(name), name=name, config={"identity": {}}, records=recs, suite="toy", workflow="toy", n=n,
               benchmarks=["b"], team={}, sampling={})


def test_paired_difference_matches_a_plain_bootstrap():
    from drmas_bench.metrics import seed_for

    rng = np.random.default_rng(1)
    ca, cb = rng.integers(0, 5, size=40), rng.integers(0, 5, size=40)
    d = sweep.paired_difference(_run("a", ca), _run("b", cb), n_boot=500, seed=7)
    diffs = cb / 4 - ca / 4  # per question, in the question order (ids sort as strings)
    order = sorted(range(40), key=lambda i: f"q{i}")
    diffs = diffs[order]
    assert d["diff"] == pytest.approx(diffs.mean()) and d["n_pairs"] == 40
    boot = np.random.default_rng(seed_for("avg", 7))
    stats = [diffs[boot.integers(0, 40, size=40)].mean() for _ in range(500)]
    assert d["ci_low"] == pytest.approx(np.quantile(stats, 0.025))
    assert d["ci_high"] == pytest.approx(np.quantile(stats, 0.975))


# ---------------------------------------------------------------------------------- end to end

TOY = ["--suite", "toy", "--model", "tiny-random", "--n", "2", "--max-new-tokens", "8", "--no-progress"]


@pytest.fixture(scope="module")
def tiny_b(tmp_path_factory) -> Path:
    """A second tiny model: the tiny-random recipe with seed 1 (other weights, the same tokenizer)."""
    from drmas_bench.models.tiny import build_tiny_random

    dest = tmp_path_factory.mktemp("models") / "tiny-b"
    build_tiny_random(dest, seed=1, log=lambda s: None)
    return dest


def _prices(tmp_path: Path) -> Path:
    f = tmp_path / "prices.yaml"
    f.write_text("currency: USD\ndefault: error\nmodels:\n  tiny-random: {input_per_1m: 0.1, output_per_1m: 0.4}\n"
                 "  tiny-b: {input_per_1m: 0.3, output_per_1m: 1.2}\n")
    return f


def _essence(run: Path) -> dict:
    out = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[(r["task"]["benchmark"], r["task"]["id"], r["sample_idx"])] = (
            r.get("reward"), r.get("final_answer"),
            tuple((t["agent"], t["completion"]["text"], t["completion"]["completion_tokens"]) for t in r["turns"]))
    return out


def test_files_written(tmp_path, tiny_b, capsys):
    out = tmp_path / "sw"
    cache = ["--cache", str(tmp_path / "cache")] if _cache_supported() else []
    assert main(["sweep", *TOY, "--limit", "2", "--candidates", f"solver=tiny-random,{tiny_b}",
                 "--candidates", f"checker=tiny-random,{tiny_b}", "--prices", str(_prices(tmp_path)),
                 "--out", str(out), *cache]) == 0
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["suite"] == "toy" and doc["complete"] and len(doc["assignments"]) == 4
    assert doc["baseline"] == {"solver": "tiny-random", "checker": "tiny-random"}
    for a in doc["assignments"]:
        assert {"assignment", "run", "avg@n", "pass@k", "latency_s", "tokens", "usd", "usd_paid", "model_calls",
                "cache_hits", "pareto_usd", "pareto_latency", "vs_baseline"} <= set(a)
        assert Path(a["run"], "summary.json").is_file() and a["vs_baseline"]["n_pairs"] == 2
        assert a["usd"] > 0 and a["tokens"] > 0
    assert any(a["pareto_usd"] for a in doc["assignments"]) and any(a["pareto_latency"] for a in doc["assignments"])
    # the cheaper model everywhere is cheapest: the $ front holds the baseline
    assert doc["assignments"][0]["pareto_usd"]
    assert doc["calls_without_cache"] == sum(a["model_calls"] for a in doc["assignments"])
    assert doc["model_calls"] == doc["calls_without_cache"] - sum(a["cache_hits"] for a in doc["assignments"])
    if cache:  # a cached call costs its original $ as if alone, nothing in what the sweep paid
        assert doc["model_calls"] < doc["calls_without_cache"]
        for a in doc["assignments"]:
            assert (a["usd_paid"] < a["usd"]) if a["cache_hits"] else (a["usd_paid"] == a["usd"])
        assert doc["usd_paid"] < doc["usd"]
    md = (out / "sweep.md").read_text()
    assert md.count("\n| ") == 5 and "★" in md and md in capsys.readouterr().out
    png = (out / "pareto.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    # every assignment is a normal run dir the report commands read
    assert main(["compare", doc["assignments"][0]["run"], doc["assignments"][3]["run"]]) == 0
    # the cost study reads the sweep instead of running it again
    assert main(["cost", "--sweep", str(out), "--prices", str(_prices(tmp_path))]) == 0
    assert "tiny-b" in capsys.readouterr().out


def test_a_model_the_price_sheet_lacks_is_refused_before_anything_runs(tmp_path, tiny_b, capsys):
    prices = tmp_path / "p.yaml"
    prices.write_text("currency: USD\ndefault: error\nmodels:\n  tiny-random: {input_per_1m: 0.1, output_per_1m: 0.1}\n")
    out = tmp_path / "sw"
    rc = main(["sweep", *TOY, "--limit", "1", "--candidates", f"solver=tiny-random,{tiny_b}", "--prices", str(prices),
               "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "tiny-b" in err and "no price" in err
    assert not (out / "runs").exists()


@pytest.mark.slow
def test_sigkill_mid_sweep_then_rerun_finishes_and_reruns_nothing_finished(tmp_path, tiny_b):
    out = tmp_path / "sw"
    args = [sys.executable, "-m", "drmas_bench", "sweep", *TOY, "--limit", "12", "--concurrency", "2",
            "--flush-every", "1", "--candidates", f"solver=tiny-random,{tiny_b}", "--out", str(out),
            *(["--cache", str(tmp_path / "cache")] if _cache_supported() else [])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    first, second = (out / "runs" / n for n in sweep_design.run_names([{"solver": "tiny-random", "checker": "tiny-random"},
                                                                 {"solver": str(tiny_b), "checker": "tiny-random"}]))
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    samples = second / "samples.jsonl"
    while time.time() < deadline and (not samples.exists() or len(samples.read_bytes().splitlines()) < 3):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = samples.read_bytes().splitlines()
    assert 3 <= len(kept) < 24, "the kill should land inside the second assignment"
    done = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (first / "samples.jsonl", first / "summary.json")}
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["finished"] == 1 and not doc["complete"]  # what the killed sweep had finished is readable
    r = subprocess.run(args, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "1/2 solver=tiny-random, checker=tiny-random: finished earlier, kept" in r.stderr
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in done} == done  # the finished one was not touched
    after = samples.read_bytes().splitlines()
    assert len(after) == 24 and after[:len(kept)] == kept  # the half-run one resumed, nothing redone
    s2 = json.loads((second / "summary.json").read_text())
    assert s2["run"]["episodes_resumed"] == len(kept) and s2["run"]["episodes_run"] == 24 - len(kept)
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["complete"] and doc["assignments_kept"] == 1 and doc["assignments_run"] == 1


def _cache_supported() -> bool:
    from drmas_bench.api import EvalConfig

    return "cache" in {f.name for f in fields(EvalConfig)}


@pytest.mark.slow
def test_sweep_numbers_equal_independent_evals_on_hf(tmp_path, tiny_b):
    """A math sweep (through the call cache where it exists) gives each assignment exactly the
    samples an independent uncached eval of it gives."""
    from conftest import find_data_dir

    from drmas_bench.api import EvalConfig, evaluate

    data = find_data_dir()
    if data is None:
        pytest.skip("benchmark files not found (DRMAS_DATA_DIR or ../shared/data)")
    out = tmp_path / "sw"
    common = ["--suite", "math", "--benchmarks", "math500", "--limit", "2", "--n", "2", "--max-new-tokens", "12",
              "--data-dir", str(data), "--no-progress"]
    cache = ["--cache", str(tmp_path / "cache")] if _cache_supported() else []
    prices = _prices(tmp_path)
    assert main(["sweep", *common, "--model", "tiny-random", "--candidates", f"solver=tiny-random,{tiny_b}",
                 "--candidates", f"verifier=tiny-random,{tiny_b}", "--out", str(out), "--prices", str(prices),
                 *cache]) == 0
    doc = json.loads((out / "sweep.json").read_text())
    assert len(doc["assignments"]) == 4
    if cache:  # assignments keeping the solver's model reuse its first call
        assert doc["model_calls"] < doc["calls_without_cache"]
    for a in doc["assignments"]:
        alone = tmp_path / "alone" / Path(a["run"]).name
        s = evaluate(EvalConfig(model_for=a["assignment"], suite="math", benchmarks="math500", limit=2, n=2,
                                max_new_tokens=12, data_dir=str(data), progress=False, out=str(alone)))
        assert _essence(Path(a["run"])) == _essence(alone), a["label"]
        assert s["micro"]["avg@n"] == a["avg@n"]
        assert s["micro"]["pass@k"] == a["pass@k"]
        # as if alone: the same tokens and dollars as the independent eval, though the sweep paid less
        from drmas_bench.pricing import load_prices
        from drmas_bench.report.runs import load_run

        ind = sweep.assignment_figures(load_run(alone), load_prices(str(prices)))
        assert (ind["tokens"], ind["model_calls"]) == (a["tokens"], a["model_calls"])
        assert ind["usd"] == pytest.approx(a["usd"], rel=1e-12) and ind["cache_hits"] == 0
