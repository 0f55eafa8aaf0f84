"""Validation during training (drmas_trainer.validation): the harness's evaluation run on
engines the caller holds (`api.run_on_engines`), the logged names, the best step, the config; and,
end to end, micro runs of the tiny recipes whose validations equal a plain `eval --model
RUN/ckpt/step_N` (no engine flag: the checkpoint carries its engines' dtype) record for record."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from drmas_bench.api import EvalConfig, evaluate, plan, run_on_engines
from drmas_bench.types import UserError
from drmas_trainer.config.train import load_config
from drmas_bench.records import RecordView
from drmas_trainer.validation import best_step, due, source_scores, val_metrics

CLOCK = ("wall_s", "latency_s")  # the fields a re-run may change; `run` names the run (its identity)


def comparable(run: Path) -> dict[tuple, dict]:
    """A run's records by (task, sample), without their clock fields and run stamp."""
    out = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("run")
        r.pop("wall_s")
        for t in r["turns"]:
            t["completion"].pop("latency_s")
        out[(r["task"]["id"], r["sample_idx"])] = r
    return out


# ----------------------------------------------------------------------------------------- pure parts


def test_due_every_n_steps_and_at_the_last():
    assert [s for s in range(1, 9) if due(SimpleNamespace(every=3), s, 8)] == [3, 6, 8]
    assert not any(due(SimpleNamespace(every=0), s, 8) for s in range(1, 9))  # every 0: never


def test_config_needs_benchmarks_and_a_validation_metric():
    with pytest.raises(UserError, match="val: validation .* needs benchmarks"):
        load_config("tiny", {"val.before_train": True, "val.benchmarks": None})
    with pytest.raises(UserError, match="keep_best"):
        load_config("tiny", {"val.every": 2, "val.benchmarks": "toy", "val.keep_best": "critic/score/mean"})
    assert load_config("tiny", {"val.every": 2, "val.benchmarks": "toy,toy"}).val.benchmarks == ["toy", "toy"]
    with pytest.raises(UserError, match="val.benchmarks: .*unknown benchmark 'toyy'"):
        load_config("tiny", {"val.benchmarks": "toyy"})


def test_val_metrics_names_from_a_summary():
    summary = {
        "benchmarks": {"a": {"n": 4, "n_max": 4, "avg@n": 0.5, "pass@k": {"1": 0.5, "2": 0.7, "4": 0.9}},
                       "b": {"n": 4, "n_max": 4, "avg@n": 0.25, "pass@k": {"1": 0.25, "4": 0.5}}},
        "micro": {"n_max": 4, "avg@n": 0.4, "pass@k": {"1": 0.4, "4": 0.8}, "questions": 10, "samples": 40,
                  "usage": {"calls": 77}, "agents": {"solver": {"calls_per_traj": 1.5}}},
        "macro": {"avg@n": 0.375, "pass@n": 0.7},
        "compliance": {"agents": {"solver": {"valid_rate": 0.9}}},
    }
    rec = val_metrics(summary, {"a": 0.55})
    assert rec["val/a/avg@4"] == 0.5 and rec["val/a/pass@4"] == 0.9 and rec["val/a/pass@2"] == 0.7
    assert rec["val-core/a/reward/mean@4"] == 0.5 and rec["val/a/test_score"] == 0.55
    assert "val/b/test_score" not in rec and rec["val/b/avg@4"] == 0.25
    assert rec["val/avg@4"] == 0.4 and rec["val/pass@4"] == 0.8
    assert rec["val/macro/avg@4"] == 0.375 and rec["val/macro/pass@4"] == 0.7
    assert rec["val/agent/solver/valid/mean"] == 0.9 and rec["val/agent/solver/num_calls/mean"] == 1.5
    assert rec["val/calls"] == 77 and rec["val/questions"] == 10 and rec["val/samples"] == 40


