"""Metrics (pass@k, avg@k, bootstrap CIs, summaries) and price sheets."""

from __future__ import annotations

import json
from fractions import Fraction
from math import comb
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drmas_bench.metrics import (
    MACRO,
    MICRO,
    avg_at_k,
    bootstrap_ci,
    default_ks,
    pass_at_k,
    pass_at_n,
    summarize,
)
from drmas_bench.report.markdown import format_summary_markdown
from drmas_bench.pricing import ModelPrice, PriceSheet, load_prices
from drmas_bench.types import Completion, Request, Task, Trajectory, Turn, UserError, record_correct

REPO = Path(__file__).resolve().parent.parent


def pass_at_k_exact(n: int, c: int, k: int) -> Fraction:
    """The combinatorial definition, in exact arithmetic."""
    return 1 - Fraction(comb(n - c, k), comb(n, k))


@st.composite
def nck(draw):
    n = draw(st.integers(1, 64))
    c = draw(st.integers(0, n))
    k = draw(st.integers(1, n))
    return n, c, k


# ---------------------------------------------------------------------------------- pass@k


@pytest.mark.parametrize(
    "n, c, k, want",
    [
        (2, 1, 1, 0.5),
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (10, 3, 4, 5 / 6),  # 1 - C(7,4)/C(10,4) = 1 - 35/210
        (16, 1, 8, 0.5),  # one success among 16: a half-sized draw catches it half the time
        (5, 0, 3, 0.0),
        (5, 5, 1, 1.0),
        (16, 4, 16, 1.0),
        (16, 12, 5, 1.0),  # fewer failures (4) than draws (5)
    ],
)
def test_pass_at_k_hand_values(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_bad_input(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


@settings(max_examples=300, deadline=None)
@given(nck())
def test_pass_at_k_matches_exact_reference(args):
    n, c, k = args
    assert pass_at_k(n, c, k) == pytest.approx(float(pass_at_k_exact(n, c, k)), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_k_properties(args):
    n, c = args
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert all(b >= a - 1e-12 for a, b in zip(values, values[1:]))  # monotone in k
    assert values[0] == pytest.approx(c / n, abs=1e-12)  # k = 1: the success rate
    assert values[-1] == float(c > 0)  # k = n: any success


def test_avg_at_k_and_default_ks():
    assert avg_at_k(16, 4) == 0.25
    assert avg_at_k(16, 4, k=8) == 0.25
    with pytest.raises(ValueError):
        avg_at_k(4, 5)
    with pytest.raises(ValueError):
        avg_at_k(4, 1, k=8)
    assert default_ks(16) == [1, 2, 4, 8, 16]
    assert default_ks(5) == [1, 2, 4, 5]
    assert default_ks(1) == [1]


# -------------------------------------------------------------------------------- bootstrap


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), min_size=1, max_size=60), st.integers(0, 10**6))
def test_bootstrap_ci_contains_point_estimate(values, seed):
    lo, hi = bootstrap_ci(values, n_boot=300, seed=seed)
    mean = float(np.mean(values))
    assert lo - 1e-12 <= mean <= hi + 1e-12
    assert 0.0 <= lo <= hi <= 1.0


def test_bootstrap_ci_is_seeded():
    values = [0.0, 0.1, 0.35, 0.5, 0.55, 0.7, 0.8, 0.85, 0.9, 1.0, 1.0, 0.25]
    assert bootstrap_ci(values, n_boot=200, seed=3) == bootstrap_ci(values, n_boot=200, seed=3)
    assert bootstrap_ci(values, n_boot=200, seed=3) != bootstrap_ci(values, n_boot=200, seed=4)
    assert bootstrap_ci([0.5] * 5) == (0.5, 0.5)


# ------------------------------------------------------------------------------- summarize


