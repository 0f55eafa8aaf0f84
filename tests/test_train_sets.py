"""Training sets in the benchmark registry (split ``train``): DAPO-Math-17k from the data dir, the
Search-R1 NQ + HotpotQA mix from a local Parquet copy in the hub's layout, the offline error, and the
trainer's ``data.source: benchmark:NAME``."""

from __future__ import annotations

import json

import pytest

from drmas_bench.benchmarks import BENCHMARKS, known_names, load_tasks, select_benchmarks
from drmas_bench.suites.math.benchmarks import _dapo_task, dapo_problem
from drmas_bench.benchmarks.loaders import normalize_question
from drmas_bench.types import UserError


def test_training_sets_are_registry_entries_outside_the_suites():
    known_names()  # loads the suite modules
    assert BENCHMARKS["dapo_math_17k"].split == "train" and BENCHMARKS["dapo_math_17k"].suite == "math"
    assert BENCHMARKS["nq_hotpotqa_train"].split == "train" and BENCHMARKS["nq_hotpotqa_train"].family == "qa"
    assert "dapo_math_17k" not in [b.name for b in select_benchmarks("math", None)]
    assert "nq_hotpotqa_train" not in [b.name for b in select_benchmarks("search", None)]
    # by name they are selectable like any benchmark (e.g. to evaluate on training prompts)
    assert [b.name for b in select_benchmarks("math", "dapo_math_17k")] == ["dapo_math_17k"]


@pytest.mark.data
def test_dapo_loads_from_the_data_dir(data_dir):
    known_names()
    tasks = load_tasks("dapo_math_17k", data_dir)
    assert len(tasks) == BENCHMARKS["dapo_math_17k"].expected_rows == 17917
    assert len({t.id for t in tasks}) == len(tasks)
    assert tasks[0].answers == ["34"] and tasks[0].question.startswith("In triangle $ABC$")
    assert all(t.benchmark == "dapo_math_17k" and t.question and t.answers[0] for t in tasks)
    assert len(load_tasks("dapo_math_17k", data_dir, limit=5)) == 5


def test_dapo_hub_rows_lose_the_answer_format_instruction():
    hub_row = {"data_source": "math_dapo", "prompt": [{"role": "user", "content":
               "Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nWhat is $1+1$?"
               "\n\nRemember to put your answer on its own line after \"Answer:\"."}],
               "reward_model": {"ground_truth": "2", "style": "rule"}, "extra_info": {"index": "abc-1"}}
    t = _dapo_task(hub_row, 0, "dapo_math_17k")
    assert (t.id, t.question, t.answers, t.meta) == ("abc-1", "What is $1+1$?", ["2"], {"data_source": "math_dapo"})
    assert dapo_problem("  Plain problem.  ") == "Plain problem."
    with pytest.raises(ValueError, match="empty answer"):
        _dapo_task({**hub_row, "reward_model": {"ground_truth": " "}}, 0, "dapo_math_17k")


def _search_r1_rows(data_dir, n: int = 3) -> list[dict]:
    """Rows in PeterJinGo/nq_hotpotqa_train's layout, built from real questions of the data dir."""
    nq = [json.loads(line) for line in (data_dir / "qa" / "nq" / "dev.jsonl").open() if line.strip()][:n]
    hp = [json.loads(line) for line in (data_dir / "corpus" / "covered_questions.jsonl").open()
          if '"hotpotqa"' in line and '"train"' in line][:n]
    rows = []
    for src, recs in (("nq", nq), ("hotpotqa", hp)):
        for i, r in enumerate(recs):
            q = r["question"].strip()
            rows.append({"id": f"train_{i}", "question": q, "golden_answers": list(r["golden_answers"]),
                         "data_source": src, "prompt": [{"role": "user", "content": f"Answer: {q}"}],
                         "ability": "fact-reasoning",
                         "reward_model": {"style": "rule", "ground_truth": {"target": list(r["golden_answers"])}},
                         "extra_info": {"split": "train", "index": i}})
    return rows


