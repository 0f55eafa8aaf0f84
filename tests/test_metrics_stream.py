"""The run summary read in one pass (`drmas_bench.summary_stream`, `metrics.summarize`) against a plain
reference (`tests/metrics_reference.py`: every record held in a list, the figures computed by loops
over it) on generated runs with every field: several benchmarks and agents, known / counted /
unknown usage, engine notes, cut-off and blank replies, grading timeouts, repeated sample indices,
QA scores, env records and stored evidence, cache hits, a price sheet (with unlisted models), for
the search, math, math_4agent and toy_fixer workflows. The summaries must be the same JSON, key
order included; and the stream keeps no record."""

from __future__ import annotations

import gc
import json
import random
import weakref

import metrics_reference as R
import pytest
import yaml

from drmas_bench import compact, metrics
from drmas_bench.pricing import ModelPrice, PriceSheet
from drmas_bench.records import view
from drmas_bench.run_dir import RunDir
from drmas_bench.run_samples import selection_test
from drmas_bench.summary_stream import SummaryStream

WORKFLOWS = {"search_route": ("verifier", "searcher", "answerer"), "math_refine": ("solver", "verifier"),
             "math_4agent": ("solver", "critic", "refiner", "verifier"), "toy_fixer": ("solver", "fixer")}
TEXTS = ["<think>t</think><search>who</search>", "<think>t</think>\n<answer>Paris</answer>", "<verify>yes</verify>",
         "<verify>no</verify>", "<think>a</think><verify>approve</verify>", "<verify>reject</verify>", "\\boxed{3}",
         "so \\boxed{3", "", "   ", "中文 <answer>x</answer>", "<think>a</think><think>b</think><search>x</search>",
         "plain text", "<critique>too short</critique>", "Answer: 12", "<search>q</search><think>late</think>"]


def _turn(rng: random.Random, agent: str, step: int) -> dict:
    completion = {"text": rng.choice(TEXTS), "latency_s": round(rng.uniform(0, 3), rng.choice((1, 6))),
                  "finish": rng.choice(("stop", "stop", "length", None))}
    if rng.random() < 0.9:
        completion.update(prompt_tokens=rng.randint(1, 900), completion_tokens=rng.randint(0, 300))
    usage = rng.choice(("server", "server", "counted", "unknown", None, "odd"))
    if usage is not None:
        completion["usage"] = usage
    if rng.random() < 0.15:
        completion["notes"] = ["cut"]
    if rng.random() < 0.2:
        completion.update(cache_hit=True, cached_latency_s=rng.uniform(0, 2),
                          cached_usd=None if rng.random() < 0.2 else rng.uniform(0, 1e-3))
    completion["prompt_truncated"] = rng.random() < 0.1
    return {"agent": agent, "wg": rng.choice(("big", "small", "big")), "step": step, "valid": rng.random() < 0.8,
            "request": {"sampling": {"temperature": 0.6}}, "completion": completion}


def _extra(rng: random.Random, workflow: str) -> dict:
    extra: dict = {}
    if rng.random() < 0.6:
        extra.update(em=float(rng.random() < 0.5), f1=rng.random(), cover_em=float(rng.random() < 0.5))
    if rng.random() < 0.1:
        extra["grade"] = "timeout"
    if rng.random() < 0.5:
        extra["round1_correct"] = rng.random() < 0.5
    if workflow == "search_route" and rng.random() < 0.8:
        steps = [{"query": rng.choice(("q", None)), "done": False, "action": "x"} for _ in range(rng.randint(0, 3))]
        steps.append({"done": True, "action": rng.choice(("<answer>a</answer>", "none"))})
        extra["env"] = {"steps": steps}
    return extra


