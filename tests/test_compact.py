"""RUN/records.compact.jsonl (drmas_bench.compact): the summary of the compact records is the summary
of the full ones, for the search, math and toy workflows; the copy follows samples.jsonl (appended
with it, rebuilt when behind or of another version) and drops the prompts and passages."""

from __future__ import annotations

import importlib
import importlib.util
import json
import random
from pathlib import Path

import yaml

from drmas_bench import compact, metrics
from drmas_bench.run_dir import RunDir
from drmas_bench.run_samples import read_samples

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_view", ROOT / "scripts" / "bench_view.py")
B = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(B)


def test_search_and_math_summaries_of_compact_records_are_those_of_the_full_records(tmp_path):
    for run, wf in ((B.scripted_search_run(tmp_path / "s", questions=24, n=2), "search_route"),
                    (B.scripted_math_run(tmp_path / "m", questions=12), "math_refine")):
        full = read_samples(run / "samples.jsonl")
        small = [json.loads(compact.line(r, wf)) for r in full]
        assert metrics.summarize(small, workflow=wf) == metrics.summarize(full, workflow=wf)
        assert sum(map(len, map(json.dumps, small))) < sum(map(len, map(json.dumps, full)))
        assert not any("messages" in t["request"] for r in small for t in r["turns"])


def test_precomputed_evidence_is_the_evidence_of_the_passages(tmp_path):
    """The plain reading (the full record's observations) against the stored figure, on records
    whose passages were shuffled between records at random."""
    from drmas_bench.workflows.base import get_workflow

    evidence_at_answer = importlib.import_module(get_workflow("search_route").fn.__module__).evidence_at_answer
    rng = random.Random(3)
    full = read_samples(B.scripted_search_run(tmp_path / "s", questions=16, n=1) / "samples.jsonl")
    obs = [s["observation"] for r in full for s in r["extra"]["env"]["steps"] if s.get("observation")]
    for r in full:
        for s in r["extra"]["env"]["steps"]:
            if s.get("observation"):
                s["observation"] = rng.choice(obs + ["<information>{\"result\": \"Doc 1: nothing here\\n\"}</information>"])
        small = compact.compact(r, "search_route")
        assert "observation" not in json.dumps(small["extra"]["env"]["steps"])
        assert evidence_at_answer(small) == evidence_at_answer(r)


def test_the_copy_is_appended_with_the_samples_and_rebuilt_when_behind(tmp_path):
    run = B.scripted_search_run(tmp_path / "s", questions=8, n=1)  # samples.jsonl written without a store
    lines = (run / "samples.jsonl").read_text().splitlines()
    (run / "samples.jsonl").write_text("\n".join(lines[:5]) + "\n")
    config = yaml.safe_load((run / "config.yaml").read_text())
    store = RunDir(run, config)
    assert compact.lines_in(run / compact.COMPACT) == 5  # built on open
    from drmas_bench.types import Trajectory

    store.append([Trajectory.from_dict(json.loads(x)) for x in lines[5:]])
    assert compact.lines_in(run / compact.COMPACT) == 8
    assert [v.task_id for v in store.compact_views()] == [json.loads(x)["task"]["id"] for x in lines]
    store.close()
    with open(run / "samples.jsonl", "a") as f:  # a run killed between the two appends
        f.write(lines[0] + "\n")
    RunDir(run, config).close()
    assert compact.lines_in(run / compact.COMPACT) == 9


def test_the_leaderboard_of_compact_records_is_that_of_the_full_records(tmp_path):
    from drmas_bench import report
    from drmas_bench.report.runs import load_run

    run = B.scripted_search_run(tmp_path / "s", questions=24, n=2)
    RunDir(run, yaml.safe_load((run / "config.yaml").read_text())).close()  # writes the index and the compact copy

    def board(compact_ok: bool) -> str:
        r = load_run(run, compact=compact_ok)
        tables = report.build_leaderboard([r], report.parse_metrics("avg@n,pass@n"), ci=True, paper=None, n_boot=200, seed=0)
        return report.leaderboard_markdown(tables, ci=True)

    small = load_run(run, compact=True)
    assert all("messages" not in t["request"] for rec in small.records for t in rec["turns"])
    assert board(True) == board(False)
    with open(run / "samples.jsonl", "a") as f:  # samples.jsonl ahead of the copy: the full records are read
        f.write((run / "samples.jsonl").read_text().splitlines()[0] + "\n")
    assert any("messages" in t["request"] for rec in load_run(run, compact=True).records for t in rec["turns"])


def test_the_leaderboard_of_a_run_read_line_by_line_is_that_of_its_records(tmp_path):
    """A run holding no records (as `leaderboard` opens it) is read into its digest one compact line at
    a time: the same tables, CSV and page figures as from its records; and from samples.jsonl when the
    compact copy is behind."""
    import dataclasses

    from drmas_bench import report
    from drmas_bench.report.leaderboard import digest
    from drmas_bench.report.pages import tokens_per_question
    from drmas_bench.report.runs import load_run

    runs = [B.scripted_search_run(tmp_path / "s", questions=16, n=2), B.scripted_math_run(tmp_path / "m", questions=8)]
    for run in runs:
        RunDir(run, yaml.safe_load((run / "config.yaml").read_text())).close()

    def board(loaded: list) -> str:
        tables = report.build_leaderboard(loaded, report.parse_metrics("avg@n,pass@n,pass^1"), ci=True, paper=None,
                                          n_boot=100, seed=0)
        return report.leaderboard_markdown(tables, ci=True) + report.tables_csv(tables, ci=True)

    full = [load_run(r, compact=True) for r in runs]
    empty = [dataclasses.replace(r, records=[], views=[]) for r in full]
    assert not empty[0].views and board(empty) == board(full)
    assert [tokens_per_question(r) for r in empty] == [tokens_per_question(r) for r in full]
    assert digest(empty[0]).questions == report.questions(full[0].views)
    with open(runs[0] / "samples.jsonl", "a") as f:  # a repeated sample: the compact copy is not streamed
        f.write((runs[0] / "samples.jsonl").read_text().splitlines()[0] + "\n")
    RunDir(runs[0], yaml.safe_load((runs[0] / "config.yaml").read_text())).close()
    assert compact.stream_views(runs[0], lambda r: True) is None
    again = dataclasses.replace(load_run(runs[0], compact=True), records=[], views=[])
    assert digest(again).questions == report.questions(load_run(runs[0]).views)