def record(bench: str, qid: str, idx: int, correct: bool, wall: float = 1.0, turns=None, extra=None, cost: float = 0.0) -> dict:
    return {
        "task": {"id": qid, "benchmark": bench, "question": "q", "answers": ["1"], "meta": {}},
        "sample_idx": idx,
        "turns": turns or [],
        "final_answer": None,
        "reward": float(correct),
        "correct": correct,
        "extra": extra or {},
        "wall_s": wall,
        "cost_usd": cost,
    }


def turn(agent: str, wg: str, prompt: int, completion: int, latency: float = 0.0) -> dict:
    return {"agent": agent, "wg": wg, "step": 0, "valid": True,
            "completion": {"text": "", "prompt_tokens": prompt, "completion_tokens": completion, "latency_s": latency}}


def unbalanced_fixture() -> list[dict]:
    """A: 1 question, 2/2 correct. B: 3 questions with 0/2, 0/2, 1/2 correct.

    avg@2:  A = 1, B = (0 + 0 + 0.5) / 3 = 1/6; micro = (1 + 0 + 0 + 0.5) / 4 = 3/8;
            macro = (1 + 1/6) / 2 = 7/12.
    pass@2: A = 1, B = 1/3; micro = 2/4 = 1/2; macro = 2/3.
    """
    solver = lambda: [turn("solver", "qwen2.5-7b-instruct", 100, 10)]  # noqa: E731
    recs = [record("A", "a0", s, True, wall=1.0 + s, turns=solver()) for s in range(2)]
    for q, outcomes in (("b0", (False, False)), ("b1", (False, False)), ("b2", (True, False))):
        for s, ok in enumerate(outcomes):
            recs.append(record("B", q, s, ok, wall=3.0 + len(recs), turns=solver()))
    return recs


def test_summary_micro_and_macro_by_hand():
    s = summarize(unbalanced_fixture(), n_boot=200)
    a, b = s["benchmarks"]["A"], s["benchmarks"]["B"]
    assert (a["questions"], a["n"], b["questions"], b["n"]) == (1, 2, 3, 2)
    assert a["avg@n"] == 1.0 and b["avg@n"] == pytest.approx(1 / 6)
    assert s["micro"]["avg@n"] == pytest.approx(3 / 8)
    assert s["macro"]["avg@n"] == pytest.approx(7 / 12)
    assert s["micro"]["pass@k"] == {"1": pytest.approx(3 / 8), "2": pytest.approx(1 / 2)}
    assert s["macro"]["pass@k"] == {"1": pytest.approx(7 / 12), "2": pytest.approx(2 / 3)}
    assert s["micro"]["pass@n"] == pytest.approx(1 / 2) and s["macro"]["pass@n"] == pytest.approx(2 / 3)
    assert s["micro"]["avg@n"] != s["macro"]["avg@n"]
    for blk in (a, b, s["micro"], s["macro"]):
        lo, hi = blk["ci95"]["avg@n"]
        assert lo <= blk["avg@n"] <= hi
    assert s["benchmarks"]["A"]["ci95"]["avg@n"] == [1.0, 1.0]  # one question, always right
    assert s["labels"] == {"micro": MICRO, "macro": MACRO}
    assert not s["micro"]["n_varies"]