def generated_run(seed: int, workflow: str) -> list[dict]:
    """Records of a made-up run (see the module docstring), in a random order."""
    rng = random.Random(seed)
    agents = WORKFLOWS[workflow]
    recs = []
    for b in rng.sample(["nq", "hotpotqa", "aime24", "bamboogle"], rng.randint(1, 4)):
        for q in range(rng.randint(1, 6)):
            n = rng.choice((1, 2, 4, 4, 3))
            idxs = list(range(n)) + ([rng.randrange(n)] if rng.random() < 0.15 else [])
            for idx in idxs:
                reward = rng.choice((0.0, 1.0, 1.0, 0.5))
                turns = [_turn(rng, rng.choice(agents), s) for s in range(rng.randint(0, 6))]
                rec = {"task": {"id": f"{b}-{q}", "benchmark": b, "question": f"question {q}", "answers": ["Paris"]},
                       "sample_idx": idx, "turns": turns, "final_answer": rng.choice((None, "Paris", "x")),
                       "reward": reward, "extra": _extra(rng, workflow), "wall_s": rng.uniform(0, 50),
                       "cost_usd": rng.choice((0.0, rng.uniform(0, 0.01)))}
                if workflow == "search_route" and rng.random() < 0.5:
                    rec["figures"] = {"evidence": [rng.choice((True, False, None)), rng.choice((True, False))]}
                recs.append(rec)
    rng.shuffle(recs)
    return recs


def sheet(default: str = "error") -> PriceSheet:
    models = {"big": ModelPrice(input_per_1m=1.0, output_per_1m=2.0)}
    if default == "error":
        models["small"] = ModelPrice(gpu_hour=3.6)
    return PriceSheet(models, default=default)


def same(a: dict, b: dict) -> None:
    assert json.dumps(a) == json.dumps(b)  # every figure, and every key in its place


@pytest.mark.parametrize("workflow", sorted(WORKFLOWS))
@pytest.mark.parametrize("seed", range(6))
def test_the_streamed_summary_is_the_reference_summary(workflow, seed):
    recs = generated_run(seed, workflow)
    for prices in (None, "error", "zero"):
        kw = {"n_boot": 40, "seed": seed, "workflow": workflow if seed % 3 else None}
        got = metrics.summarize(recs, prices=None if prices is None else sheet(prices), **kw)
        same(got, R.summarize(recs, prices=None if prices is None else sheet(prices), **kw))
    assert metrics.summarize(recs, ks=[1, 3], n_boot=20, workflow=workflow) == R.summarize(
        recs, ks=[1, 3], n_boot=20, workflow=workflow)


@pytest.mark.parametrize("workflow", sorted(WORKFLOWS))
def test_compliance_and_effects_alone_are_the_reference(workflow):
    for seed in range(4):
        recs = generated_run(100 + seed, workflow)
        same(metrics.compliance(recs, workflow), R.compliance(recs, workflow))
        same(metrics.effects(recs, workflow), R.effects(recs, workflow))
        same(metrics.compliance(recs), R.compliance(recs))


def test_the_stream_keeps_no_record():
    for workflow in WORKFLOWS:
        stream = SummaryStream(workflow, sheet())
        refs = []
        for rec in generated_run(7, workflow):
            v = view(rec)
            refs.append(weakref.ref(v))
            stream.add(v)
            del v
        gc.collect()
        assert len(stream) == len(refs) and not [r for r in refs if r() is not None], workflow
        assert metrics.summary_of(stream, n_boot=10)["micro"]["samples"] == len(refs)


def test_a_run_directory_is_summarized_line_by_line_as_from_its_records(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_view", Path(__file__).resolve().parents[1] / "scripts" / "bench_view.py")
    B = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(B)
    run = B.scripted_search_run(tmp_path / "s", questions=10, n=2)
    config = yaml.safe_load((run / "config.yaml").read_text())
    store = RunDir(run, config)  # writes the index and the compact copy
    streamed = compact.stream_views(run, selection_test(config))
    assert streamed is not None
    same(metrics.summarize(streamed, workflow="search_route", n_boot=30),
         metrics.summarize(store.compact_views(), workflow="search_route", n_boot=30))
    store.close()
    size = (run / "samples.jsonl").stat().st_size
    with open(run / "samples.jsonl", "a") as f:  # a line the index does not cover yet: no stream
        f.write("garbage\n")
    assert compact.stream_views(run, selection_test(config)) is None
    with open(run / "samples.jsonl", "r+") as f:
        f.truncate(size)
    assert compact.stream_views(run, selection_test(config)) is not None
    with open(run / "samples.jsonl", "a") as f:  # the same sample again: the last copy must win, so no stream
        f.write((run / "samples.jsonl").read_text().splitlines()[0] + "\n")
    RunDir(run, config).close()
    assert compact.stream_views(run, selection_test(config)) is None