def write_search_train(data_dir, out_dir, n: int = 3):
    """<out_dir>/qa/nq_hotpotqa_train/train.parquet, as the hub stores it; returns the rows."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = _search_r1_rows(data_dir, n)
    path = out_dir / "qa" / "nq_hotpotqa_train" / "train.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return rows


@pytest.mark.data
def test_search_r1_mix_from_a_local_parquet_copy(data_dir, tmp_path):
    rows = write_search_train(data_dir, tmp_path)
    tasks = load_tasks("nq_hotpotqa_train", tmp_path)
    assert [t.question for t in tasks] == [normalize_question(r["question"]) for r in rows]  # as the test data
    assert [t.answers for t in tasks] == [r["reward_model"]["ground_truth"]["target"] for r in rows]
    # ids repeat across the two sources (train_0 twice): prefixed with data_source, unique
    assert tasks[0].id == "nq_train_0" and tasks[3].id == "hotpotqa_train_0" and len({t.id for t in tasks}) == 6
    assert tasks[3].meta["data_source"] == "hotpotqa"
    # data list counts the parquet rows
    from drmas_bench.cli import main

    assert main(["data", "list", "--data-dir", str(tmp_path), "--suite", "search"]) == 0


def test_search_r1_mix_offline_is_one_line_naming_both_fixes(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as e:
        load_tasks("nq_hotpotqa_train", tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("training set nq_hotpotqa_train")
    assert "--data-dir" in msg and "qa/nq_hotpotqa_train/train.parquet" in msg and "PeterJinGo/nq_hotpotqa_train" in msg


def test_corrupt_parquet_is_one_line(tmp_path):
    p = tmp_path / "qa" / "nq_hotpotqa_train" / "train.parquet"
    p.parent.mkdir(parents=True)
    p.write_bytes(b"not parquet at all")
    with pytest.raises(UserError, match="not a readable Parquet file"):
        load_tasks("nq_hotpotqa_train", tmp_path)


@pytest.mark.data
def test_trainer_reads_training_sets_through_the_registry(data_dir, tmp_path):
    from drmas_trainer.config.train import load_config
    from drmas_trainer.prepare import load_train_tasks

    cfg = load_config("math_qwen3_4b", {"data.data_dir": str(data_dir), "data.limit": 4})
    assert cfg.data.source == "benchmark:dapo_math_17k"
    tasks = load_train_tasks(cfg)
    assert len(tasks) == 4 and tasks[0].answers == ["34"]
    write_search_train(data_dir, tmp_path, n=2)
    cfg = load_config("search_qwen2.5_7b", {"data.data_dir": str(tmp_path)})
    assert [t.id for t in load_train_tasks(cfg)] == ["nq_train_0", "nq_train_1", "hotpotqa_train_0", "hotpotqa_train_1"]
    # a verl-layout file given as a path gets a pointer to the registry, on one line
    f = tmp_path / "dapo.jsonl"
    f.write_text((data_dir / "math" / "dapo_math_17k" / "train.jsonl").open().readline())
    with pytest.raises(UserError, match=r"needs 'answers'.*benchmark:dapo_math_17k"):
        load_train_tasks(load_config("math_qwen3_4b", {"data.source": str(f)}))


def test_unknown_workflow_option_is_one_line_before_any_model_loads(tmp_path):
    from drmas_trainer.config.train import load_config
    from drmas_trainer.trainer import train

    cfg = load_config("tiny", {"workflow_options": {"rounds": 2, "no_such": 1}, "steps": 1})
    with pytest.raises(UserError, match=r"^workflow_options: unknown option\(s\) no_such for workflow 'toy'; its options: rounds$"):
        train(cfg, tmp_path / "run", use_ray=False, progress=False)


@pytest.mark.data
def test_a_retriever_that_cannot_serve_is_one_line_before_any_model_loads(data_dir, tmp_path):
    from drmas_trainer.config.train import load_config
    from drmas_trainer.trainer import train

    write_search_train(data_dir, tmp_path / "data", n=1)
    cfg = load_config("search_qwen2.5_7b", {"data.data_dir": str(tmp_path / "data"), "retriever": f"bm25:{tmp_path}/none",
                                            "rollout.prompts_per_step": 2, "steps": 1, "epochs": None})
    with pytest.raises(UserError, match=r"^retriever bm25:.*/none: index directory not found: .*--set retriever="):
        train(cfg, tmp_path / "run", use_ray=False, progress=False)
    assert not (tmp_path / "run").exists()  # nothing written


def test_duplicate_ids_in_a_training_set_are_refused_in_one_line(tmp_path):
    # two different prompts under one id would share a GRPO group: refused, naming both rows
    rows = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": f"What is {k} + 1?"}],
             "reward_model": {"ground_truth": str(k + 1)}, "extra_info": {"index": idx}}
            for k, idx in ((1, 7), (2, 8), (3, 7))]
    f = tmp_path / "math" / "dapo_math_17k" / "train.jsonl"
    f.parent.mkdir(parents=True)
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(UserError) as e:
        load_tasks("dapo_math_17k", tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "train.jsonl:3: duplicate ids in dapo_math_17k: '7'" in msg
    assert "train.jsonl:1" in msg and "GRPO group" in msg
    assert len(load_tasks("dapo_math_17k", tmp_path, limit=2)) == 2  # the rows before the repeat are fine


def test_duplicate_ids_in_a_training_task_file_are_refused_in_one_line(tmp_path):
    from drmas_trainer.config.train import load_config
    from drmas_trainer.prepare import load_train_tasks

    f = tmp_path / "tasks.jsonl"
    f.write_text("".join(json.dumps({"id": i, "question": q, "answers": [a]}) + "\n"
                         for i, q, a in (("a", "1+1?", "2"), ("b", "2+2?", "4"), ("a", "3+3?", "6"))))
    with pytest.raises(UserError) as e:
        load_train_tasks(load_config("tiny", {"data.source": str(f)}))
    msg = str(e.value)
    assert "\n" not in msg and "tasks.jsonl:3: duplicate id 'a' (already at line 1)" in msg