def test_summary_tokens_latency_and_dollars():
    recs = [
        record("A", "q0", 0, True, wall=1.0, turns=[turn("solver", "big", 100, 10, 1.0), turn("verifier", "small", 50, 4, 0.5)]),
        record("A", "q0", 1, False, wall=2.0, turns=[turn("solver", "big", 300, 30, 1.0), turn("verifier", "small", 70, 6, 0.5),
                                                     turn("solver", "big", 200, 20, 1.0)]),
        record("A", "q1", 0, True, wall=3.0, turns=[turn("solver", "big", 100, 10, 1.0)], extra={"em": 1.0, "f1": 1.0}),
        record("A", "q1", 1, True, wall=4.0, turns=[turn("solver", "big", 100, 10, 1.0)], extra={"em": 0.0, "f1": 0.5}),
    ]
    prices = PriceSheet({"big": ModelPrice(input_per_1m=1.0, output_per_1m=2.0), "small": ModelPrice(gpu_hour=3.6)})
    s = summarize(recs, prices=prices, n_boot=100)
    blk = s["benchmarks"]["A"]
    solver, verifier = blk["agents"]["solver"], blk["agents"]["verifier"]
    assert solver["calls"] == 5 and solver["calls_per_traj"] == 5 / 4
    assert solver["prompt_tokens_per_call"] == 800 / 5 and solver["completion_tokens_per_call"] == 80 / 5
    assert verifier["calls_per_traj"] == 2 / 4 and verifier["prompt_tokens_per_call"] == 60
    # big: 800 prompt * $1/1M + 80 completion * $2/1M = 0.00096; small: 2 calls * 0.5 s * $3.6/h = 0.001
    assert blk["usd_total"] == pytest.approx(0.00096 + 0.001)
    assert blk["usd_per_question"] == pytest.approx((0.00096 + 0.001) / 2)
    assert blk["usd_per_sample"] == pytest.approx((0.00096 + 0.001) / 4)
    assert solver["usd_per_question"] == pytest.approx(0.00096 / 2)
    assert blk["usd_source"] == "price sheet"
    # numpy's linear percentiles of [1, 2, 3, 4]: p50 = 2.5, p95 = 3.85
    assert blk["latency_s"] == {"p50": pytest.approx(2.5), "p95": pytest.approx(3.85)}
    assert blk["em"] == 0.5 and blk["f1"] == 0.75
    unpriced = summarize(recs, n_boot=10)
    assert unpriced["micro"]["usd_source"] == "recorded cost_usd" and unpriced["micro"]["usd_total"] == 0.0


def test_summary_flags_uneven_n_and_skips_large_k():
    recs = [record("A", "q0", s, s == 0) for s in range(4)] + [record("A", "q1", s, False) for s in range(3)]
    recs.append(record("A", "q1", 2, True))  # a duplicate sample index
    s = summarize(recs, ks=[1, 2, 4, 8], n_boot=50)
    blk = s["benchmarks"]["A"]
    assert blk["n_varies"] is False  # both have 4 records, but one is a duplicate
    assert blk["duplicate_samples"] == 1
    recs.pop()
    blk = summarize(recs, ks=[1, 2, 4, 8], n_boot=50)["benchmarks"]["A"]
    assert blk["n_varies"] and (blk["n_min"], blk["n_max"]) == (3, 4)
    assert blk["questions_with_other_n"] == 1 and blk["questions_with_other_n_ids"] == ["A/q1"]
    assert sorted(blk["pass@k"], key=int) == ["1", "2"] and blk["ks_skipped"] == [4, 8]
    assert "samples per question vary" in format_summary_markdown(summarize(recs, n_boot=20))


def test_grading_timeouts_counted_per_benchmark_and_shown_when_not_zero():
    recs = [record("A", "q0", s, s == 0, extra={"grade": "timeout" if s in (1, 2) else "ok"}) for s in range(4)]
    recs += [record("B", "q1", s, True, extra={"grade": "ok"}) for s in range(4)]
    s = summarize(recs, n_boot=20)
    assert s["benchmarks"]["A"]["grading_timeouts"] == 2 and s["benchmarks"]["B"]["grading_timeouts"] == 0
    assert s["micro"]["grading_timeouts"] == 2
    md = format_summary_markdown(json.loads(json.dumps(s)))
    assert "A: 2 samples hit the grading limit twice" in md and md.count("hit the grading limit") == 1
    clean = format_summary_markdown(summarize(recs[4:], n_boot=20))
    assert "grading limit" not in clean


