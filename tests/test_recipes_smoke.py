"""Every shipped paper recipe (trainer/recipes/*.yaml but the CI-sized tiny and tiny_single, which
have their own tests) runs one step as shipped on its training data, shrunk only in size:
``tiny-random`` on CPU with hf engines, 2 prompts x 2 rollouts, 8 new tokens; the search recipe
with the in-process BM25 index of the mini corpus. Then ``drmas-bench eval --model <checkpoint>``
evaluates the trained team. A paper row whose shrunk config equals another row's but for its name
and plan figures (the 8B and 7B rows: the same settings as the 4B and 3B rows on other GPUs) is
checked to be so instead of training the same step again; so is a grad-clip ablation row against the
row it differs from in its threshold alone. Precision stays as shipped (bfloat16: the engines run bf16 weights, the
policies bf16 autocast over fp32 master weights, on CPU).

The search recipe's training set (PeterJinGo/nq_hotpotqa_train) is hub-only; offline, the test saves
a few real questions (NQ dev, HotpotQA train) in that dataset's Parquet layout as
``<data dir>/qa/nq_hotpotqa_train/train.parquet``, the local copy the registry reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from drmas_bench.cli import main
from drmas_trainer.config.train import RECIPES_DIR

pytestmark = [pytest.mark.slow, pytest.mark.data]

# the CPU recipes on the toy task run whole elsewhere (.ci/run's tiny phase, tests/test_trainer*.py,
# tests/test_toy_fixer.py, tests/test_hetero.py); search_warmstart is a warm-start-only recipe on its own generated examples
# (tests/test_warmstart.py, scripts/make_search_warmstart.py); a recipe with per-agent models (the
# heterogeneous paper row) is not shrunk by `model=tiny-random`: its tiny counterpart trains in CI instead,
# and its plan is checked in tests/test_paper_rows.py
RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")
                 if p.stem not in ("tiny", "tiny_single", "tiny_lora", "tiny_fixer", "tiny_4agent", "tiny_hetero", "smollm2_toy",
                                   "search_warmstart")
                 and not any("model" in (a or {}) for a in (yaml.safe_load(p.read_text()).get("agents") or {}).values()))

# the shrink: sizes and the CPU engine only (engine_options are the sglang engine's, so they go too)
SHRINK = ["model=tiny-random", "device=cpu", "agent_defaults.engine=hf", "agent_defaults.engine_options={}",
          "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=8", "data.limit=4",
          # 4 trajectories cannot fill the search recipe's 5 mini-batches (refused since the range checks)
          "algo.mini_batches=2",
          # the paper rows shard each group over their node's GPUs (fsdp.ranks); one process here
          "fsdp.ranks=1"]
#: a paper row whose shrunk run is another row's, step for step: the rows differ in the model (one
#: tiny-random here) and the plan's figures (GPUs, reported hours), which no step reads. Each is checked
#: to be that (test below) instead of training the same step twice.
SAME_ONCE_SHRUNK = {"math_qwen3_8b": "math_qwen3_4b", "math_qwen3_8b_shared": "math_qwen3_4b_shared",
                    "search_qwen2.5_7b": "search_qwen2.5_3b", "search_qwen2.5_7b_shared": "search_qwen2.5_3b_shared",
                    "math_qwen3_1.7b_80gb": "math_qwen3_4b_1gpu"}
#: a row whose shrunk run is another row's but for one number that no code path branches on (the
#: grad-clip ablation's thresholds): checked to differ in exactly that key, the path trained once
SAME_BUT_ONE_NUMBER = {"math_qwen3_4b_gradclip_0.2": ("math_qwen3_4b_gradclip_0.1", "agent_defaults.grad_clip", 0.2),
                       "math_qwen3_4b_gradclip_0.5": ("math_qwen3_4b_gradclip_0.1", "agent_defaults.grad_clip", 0.5)}
EVAL_ON = {"math_refine": ("math", "aime24"), "math_4agent": ("math", "aime24"), "search_route": ("search", "hotpotqa"), "toy": ("toy", "toy")}


def test_every_shipped_recipe_is_covered():
    assert {"math_qwen3_4b", "math_qwen3_4b_shared", "search_qwen2.5_7b"} <= set(RECIPES)


@pytest.fixture(scope="module")
def sampled_dir(data_dir, tmp_path_factory):
    """The reference's sampled validation sets, built once from the shared data (which stays read-only)."""
    out = tmp_path_factory.mktemp("sampled")
    assert main(["data", "prepare", "--sampled", "--data-dir", str(data_dir), "--out", str(out)]) == 0
    return out


