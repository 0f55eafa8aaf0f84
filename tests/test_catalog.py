"""The benchmark registry and `drmas-bench data` against the real files (skipped without them)."""

from __future__ import annotations

import json
import shutil

import pytest

from drmas_bench.cli import main
from drmas_bench.benchmarks import BENCHMARKS, known_names, load_tasks, select_benchmarks
from drmas_bench.benchmarks.catalog import get_benchmark
from drmas_bench.suites.toy.benchmarks import make_toy_tasks
from drmas_bench.types import UserError

PAPER_BENCHMARKS = {
    "math": ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"],
    "search": ["nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle"],
}


def test_registry_knows_all_thirteen_plus_toy():
    names = known_names()
    for suite, benches in PAPER_BENCHMARKS.items():
        assert [b.name for b in select_benchmarks(suite, None)] == benches
    assert "toy" in names and len([n for n in names if BENCHMARKS[n].split == "test"]) == 14
    # training sets are registry entries too, never in a suite's default selection
    assert {n for n in names if BENCHMARKS[n].split == "train"} == {"dapo_math_17k", "nq_hotpotqa_train"}


@pytest.mark.data
@pytest.mark.parametrize("name", PAPER_BENCHMARKS["math"] + PAPER_BENCHMARKS["search"])
def test_every_benchmark_loads_from_local_dir(name, data_dir):
    b = get_benchmark(name)  # loads the registry: BENCHMARKS alone is empty until something does
    tasks = load_tasks(name, data_dir)
    expected = 1000 if name == "popqa" else b.expected_rows  # PopQA: the 1,000-row subset is what exists
    assert len(tasks) == expected
    assert len({t.id for t in tasks}) == len(tasks), "ids must be unique"
    assert all(t.benchmark == name and t.question.strip() and t.answers and all(t.answers) for t in tasks)
    # a round trip through the record format keeps every field
    assert [type(t).from_dict(t.to_dict()) for t in tasks[:5]] == tasks[:5]


@pytest.mark.data
def test_known_answers(data_dir):
    assert load_tasks("aime24", data_dir)[0].answers == ["204"]
    assert load_tasks("amc23", data_dir)[0].answers == ["27"]  # stored as 27.0
    assert load_tasks("minerva", data_dir)[0].answers == ["1.6"]  # from test_with_answer.jsonl
    assert load_tasks("popqa", data_dir)[0].answers[:2] == ["politician", "political leader"]
    assert load_tasks("hotpotqa", data_dir, limit=3)[0].answers == ["yes"]
    assert len(load_tasks("triviaqa", data_dir, limit=30)) == 30


def test_toy_suite_is_deterministic():
    a, b = make_toy_tasks(50, seed=7), make_toy_tasks(50, seed=7)
    assert a == b
    assert make_toy_tasks(50, seed=8) != a
    for t in a:
        x, y = t.meta["a"], t.meta["b"]
        assert t.question == f"What is {x} + {y}?" and t.answers == [str(x + y)]
    assert load_tasks("toy") == load_tasks("toy")


