"""`drmas-bench export`: a finished run written as an Inspect AI log and as a Hugging Face model card
plus parquet, each read back with the other tool's own reader (inspect_ai.log.read_eval_log,
huggingface_hub.ModelCard, pyarrow) and checked against the run's summary.json and samples.

Runs: the real search_route workflow answered by script (scripts/bench_view.py, mixed right and
wrong answers over two benchmarks) with summary.json from `metrics.summarize` (what eval writes),
and one real tiny-random eval of the toy suite through the CLI."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from drmas_bench import cli, metrics
from drmas_bench.export import FORMATS, export_run
from drmas_bench.export.source import load_finished, metric_figures, named_figures
from drmas_bench.types import UserError

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_view", ROOT / "scripts" / "bench_view.py")
B = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(B)

HAS_INSPECT = importlib.util.find_spec("inspect_ai") is not None
needs_inspect = pytest.mark.skipif(not HAS_INSPECT, reason="inspect_ai not installed (pip install 'drmas-bench[inspect]')")


def finished(run: Path, **extra) -> Path:
    """Write the run's summary.json as eval does (metrics.summarize over its records)."""
    recs = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines() if x.strip()]
    s = metrics.summarize(recs, workflow="search_route")
    s["provenance"] = {"started_at": "2026-01-02T03:04:05Z", "finished_at": "2026-01-02T03:05:06Z",
                       "git": {"commit": "0" * 40, "dirty": False}, "package": {"version": "0.1.0"}}
    s.update(extra)
    (run / "summary.json").write_text(json.dumps(s))
    return run


@pytest.fixture(scope="module")
def search_run(tmp_path_factory) -> Path:
    return finished(B.scripted_search_run(tmp_path_factory.mktemp("exp") / "search", questions=12, n=2))


@pytest.fixture()
def copy(search_run, tmp_path) -> Path:
    """A private copy of the scripted run, free to damage."""
    return Path(shutil.copytree(search_run, tmp_path / "run"))