def test_scores_per_data_source_as_the_reference_logs_them():
    """A sampled set's questions carry their data source: test_score (each trajectory weighted by its
    calls) and the mean reward per source, against a plain loop on random records; a benchmark whose
    questions name no source (or their own) gets no source entry."""
    import random

    rng = random.Random(7)
    recs = []
    for i in range(60):
        src = rng.choice(["math500_first50", "aime24", "aime25", None])
        bench = "plain" if src is None else "math_sampled"
        recs.append({"task": {"id": f"q{i % 20}", "benchmark": bench, "meta": {"data_source": src} if src else {}},
                     "sample_idx": i // 20, "reward": float(rng.random() < 0.4),
                     "turns": [{"agent": "solver"}] * rng.randint(1, 3)})
    bench_scores, sources = source_scores(RecordView.of(r) for r in recs)
    for key, pick in [("plain", lambda r: r["task"]["benchmark"] == "plain"),
                      ("math_sampled", lambda r: r["task"]["benchmark"] == "math_sampled")]:
        rows = [(r["reward"], len(r["turns"])) for r in recs if pick(r)]
        assert bench_scores[key] == pytest.approx(sum(w * c for w, c in rows) / sum(c for _, c in rows))
    assert set(sources) == {"math500_first50", "aime24", "aime25"}
    for src, got in sources.items():
        mine = [r for r in recs if r["task"]["meta"].get("data_source") == src]
        calls = sum(len(r["turns"]) for r in mine)
        assert got["test_score"] == pytest.approx(sum(r["reward"] * len(r["turns"]) for r in mine) / calls)
        assert got["mean"] == pytest.approx(sum(r["reward"] for r in mine) / len(mine))
    rec = val_metrics({"benchmarks": {}, "micro": {}}, bench_scores, sources)
    assert rec["val/aime24/test_score"] == sources["aime24"]["test_score"]
    n = int(sources["aime24"]["n"])
    assert rec[f"val-core/aime24/reward/mean@{n}"] == rec[f"val/aime24/avg@{n}"] == sources["aime24"]["mean"]


def test_best_step_is_the_highest_and_the_earliest_on_a_tie():
    hist = {0: {"val/avg@1": 0.2}, 2: {"val/avg@1": 0.5}, 4: {"val/avg@1": 0.5}, 6: {"val/avg@1": float("nan")}}
    assert best_step(hist, "val/avg@1") == {"step": 2, "metric": "val/avg@1", "value": 0.5, "run": "val/step_2"}
    assert best_step({}, "val/avg@1") is None
    with pytest.raises(UserError, match="no validation logged 'val/x'.*val/avg@1"):
        best_step(hist, "val/x")


# ----------------------------------------------------------------------------------------- the harness part


def test_run_on_engines_gives_the_records_of_evaluate(tmp_path):
    """The same plan run by `evaluate` (its own pool) and by `run_on_engines` on an engine this test
    holds: the same records (clock fields aside), and the engine is left open."""
    from drmas_bench.engines import make_engine

    cfg = EvalConfig(model="tiny-random", suite="toy", limit=3, n=2, max_new_tokens=8, progress=False)
    ref = evaluate(EvalConfig(**{**cfg.__dict__, "out": str(tmp_path / "ref")}))
    engine = make_engine("hf", "tiny-random", max_batch=32)
    p = plan(EvalConfig(**{**cfg.__dict__, "out": str(tmp_path / "held")}))
    models = {"shared": {"name": "held@step_7"}}
    got = asyncio.run(run_on_engines(p, {"shared": engine}, models=models))
    assert comparable(tmp_path / "held") == comparable(tmp_path / "ref")
    assert got["micro"]["avg@n"] == ref["micro"]["avg@n"] and got["pool"] == {"pool": "engines held by the caller"}
    stamp = json.loads((tmp_path / "held" / "samples.jsonl").read_text().splitlines()[0])["run"]
    assert stamp["models"] == {"shared": "held@step_7"}  # the identity names the engines' weights
    again = asyncio.run(run_on_engines(plan(EvalConfig(**{**cfg.__dict__, "out": str(tmp_path / "again")})), {"shared": engine}))
    assert again["micro"]["avg@n"] == ref["micro"]["avg@n"]  # the engine was left open, and it runs the same again
    with pytest.raises(UserError, match="no engine for worker group"):
        asyncio.run(run_on_engines(p, {}))


# ----------------------------------------------------------------------------------------- end to end

# a micro run: a short warm start, one RL step of 2 prompts x 4, validated before it and after it
MICRO = ["sft.steps=6", "sft.agent_steps={checker: 3}", "sft.batch_size=8", "rollout.prompts_per_step=2",
         "rollout.n=4", "data.size=40", "agent_defaults.micro_batch_size=16", "save_every=0"]