def _shrunk(recipe: str) -> dict:
    """The recipe's whole config as this test trains it, less its name and the plan section."""
    from drmas_trainer.config.train import load_config, parse_override

    cfg = load_config(recipe, dict(parse_override(s) for s in SHRINK)).model_dump(mode="json")
    del cfg["recipe"], cfg["plan"]
    return cfg


@pytest.mark.parametrize("recipe", sorted(SAME_ONCE_SHRUNK))
def test_rows_left_out_train_as_the_row_they_name(recipe):
    assert recipe in RECIPES and SAME_ONCE_SHRUNK[recipe] in RECIPES
    assert _shrunk(recipe) == _shrunk(SAME_ONCE_SHRUNK[recipe])


@pytest.mark.parametrize("recipe", sorted(SAME_BUT_ONE_NUMBER))
def test_rows_left_out_differ_from_the_row_they_name_in_one_number(recipe):
    other, key, value = SAME_BUT_ONE_NUMBER[recipe]
    assert recipe in RECIPES and other in RECIPES
    mine, theirs = _shrunk(recipe), _shrunk(other)
    section, name = key.split(".")
    assert mine[section][name] == value and theirs[section][name] != value
    theirs[section][name] = value
    assert mine == theirs


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r not in SAME_ONCE_SHRUNK and r not in SAME_BUT_ONE_NUMBER])
def test_recipe_one_step_then_eval_the_checkpoint(recipe, data_dir, sampled_dir, tmp_path):
    from drmas_bench.retrievers import default_spec as _default_retriever_spec

    shipped = yaml.safe_load((RECIPES_DIR / f"{recipe}.yaml").read_text())
    assert shipped["data"]["source"].startswith("benchmark:"), "recipes train on registry entries"
    workflow = shipped["workflow"]
    train_dir = data_dir
    sets = list(SHRINK)
    if workflow == "search_route":
        from test_train_sets import write_search_train  # tests/ is on sys.path (rootdir conftest)

        train_dir = tmp_path / "data"
        write_search_train(data_dir, train_dir, n=2)
        sets.append(f"retriever={_default_retriever_spec(data_dir)}")
    if shipped.get("val"):  # validated as the reference does: its sampled set, here its first 2 questions
        sets += [f"val.data={sampled_dir}", "val.limit=2"]
    run = tmp_path / "run"
    argv = ["train", "--recipe", recipe, "--out", str(run), "--steps", "1", "--local", "--no-progress",
            "--data-dir", str(train_dir)]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0

    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    if shipped.get("val"):  # before training (step 0) and at the last step, each a run folder of 2 questions
        assert [r["step"] for r in recs] == [0, 1] and recs[0]["val/questions"] == recs[1]["val/questions"] == 2
        assert all((run / "val" / f"step_{k}" / "summary.json").is_file() for k in (0, 1))
        bench = shipped["val"]["benchmarks"][0]  # logged per data source too, as the reference logs it
        assert {k.split("/")[1] for k in recs[0] if k.endswith("/test_score")} - {bench}
        recs = recs[1:]
    assert [r["step"] for r in recs] == [1] and len(recs[0]["tasks"]) == 2
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["data"]["source"] == shipped["data"]["source"]
    assert cfg["agent_defaults"]["dtype"] == shipped["agent_defaults"]["dtype"]  # bf16 as shipped, on CPU
    ckpt = run / "ckpt" / "step_1"
    team = yaml.safe_load((ckpt / "team.yaml").read_text())
    assert team["workflow"] == workflow and team["trained"]["recipe"] == recipe
    lora = bool(shipped["agent_defaults"].get("lora"))  # a LoRA group's folder: base.json + one adapter per agent
    for wg in team["worker_groups"]:
        assert (ckpt / "models" / wg / ("base.json" if lora else "model.safetensors")).is_file()
    if lora:
        assert {p.parent.name for p in (ckpt / "models").glob("*/*/adapter_model.safetensors")} == set(team["agents"])
    one_group = shipped.get("shared") or shipped.get("shared_base")
    assert len(team["worker_groups"]) == (1 if one_group else len(team["agents"]))

    suite, bench = EVAL_ON[workflow]
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(run / "ckpt" / "latest"), "--suite", suite, "--benchmarks", bench,
                 "--limit", "2", "--n", "1", "--max-new-tokens", "8", "--data-dir", str(data_dir),
                 "--out", str(out), "--no-progress"]) == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all(s["turns"] for s in samples)
    assert (out / "summary.md").is_file()
