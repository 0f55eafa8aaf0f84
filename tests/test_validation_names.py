"""The names a validation carries: the leaderboard of RUN/val names each row's model
`model@step_N`, its step, the estimator and the training run; a team is heterogeneous only when its
groups start from different base models; `view` of a training run points to `train-report`.

The validation here is a real eval run on a real engine (tiny-random), run by ``run_on_engines`` with
the identity models the trainer's validation records (trainer.validation.live_models: name, weights,
run, step); the training run folder holds the config.yaml a training run writes (its `algo`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from drmas_bench.api import EvalConfig, plan, run_on_engines
from drmas_bench.cli import main
from drmas_bench.engines import make_engine
from drmas_bench.report.runs import Run, load_run


def test_a_validation_row_names_model_at_step_its_step_estimator_and_training_run(tmp_path, capsys):
    train = tmp_path / "tinyrun"
    train.mkdir()
    (train / "config.yaml").write_text(yaml.safe_dump({"workflow": "toy", "model": "tiny-random",
                                                       "algo": {"estimator": "drmas"}}), encoding="utf-8")
    (train / "metrics.jsonl").write_text("", encoding="utf-8")
    out = train / "val" / "step_3"
    p = plan(EvalConfig(model="tiny-random", suite="toy", limit=2, n=1, max_new_tokens=4, progress=False, out=str(out)))
    models = {"shared": {"name": "tiny-random@step_3", "weights": "the training run's engines after step 3",
                         "run": str(train), "step": 3}}
    asyncio.run(run_on_engines(p, {"shared": make_engine("hf", "tiny-random", max_batch=8)}, models=models))
    r = load_run(out)
    assert (r.model_label, r.step, r.estimator, r.training_run, r.name) == (
        "tiny-random@step_3", 3, "drmas", str(train), "tinyrun/step_3")
    assert main(["leaderboard", str(train / "val"), "--out", str(tmp_path / "lb")]) == 0
    row = next(line for line in (tmp_path / "lb" / "leaderboard.md").read_text().splitlines() if "tinyrun/step_3" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["tinyrun/step_3", "tiny-random@step_3", "shared", "drmas", "3"]
    capsys.readouterr()
    assert main(["view", str(train)]) == 2  # a training run: one line pointing to train-report
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"drmas-bench train-report {train}" in err


def _run(models: dict[str, str], bases: dict[str, str] | None) -> Run:
    team = {"agents": {"solver": "solver", "checker": "checker"},
            "worker_groups": {wg: {"model": m, "engine": "hf"} for wg, m in models.items()}}
    return Run(path=Path("x"), name="x", config={}, records=[], suite="toy", workflow="toy", n=1,
               benchmarks=["toy"], team=team, sampling={}, base_models=bases)


def test_heterogeneous_only_when_the_base_models_differ():
    copies = {"solver": "/r/ckpt/step_2/models/solver", "checker": "/r/ckpt/step_2/models/checker"}
    assert _run(copies, {"solver": "tiny-random", "checker": "tiny-random"}).team_label == "non-shared"
    assert _run(copies, {"solver": "tiny-random", "checker": "tiny-random-llama"}).team_label == "non-shared, heterogeneous"
    assert _run({"solver": "tiny-random", "checker": "tiny-random-llama"}, None).team_label == "non-shared, heterogeneous"