def records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines() if x.strip()]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def token_sums(recs: list[dict], key) -> dict[str, tuple[int, int]]:
    """Plain reference: (prompt, completion) tokens summed by ``key(turn)``."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in recs:
        for t in r["turns"]:
            out[key(t)][0] += t["completion"]["prompt_tokens"]
            out[key(t)][1] += t["completion"]["completion_tokens"]
    return {k: (a, b) for k, (a, b) in out.items()}


# ---------------------------------------------------------------------------------- inspect


@needs_inspect
def test_inspect_log_reads_back_with_the_runs_counts_scores_and_usage(search_run, tmp_path):
    from inspect_ai.log import read_eval_log

    out = tmp_path / "run.eval"
    assert cli.main(["export", str(search_run), "--format", "inspect", "--out", str(out)]) == 0
    log = read_eval_log(str(out))
    recs, s = records(search_run), summary(search_run)
    assert log.status == "success" and log.eval.task == "drmas-bench/search"
    assert log.eval.config.epochs == 2 and log.eval.dataset.samples == s["micro"]["questions"] == 12
    assert set(log.eval.model_roles) == {"verifier", "searcher", "answerer"}
    assert len(log.samples) == s["micro"]["samples"] == len(recs) == 24
    by_key = {(f"{r['task']['benchmark']}:{r['task']['id']}", r["sample_idx"] + 1): r for r in recs}
    for smp in log.samples:
        r = by_key[(smp.id, smp.epoch)]
        assert smp.scores["correct"].value == (1.0 if r["correct"] else 0.0)
        assert smp.scores["reward"].value == r["reward"]
        replies = [m for m in smp.messages if m.role == "assistant"]
        assert [m.metadata["agent"] for m in replies] == [t["agent"] for t in r["turns"]]
        assert [m.text for m in replies] == [t["completion"]["text"] for t in r["turns"]]
        assert [e.role for e in smp.events] == [t["agent"] for t in r["turns"]]
        assert {k: (u.input_tokens, u.output_tokens) for k, u in smp.role_usage.items()} == token_sums([r], lambda t: t["agent"])
    # the results are the summary's figures; the sample scores average to the summary's avg@n
    m = log.results.scores[0].metrics
    for shown, (name, v) in named_figures(s["micro"], 2).items():
        assert m[shown].value == pytest.approx(v)
    assert m["avg@2"].value == pytest.approx(sum(x.scores["correct"].value for x in log.samples) / 24)
    assert 0 < m["avg@2"].value < 1  # the scripted answerer is right on some questions, wrong on others
    for b in ("hotpotqa", "nq"):
        assert m[f"{b}/avg@2"].group == b and m[f"{b}/avg@2"].value == pytest.approx(s["benchmarks"][b]["avg@n"])
    # usage per agent equals the summary's calls x tokens per call; per model it is the team's one model
    role = {k: (u.input_tokens, u.output_tokens) for k, u in log.stats.role_usage.items()}
    assert role == token_sums(recs, lambda t: t["agent"])
    for agent, a in s["micro"]["agents"].items():
        assert role[agent][0] == pytest.approx(a["calls"] * a["prompt_tokens_per_call"])
        assert role[agent][1] == pytest.approx(a["calls"] * a["completion_tokens_per_call"])
    assert {k: (u.input_tokens, u.output_tokens) for k, u in log.stats.model_usage.items()} == {
        "drmas-bench/scripted": tuple(map(sum, zip(*role.values())))}


@needs_inspect
def test_a_heterogeneous_team_reports_usage_per_model(copy, tmp_path):
    import yaml
    from huggingface_hub import ModelCard
    from inspect_ai.log import read_eval_log

    cfg = yaml.safe_load((copy / "config.yaml").read_text())
    cfg["identity"]["team"]["worker_groups"]["big"] = {"model": "org/Big-7B", "engine": "hf"}
    cfg["identity"]["team"]["agents"]["answerer"] = "big"
    (copy / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    recs = records(copy)
    for r in recs:
        for t in r["turns"]:
            if t["agent"] == "answerer":
                t["wg"] = "big"
    (copy / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    export_run(copy, "inspect", tmp_path / "x.eval")
    log = read_eval_log(str(tmp_path / "x.eval"))
    model = {"shared": "drmas-bench/scripted", "big": "drmas-bench/Big-7B"}
    assert {k: (u.input_tokens, u.output_tokens) for k, u in log.stats.model_usage.items()} == token_sums(
        recs, lambda t: model[t["wg"]])
    assert len(log.stats.model_usage) == 2 and log.eval.model == "drmas-bench/scripted+Big-7B"
    assert log.eval.model_roles["answerer"].model == "drmas-bench/Big-7B"
    export_run(copy, "hub", tmp_path / "hub")
    card = ModelCard.load(tmp_path / "hub" / "README.md")
    assert card.data.model_name == "scripted+Big-7B" and card.data.base_model == ["org/Big-7B"]


@needs_inspect
def test_a_growing_conversation_is_shown_once_not_repeated_per_turn(search_run):
    from drmas_bench.export.inspect_log import sample_from_record

    rec = json.loads(json.dumps(records(search_run)[0]))
    first = rec["turns"][0]
    second = json.loads(json.dumps(first))  # the same agent again, its request extending its first call and reply
    second["request"]["messages"] = first["request"]["messages"] + [
        {"role": "assistant", "content": first["completion"]["text"]}, {"role": "user", "content": "one more step"}]
    second["completion"]["text"] = "second reply"
    rec["turns"] = [first, second]
    smp = sample_from_record(rec, load_finished(search_run))
    shown = [(m.role, m.text, m.metadata["turn"]) for m in smp.messages]
    n0 = len(first["request"]["messages"])
    assert shown == [(m["role"], m["content"], 0) for m in first["request"]["messages"]] + [
        ("assistant", first["completion"]["text"], 0), ("user", "one more step", 1), ("assistant", "second reply", 1)]
    # each call's model event still holds the whole prompt the agent was sent
    assert [len(e.input) for e in smp.events] == [n0, n0 + 2]


def test_inspect_missing_is_one_line_naming_the_extra(search_run, tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_inspect(name, *a, **k):
        if name.startswith("inspect_ai"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_inspect)
    with pytest.raises(UserError, match=r"drmas-bench\[inspect\]"):
        export_run(search_run, "inspect", tmp_path / "x.eval")
    assert not (tmp_path / "x.eval").exists()


# -------------------------------------------------------------------------------------- hub


def test_hub_card_parses_back_into_the_summarys_metrics(search_run, tmp_path):
    from huggingface_hub import ModelCard

    out = tmp_path / "hub"
    assert cli.main(["export", str(search_run), "--format", "hub", "--out", str(out)]) == 0
    card = ModelCard.load(out / "README.md")
    s = summary(search_run)
    results = card.data.eval_results
    got = {(r.dataset_name, r.metric_type): r.metric_value for r in results}
    want = {(b, shown): v * 100 for b, blk in s["benchmarks"].items() for shown, (_, v) in named_figures(blk, 2).items()}
    assert got.keys() == want.keys() and {("nq", "avg@2"), ("hotpotqa", "pass@1")} <= got.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-4)
    assert all(r.task_type == "text-generation" for r in results)
    # the benchmarks' hub sources: FlashRAG's nq (test split) and hotpotqa (dev split), each its config
    assert {(r.dataset_name, r.dataset_type, r.dataset_config, r.dataset_split) for r in results} == {
        ("nq", "RUC-NLPIR/FlashRAG_datasets", "nq", "test"), ("hotpotqa", "RUC-NLPIR/FlashRAG_datasets", "hotpotqa", "dev")}
    assert card.data.model_name == "scripted"


def test_hub_parquet_has_one_row_per_trajectory(search_run, tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "hub"
    export_run(search_run, "hub", out)
    rows = pq.read_table(out / "samples.parquet").to_pylist()
    recs = sorted(records(search_run), key=lambda r: (r["task"]["benchmark"], r["task"]["id"], r["sample_idx"]))
    assert len(rows) == len(recs) == 24
    for row, r in zip(rows, recs):
        assert (row["benchmark"], row["task_id"], row["sample_idx"]) == (r["task"]["benchmark"], r["task"]["id"], r["sample_idx"])
        assert row["correct"] == r["correct"] and row["reward"] == r["reward"] and row["final_answer"] == r["final_answer"]
        assert [t["agent"] for t in row["turns"]] == [t["agent"] for t in r["turns"]] == row["agents"]
        assert [t["reply"] for t in row["turns"]] == [t["completion"]["text"] for t in r["turns"]]
        assert row["prompt_tokens"] == sum(t["completion"]["prompt_tokens"] for t in r["turns"])
    assert sum(x["correct"] for x in rows) / 24 == pytest.approx(summary(search_run)["micro"]["avg@n"])


def test_named_figures_resolve_n_and_read_pass_hat_k_when_a_summary_has_it():
    block = {"avg@n": 0.5, "pass@k": {"1": 0.5, "4": 0.9}, "pass@n": 0.9, "pass^k": {"1": 0.5, "4": 0.1},
             "questions": 3, "ci95": {"avg@n": [0.1, 0.9]}}
    assert metric_figures(block) == {"avg@n": 0.5, "pass@1": 0.5, "pass@4": 0.9, "pass@n": 0.9, "pass^1": 0.5, "pass^4": 0.1}
    shown = named_figures(block, 4)
    assert list(shown) == ["avg@4", "pass@1", "pass@4", "pass^1", "pass^4"]  # pass@n == pass@4: shown once
    # different sample counts: pass@n (any success over each question's samples) differs from pass@4
    assert "pass@n" in named_figures({**block, "pass@n": 0.95}, 4)


# --------------------------------------------------------------------------- refusals


def test_refuses_what_is_not_a_finished_run(copy, tmp_path):
    with pytest.raises(UserError, match="not a run directory"):
        export_run(tmp_path, "hub", tmp_path / "o")
    (copy / "summary.json").unlink()
    with pytest.raises(UserError, match="not a finished run .*re-run the same"):
        export_run(copy, "hub", tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_refuses_a_summary_older_than_its_samples(copy, tmp_path):
    recs = records(copy)
    extra = dict(recs[0], sample_idx=1, task=dict(recs[0]["task"], id="q99"))
    recs.append(extra)  # a later eval added a question, then stopped before writing its summary
    (copy / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(UserError, match="counts 24 samples but samples.jsonl holds 25"):
        export_run(copy, "hub", tmp_path / "o")


def test_refuses_a_run_in_progress(copy, tmp_path):
    from drmas_bench.run_dir import RunLock

    with RunLock(copy):
        with pytest.raises(UserError, match="still writing"):
            export_run(copy, "hub", tmp_path / "o")
    export_run(copy, "hub", tmp_path / "o")  # released: exported


def test_existing_out_needs_force(copy, tmp_path):
    out = tmp_path / "o"
    export_run(copy, "hub", out)
    (out / "README.md").write_text("mine")
    with pytest.raises(UserError, match="exists; pass --force"):
        export_run(copy, "hub", out)
    assert (out / "README.md").read_text() == "mine"  # untouched
    export_run(copy, "hub", out, force=True)
    assert (out / "README.md").read_text().startswith("---\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "run"]  # no scratch folder left behind


def test_a_corrupt_samples_line_is_left_out_with_a_warning_and_recorded(copy, tmp_path, caplog):
    import pyarrow.parquet as pq

    lines = (copy / "samples.jsonl").read_text().splitlines()
    lines[3] = lines[3][:40]  # a damaged line in the middle (the run store refuses to read past it)
    (copy / "samples.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    with caplog.at_level("WARNING"):
        export_run(copy, "hub", out)
    assert "1 unreadable line(s) left out (line 4)" in caplog.text and "runs repair" in caplog.text
    assert pq.read_table(out / "samples.parquet").num_rows == 23
    meta = json.loads(pq.read_schema(out / "samples.parquet").metadata[b"drmas"])
    assert meta["unreadable_lines"] == [4]
    assert "partial-run" in (out / "README.md").read_text()


@needs_inspect
def test_a_run_stopped_by_a_limit_is_exported_flagged(tmp_path):
    from inspect_ai.log import read_eval_log

    run = finished(B.scripted_search_run(tmp_path / "r", questions=3, n=1), stopped={"reason": "max-usd 0.01 reached"})
    export_run(run, "inspect", tmp_path / "x.eval")
    log = read_eval_log(str(tmp_path / "x.eval"))
    assert log.status == "cancelled" and log.metadata["drmas"]["stopped"] == "max-usd 0.01 reached"
    assert log.metadata["drmas"]["partial"] is True


def test_stop_reason_reads_the_ways_a_summary_may_record_a_limit():
    from drmas_bench.export.source import stop_reason

    assert stop_reason({"micro": {}}) is None and stop_reason({"run": {"stopped": None}}) is None
    assert stop_reason({"stopped": "max-tokens 1000"}) == "max-tokens 1000"
    assert stop_reason({"run": {"stopped_by": {"limit": "max-usd 2"}}}) == "max-usd 2"
    assert stop_reason({"limit_reached": {"kind": "usd"}}) == '{"kind": "usd"}'


def test_help_has_an_example_and_names_each_format(capsys):
    assert set(FORMATS) == {"inspect", "hub"}
    with pytest.raises(SystemExit) as e:
        cli.main(["export", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "examples:" in out and "drmas-bench export" in out
    assert all(f"{k}:" in out for k in FORMATS) and "drmas-bench[inspect]" in out
    from drmas_bench.export import _resolve

    assert all(callable(_resolve(f.write)) and (f.check is None or callable(_resolve(f.check))) for f in FORMATS.values())


def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert cli.main(["export", str(tmp_path), "--format", "hub"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a run directory" in err[0]


# ------------------------------------------------------------------- a real eval, exported


@pytest.mark.slow
def test_real_tiny_random_toy_run_exports_both_formats(tmp_path):
    run = tmp_path / "toy"
    assert cli.main(["eval", "--model", "tiny-random", "--suite", "toy", "--limit", "2", "--n", "2",
                     "--max-new-tokens", "8", "--no-progress", "--out", str(run)]) == 0
    s = summary(run)
    export_run(run, "hub", tmp_path / "hub")
    from huggingface_hub import ModelCard

    card = ModelCard.load(tmp_path / "hub" / "README.md")
    assert {r.metric_type: r.metric_value for r in card.data.eval_results}["avg@2"] == pytest.approx(
        s["benchmarks"]["toy"]["avg@n"] * 100)
    if HAS_INSPECT:
        from inspect_ai.log import read_eval_log

        export_run(run, "inspect", None)
        log = read_eval_log(str(run / "export" / "inspect.eval"))
        assert len(log.samples) == s["micro"]["samples"] == 4
        role = {k: u.input_tokens for k, u in log.stats.role_usage.items()}
        for agent, a in s["micro"]["agents"].items():
            assert role[agent] == pytest.approx(a["calls"] * a["prompt_tokens_per_call"])
