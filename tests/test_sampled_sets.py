"""The reference's sampled validation sets: ``drmas-bench data prepare --sampled`` builds them from the
first rows of their sources in file order (math_sampled: the first 50 of MATH500 as
``math500_first50``, then AIME24 and AIME25 whole, 110; search_sampled: the first 30 of each of the
7 sources, 210), written in the reference's row layout, and a file in that layout (the reference's
own test_sampled.parquet) is read as it comes."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from drmas_bench.cli import main
from drmas_bench.benchmarks import benchmarks_of_suite, get_benchmark, load_tasks
from drmas_bench.benchmarks.sampled import prepare_sampled
from drmas_bench.types import UserError

MATH_PARTS = [("math500", 50, "math500_first50"), ("aime24", 30, "aime24"), ("aime25", 30, "aime25")]
SEARCH_PARTS = [(name, 30, source) for name, source in (
    ("nq", "nq"), ("triviaqa", "triviaqa"), ("popqa", "popqa"), ("hotpotqa", "hotpotqa"), ("2wiki", "2wikimultihopqa"),
    ("musique", "musique"), ("bamboogle", "bamboogle"))]


def test_sampled_sets_are_validation_sets_chosen_by_name_only():
    for name, suite in (("math_sampled", "math"), ("search_sampled", "search")):
        b = get_benchmark(name)
        assert b.split == "val" and b.kind == "validation set" and b.suite == suite and b.hub is None
        assert name not in [x.name for x in benchmarks_of_suite(suite)]  # never in `--suite S`'s selection
    assert [(s, n) for s, n, _ in get_benchmark("math_sampled").sampled.parts] == [("math500", 50), ("aime24", None),
                                                                                   ("aime25", None)]


def test_a_missing_sampled_set_says_how_to_build_it(tmp_path):
    with pytest.raises(UserError, match=r"math_sampled: no local copy .*data prepare --sampled") as e:
        load_tasks("math_sampled", tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.data
def test_prepare_builds_the_first_rows_of_each_source_in_file_order(data_dir, tmp_path, capsys):
    assert main(["data", "prepare", "--sampled", "--data-dir", str(data_dir), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "math_sampled: 110 rows (math500_first50 50, aime24 30, aime25 30)" in out
    assert "search_sampled: 210 rows" in out and "note: popqa: PARTIAL" in out
    for name, parts, rel in (("math_sampled", MATH_PARTS, "math/drmas_math/test_sampled.parquet"),
                             ("search_sampled", SEARCH_PARTS, "qa/drmas_search/test_sampled.parquet")):
        table = pq.read_table(tmp_path / rel)
        assert {"data_source", "prompt", "reward_model", "extra_info", "env_kwargs"} <= set(table.column_names)
        rows = table.to_pylist()
        got = load_tasks(name, tmp_path)
        assert len(rows) == len(got) == sum(n for _, n, _ in parts) == get_benchmark(name).expected_rows
        assert len({t.id for t in got}) == len(got)
        at = 0
        for src, n, source in parts:  # the source's first n rows, in file order, labelled with its data_source
            first = load_tasks(src, data_dir, limit=n)
            mine = got[at: at + n]
            assert [t.question for t in mine] == [t.question for t in first]
            assert [t.answers for t in mine] == [t.answers for t in first]
            assert {t.meta["data_source"] for t in mine} == {r["data_source"] for r in rows[at: at + n]} == {source}
            assert [r["extra_info"]["index"] for r in rows[at: at + n]] == list(range(n))
            at += n
    # a second build keeps what is there (it may be the reference's own file) unless --force: a skip
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.parquet")}
    assert main(["data", "prepare", "--sampled", "--data-dir", str(data_dir), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count(": kept ") == 2 and "--force rebuilds it" in out
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.parquet")} == before
    assert "val.benchmarks: [math_sampled]" in out and "val.benchmarks: [search_sampled]" in out
    assert "[math_sampled, search_sampled]" not in out  # one set per team, never both at once
    assert main(["data", "prepare", "--sampled", "--suite", "math", "--force", "--data-dir", str(data_dir),
                 "--out", str(tmp_path)]) == 0
    assert "search_sampled" not in capsys.readouterr().out


def test_prepare_cli_writes_a_suites_set_from_a_small_data_dir(tmp_path, capsys):
    """The command's main path without the shipped data: synthetic sources, longer than the parts."""
    import json

    for rel, n in (("math/math500/test.jsonl", 60), ("math/aime24/test.jsonl", 30), ("math/aime25/test.jsonl", 30)):
        f = tmp_path / rel
        f.parent.mkdir(parents=True)
        f.write_text("".join(json.dumps({"id": f"{rel}-{i}", "problem": f"{rel} {i}?", "answer": i}) + "\n"
                             for i in range(n)))
    assert main(["data", "prepare", "--sampled", "--suite", "math", "--data-dir", str(tmp_path)]) == 0
    assert "math_sampled: 110 rows (math500_first50 50, aime24 30, aime25 30)" in capsys.readouterr().out
    got = load_tasks("math_sampled", tmp_path)
    assert [t.question for t in got[48:52]] == ["math/math500/test.jsonl 48?", "math/math500/test.jsonl 49?",
                                                 "math/aime24/test.jsonl 0?", "math/aime24/test.jsonl 1?"]
    assert got[49].answers == ["49"] and got[49].id == "math500_first50-49"