def test_unknown_names_give_one_line(capsys):
    with pytest.raises(UserError, match="known: aime24, aime25"):
        load_tasks("nosuch")
    assert main(["data", "show", "nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nosuch" in err and "hotpotqa" in err
    with pytest.raises(UserError, match="not in suite"):
        select_benchmarks("math", "nq")
    with pytest.raises(UserError, match="unknown suite"):
        select_benchmarks("chess", None)


def test_corrupt_row_names_file_and_line(tmp_path):
    d = tmp_path / "data"
    (d / "math" / "aime24").mkdir(parents=True)
    f = d / "math" / "aime24" / "test.jsonl"
    f.write_text(json.dumps({"id": 1, "problem": "1+1?", "answer": "2"}) + "\n{not json\n")
    with pytest.raises(UserError, match=r"test.jsonl:2: malformed JSON"):
        load_tasks("aime24", d)
    f.write_text(json.dumps({"id": 1, "problem": "1+1?", "answer": "2"}) + "\n\n" + json.dumps({"id": 2, "problem": "x"}) + "\n")
    with pytest.raises(UserError, match=r"test.jsonl:3: cannot read a aime24 record"):
        load_tasks("aime24", d)


def test_offline_without_local_copy_explains_both_fixes(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("DRMAS_DATA_DIR", raising=False)
    with pytest.raises(UserError) as e:
        load_tasks("math500", tmp_path)
    msg = str(e.value)
    assert "math500" in msg and "--data-dir" in msg and "HuggingFaceH4/MATH-500" in msg and "\n" not in msg


@pytest.mark.data
def test_data_check_cli(data_dir, tmp_path, capsys):
    # the shipped data has every evaluation benchmark: the default check passes, and the training
    # sets are shown in their own section (the search mix is hub-only here)
    assert main(["data", "check", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    evals, train = out.split("training sets", 1)
    assert "PARTIAL" in evals and "nq_hotpotqa_train" not in evals and "dapo_math_17k" not in evals
    assert "nq_hotpotqa_train" in train and "MISSING" in train and "dapo_math_17k" in train
    assert "all 14 present evaluation benchmarks are valid" in out and "MISSING locally" not in out
    # --train counts the training sets: the missing mix fails the check...
    assert main(["data", "check", "--data-dir", str(data_dir), "--train"]) == 1
    out = capsys.readouterr().out
    assert "MISSING locally (1): nq_hotpotqa_train" in out and "--allow-missing" in out
    # ...unless a partial set is what the user means
    assert main(["data", "check", "--data-dir", str(data_dir), "--train", "--allow-missing"]) == 0
    out = capsys.readouterr().out
    assert "all 15 present benchmarks and training sets are valid" in out  # 14 + DAPO-Math-17k
    assert main(["data", "check", "--data-dir", str(data_dir), "--suite", "math", "--train"]) == 0  # a complete suite
    capsys.readouterr()
    # an evaluation benchmark missing fails the default check (a missing training set does not)
    part = tmp_path / "part"
    shutil.copytree(data_dir / "math", part / "math", ignore=shutil.ignore_patterns("dapo_math_17k"))
    (part / "math" / "amc23" / "test.jsonl").unlink()
    assert main(["data", "check", "--data-dir", str(part), "--suite", "math"]) == 1
    out = capsys.readouterr().out
    assert "MISSING locally (1): amc23" in out and "dapo_math_17k missing" in out
    # a copy with a duplicated id is reported invalid and exits 1
    bad = tmp_path / "bad"
    shutil.copytree(data_dir / "math" / "aime24", bad / "math" / "aime24")
    f = bad / "math" / "aime24" / "test.jsonl"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines + [lines[0]]) + "\n")
    assert main(["data", "check", "--data-dir", str(bad), "--suite", "math"]) == 1
    out = capsys.readouterr().out
    assert "duplicate ids" in out and "MISSING locally" in out


@pytest.mark.data
def test_data_check_reports_golds_that_normalise_to_empty(data_dir, capsys):
    """`The The`, `!!!`, `A+` ... are real golds that normalise to nothing (grade_qa matches them by
    their spelling, `!!!` by its characters): the check lists them per benchmark without failing it."""
    assert main(["data", "check", "--data-dir", str(data_dir), "--suite", "search", "--allow-missing"]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line.startswith("search ")}
    assert "2 golds normalise to empty" in rows["hotpotqa"] and "0 tasks have no matchable gold" in rows["hotpotqa"]
    assert "'The The'" in rows["hotpotqa"] or "'!!!'" in rows["hotpotqa"]
    assert "4 golds normalise to empty" in rows["nq"] and "0 tasks have no matchable gold" in rows["nq"]
    assert "5 golds normalise to empty" in rows["triviaqa"] and "0 tasks have no matchable gold" in rows["triviaqa"]
    assert "normalise to empty" not in rows["bamboogle"]