def test_pass_at_n_with_uneven_counts_is_any_success_over_samples_present():
    """Issue 12 item 7: a partial run (q0 has 4 samples, q1 only 2) must not report pass@2 as pass@n.
    q0's only success is its 4th sample: pass@2 of q0 is 1/2, but pass@n (any success) is 1."""
    recs = [record("A", "q0", s, s == 3) for s in range(4)] + [record("A", "q1", s, False) for s in range(2)]
    recs += [record("B", "q2", s, s == 1) for s in range(4)]
    s = summarize(recs, n_boot=50)
    blk = s["benchmarks"]["A"]
    assert blk["n_varies"] and (blk["n_min"], blk["n_max"]) == (2, 4)
    assert blk["pass@n"] == 0.5  # any success: q0 yes, q1 no (pass@min(n) would give 0.25)
    assert blk["pass@k"]["2"] == pytest.approx(0.25)  # pass@2 stays the unbiased estimator
    assert s["micro"]["pass@n"] == pytest.approx(2 / 3)
    assert s["macro"]["pass@n"] == pytest.approx((0.5 + 1.0) / 2)
    assert s["benchmarks"]["B"]["pass@n"] == 1.0 and not s["benchmarks"]["B"]["n_varies"]
    assert pass_at_n(4, 1) == pass_at_k(4, 1, 4) == 1.0 and pass_at_n(3, 0) == 0.0
    with pytest.raises(ValueError):
        pass_at_n(0, 0)
    md = format_summary_markdown(s)
    row_a = next(line for line in md.splitlines() if line.startswith("| A "))
    assert "2..4 *" in row_a  # the n column flags the uneven counts
    assert "A: samples per question vary (2..4: uneven counts" in md and "any-success rate over the samples present" in md
    assert "| B " in md and "B: samples per question vary" not in md


def test_summary_accepts_trajectories_and_is_seeded():
    task = Task("t1", "toy", "What is 1 + 1?", ["2"])
    trajs = [Trajectory(task, i, turns=[Turn("solver", "tiny-random", 0, Request("solver", []), Completion("2", prompt_tokens=5, completion_tokens=1))],
                        reward=float(i % 2 == 0), wall_s=0.1) for i in range(4)]
    a = summarize(trajs, n_boot=100, seed=1)
    assert a == summarize([t.to_dict() for t in trajs], n_boot=100, seed=1)
    assert a["micro"]["avg@n"] == 0.5 and a["micro"]["agents"]["solver"]["models"] == ["tiny-random"]
    with pytest.raises(ValueError):
        summarize([])


def test_the_reward_is_the_one_outcome_and_old_records_read_the_same():
    """Metrics and the trainer read one outcome: the reward; "correct" is derived from it. A record
    written before (only `correct`, or `correct` beside a 0/1 reward) counts exactly as it did."""
    new = [record("b", "1", i, ok) for i, ok in enumerate([True, False, True, True])]
    only_correct = [{k: v for k, v in r.items() if k != "reward"} for r in new]
    old_summary = summarize(new, n_boot=50)
    assert summarize(only_correct, n_boot=50) == old_summary and old_summary["micro"]["avg@n"] == 0.75
    back = [Trajectory.from_dict(r) for r in only_correct]
    assert [t.reward for t in back] == [1.0, 0.0, 1.0, 1.0] and [t.correct for t in back] == [True, False, True, True]
    # a partial reward (the trainer's tests use such) is not solved, and the written `correct` follows it
    partial = Trajectory.from_dict({**new[0], "reward": 0.5})
    assert (partial.correct, partial.to_dict()["correct"]) == (False, False)
    assert record_correct({"reward": 0.5, "correct": True}) is False and record_correct({"reward": 1.0}) is True
    assert summarize([partial.to_dict()] + new[1:], n_boot=50)["micro"]["avg@n"] == 0.5


def test_format_summary_markdown_after_json_round_trip():
    s = json.loads(json.dumps(summarize(unbalanced_fixture(), n_boot=100)))
    md = format_summary_markdown(s)
    assert MICRO in md and MACRO in md and "| A " in md and "| B " in md
    assert "37.5" in md and "58.3" in md  # micro 3/8 and macro 7/12 avg@n, in percent
    assert "pass@2" in md and "solver" in md


# ---------------------------------------------------------------------------------- pricing