def test_prepare_for_a_suite_without_a_sampled_set_says_there_is_nothing_to_prepare(tmp_path, capsys):
    assert main(["data", "prepare", "--sampled", "--suite", "toy", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "nothing to prepare: suite toy has no sampled validation set" in out and "math_sampled (math)" in out


def test_prepare_needs_sampled_and_a_data_dir(tmp_path, monkeypatch, capsys):
    assert main(["data", "prepare", "--data-dir", str(tmp_path)]) == 2
    assert "--sampled" in capsys.readouterr().err
    monkeypatch.delenv("DRMAS_DATA_DIR", raising=False)
    with pytest.raises(UserError, match="needs a data dir"):
        prepare_sampled(None)


def test_a_reference_math_file_is_read_as_it_comes(tmp_path):
    """The reference's math test_sampled.parquet: verl rows (its concatenated datasets keep their other
    columns, null where a dataset lacks one); the question is the user message, the gold
    reward_model.ground_truth, the id data_source-index."""
    def row(source, i, q, gold, **extra):
        return {"data_source": source, "ability": "math", "reward_model": {"style": "rule", "ground_truth": gold},
                "prompt": [{"role": "user", "content": q}],
                "extra_info": {"split": "test", "index": i, "answer": gold, "question": q},
                "env_kwargs": {"ground_truth": gold, "question": q, "data_source": source},
                "solution": extra.get("solution"), "url": extra.get("url")}
    rows = [row("math500_first50", 0, "What is $1+1$?", "2", solution="2"),
            row("aime24", 0, "Find $x$.", "204", url="https://x"), row("aime25", 0, "Find $y$.", "70")]
    path = tmp_path / "math" / "drmas_math" / "test_sampled.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    got = load_tasks("math_sampled", tmp_path)
    assert [(t.id, t.question, t.answers, t.meta["data_source"]) for t in got] == [
        ("math500_first50-0", "What is $1+1$?", ["2"], "math500_first50"), ("aime24-0", "Find $x$.", ["204"], "aime24"),
        ("aime25-0", "Find $y$.", ["70"], "aime25")]


def test_a_reference_search_file_is_read_as_it_comes(tmp_path):
    """The reference's search test_sampled.parquet (pandas, index=False): no question column, the
    question in the user message, golds in reward_model.ground_truth.target, extra_info.index
    numbered across the whole test mix."""
    pd = pytest.importorskip("pandas")

    def row(source, i, q, golds):
        kw = {"ground_truth": {"target": golds}, "question": q, "data_source": source}
        return {"data_source": source, "prompt": [{"role": "system", "content": "You are a helpful and harmless assistant."},
                                                  {"role": "user", "content": q}],
                "ability": "fact-reasoning", "reward_model": {"ground_truth": {"target": golds}, "style": "rule"},
                "extra_info": {"index": i, "need_tools_kwargs": True, "question": q, "split": "test",
                               "tools_kwargs": {"search": {"create_kwargs": kw}}},
                "metadata": None, "env_kwargs": kw}
    rows = [row("nq", 0, "who got the first nobel prize in physics?", ["Wilhelm Conrad Röntgen"]),
            row("triviaqa", 3610, "Who was the man behind The Chipmunks?", ["David Seville", "Ross Bagdasarian"])]
    path = tmp_path / "qa" / "drmas_search" / "test_sampled.parquet"
    path.parent.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    got = load_tasks("search_sampled", tmp_path)
    assert [(t.id, t.question, t.answers, t.meta["data_source"]) for t in got] == [
        ("nq_0", "who got the first nobel prize in physics?", ["Wilhelm Conrad Röntgen"], "nq"),
        ("triviaqa_3610", "Who was the man behind The Chipmunks?", ["David Seville", "Ross Bagdasarian"], "triviaqa")]