VAL = ["val.before_train=true", "val.every=1", "val.benchmarks=toy", "val.limit=8", "val.n=2",
       "val.keep_best=val/avg@2"]


def _recipe_engine_dtype(recipe: str) -> str:
    """The rollout engines' dtype as the recipe file declares it (read here, not through the trainer)."""
    import yaml

    import drmas_trainer

    doc = yaml.safe_load((Path(drmas_trainer.__file__).parent / "recipes" / f"{recipe}.yaml").read_text())
    return doc["agent_defaults"]["engine_options"]["dtype"]


@pytest.mark.parametrize("recipe", ["tiny", "tiny_hetero"])
def test_validation_is_a_plain_eval_of_its_checkpoint(tmp_path, recipe, caplog):
    """A micro run of the tiny recipes (bf16 rollout engines, fp32 trainers) validating before its
    one RL step and after it: `eval --model RUN/ckpt/step_1` with no engine flag gives the records of
    the validation at step 1 (the checkpoint carries its engines' dtype, and eval says it used it);
    each validation is a run folder the viewer and leaderboard open, the step log carries the names,
    and the best step has its checkpoint and `ckpt/best`."""
    from drmas_bench.cli import main

    run = tmp_path / "run"
    args = ["train", "--recipe", recipe, "--local", "--steps", "1", "--no-progress", "--out", str(run)]
    for s in MICRO + VAL:
        args += ["--set", s]
    assert main(args) == 0
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1] and "critic/score/mean" not in recs[0]
    for r in recs:
        assert r["val/run"] == f"val/step_{r['step']}" and r["val/samples"] == 16 and r["val/calls"] >= 32
        assert 0 <= r["val/toy/avg@2"] <= r["val/toy/pass@2"] <= 1 and r["timing_s/testing"] > 0
        assert r["val-core/toy/reward/mean@2"] == r["val/toy/avg@2"] and math.isfinite(r["val/toy/test_score"])
        assert {"val/agent/solver/valid/mean", "val/agent/checker/num_calls/mean"} <= set(r)
    best = max(recs, key=lambda r: (r["val/avg@2"], -r["step"]))["step"]
    ck = run / "ckpt"
    assert (ck / "best").resolve().name == f"step_{best}" and (ck / f"step_{best}" / "COMPLETE").is_file()
    out = tmp_path / "eval"
    caplog.set_level("INFO", logger="drmas_bench")
    assert main(["eval", "--model", str(ck / "step_1"), "--benchmarks", "toy", "--limit", "8", "--n", "2",
                 "--seed", "0", "--out", str(out), "--no-progress"]) == 0
    ours, theirs = comparable(run / "val" / "step_1"), comparable(out)
    assert len(ours) == 16 and ours == theirs
    dtype = _recipe_engine_dtype(recipe)
    assert f"engine options from the checkpoint: dtype={dtype}" in caplog.text
    assert main(["view", str(run / "val" / "step_1"), "--out", str(tmp_path / "v.html")]) == 0
    assert main(["leaderboard", str(run / "val"), "--out", str(tmp_path / "lb")]) == 0  # every validation, a row each
    board = " ".join((tmp_path / "lb" / "leaderboard.md").read_text().split())
    for s in (0, 1):  # model@step_N, the step, the estimator, the training run
        row = f"| run/step_{s} | tiny-random@step_{s} | non-shared | drmas | {s} |" if recipe == "tiny" else \
            f"-llama@step_{s} | non-shared, heterogeneous | drmas | {s} |"  # two base models
        assert row in board, (row, board)


def test_plot_takes_the_validations_of_a_step_log():
    from drmas_trainer.reports.plot import validation_points

    recs = [{"step": 0, "val/avg@1": 0.3, "val/avg@4": 0.4}, {"step": 1, "critic/score/mean": 0.2},
            {"step": 2, "val/avg@4": 0.5}, {"step": 3, "val/avg@4": None}]
    assert validation_points(recs) == ("val/avg@4", [(0, 0.4), (2, 0.5)])
    assert validation_points([{"step": 1, "critic/score/mean": 0.2}]) is None