def test_price_arithmetic_and_lookup():
    sheet = PriceSheet.from_dict({"models": {
        "qwen2.5-7b-instruct": {"input_per_1m": 0.3, "output_per_1m": 0.6},
        "self-hosted": {"gpu_hour": 2.0, "gpus": 2},
    }}, source="t.yaml")
    assert sheet.cost("qwen2.5-7b-instruct", 1_000_000, 500_000) == pytest.approx(0.3 + 0.3)
    assert sheet.cost("Qwen/Qwen2.5-7B-Instruct", 2000, 0) == pytest.approx(0.0006)
    assert sheet.cost("self-hosted", 10**9, 10**9, gpu_seconds=1800) == pytest.approx(2.0)  # 2 GPUs x 0.5 h x $2


def test_unknown_model_is_an_error_unless_default_zero():
    sheet = PriceSheet.from_dict({"models": {"a": {"input_per_1m": 1}}}, source="my.yaml")
    with pytest.raises(UserError, match=r"'mystery'.*my\.yaml"):
        sheet.cost("mystery", 1, 1)
    zero = PriceSheet.from_dict({"default": "zero", "models": {"a": {"input_per_1m": 1}}})
    assert zero.cost("mystery", 10**6, 10**6) == 0.0 and zero.unpriced == {"mystery"}
    s = summarize([record("A", "q", 0, True, turns=[turn("x", "mystery", 1, 1)])], prices=zero, n_boot=10)
    assert s["unpriced_models"] == ["mystery"]
    assert "unpriced models" in format_summary_markdown(s)


@pytest.mark.parametrize(
    "data, key",
    [
        ({"models": {"a": {"input_per_1m": -1}}}, "models.a.input_per_1m"),
        ({"models": {"a": {"input_per_1m": "cheap"}}}, "models.a.input_per_1m"),
        ({"models": {"a": {"input_per_1m": True}}}, "models.a.input_per_1m"),
        ({"models": {"a": {"input_per_1M": 1}}}, "models.a.input_per_1M"),
        ({"models": {"a": {}}}, "models.a"),
        ({"models": {"a": {"gpu_hour": 1, "gpus": 0}}}, "models.a.gpus"),
        ({"models": ["a"]}, "models"),
        ({"model": {}}, "model: unknown key; allowed: currency, default, models, note"),
        ({"default": "free", "models": {}}, "default"),
        ({"currency": "EUR", "models": {}}, "currency"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_malformed_sheet_names_the_key(data, key):
    with pytest.raises(UserError) as e:
        PriceSheet.from_dict(data, source="p.yaml")
    msg = str(e.value)
    assert key in msg and msg.startswith("p.yaml") and "\n" not in msg


def test_load_prices_files(tmp_path):
    example = load_prices(REPO / "leaderboards" / "prices.example.yaml")
    for model in ("qwen2.5-7b-instruct", "llama-3.2-3b-instruct", "smollm2-135m-instruct", "tiny-random"):
        assert example.lookup(model) is not None
    assert "ILLUSTRATIVE" in (REPO / "leaderboards" / "prices.example.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  a: {input_per_1m: 1\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_prices(bad)
    with pytest.raises(UserError, match="not found"):
        load_prices(tmp_path / "missing.yaml")


def test_report_pass_at_n_uses_the_same_any_success_rule():
    """Leaderboards compute pass@n with metrics.pass_at_n too (no silent fall to pass@min(n))."""
    from drmas_bench.report import Metric, Question, per_question_values

    qs = [Question("A", "q0", 4, 1), Question("A", "q1", 2, 0), Question("A", "q2", 4, 0)]
    vals, label, flag = per_question_values(qs, Metric("pass"), run_n=4)
    assert list(vals) == [1.0, 0.0, 0.0] and label == "pass@2..4"
    assert flag and "uneven samples per question (2..4" in flag
    vals, label, flag = per_question_values(qs[:1] + qs[2:], Metric("pass"), run_n=4)
    assert label == "pass@4" and flag is None
    vals, label, _ = per_question_values(qs, Metric("pass", 2), run_n=4)
    assert label == "pass@2" and vals[0] == pytest.approx(0.5)
