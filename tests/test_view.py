"""The run viewer (`drmas-bench view`), used as a person uses it: the page is opened in real
headless Chromium, filtered, a trajectory expanded, and the DOM read back through the page's test
hook (``?test=1``; the result lands in ``#test-result``). Expected counts come from the records,
not from the page. The data half (rows, turns, chunks) is checked in Python without a browser."""

from __future__ import annotations

import base64
import gzip
import importlib.util
import json
import re
from pathlib import Path

import pytest

from drmas_bench import cli
from drmas_bench.report import view as V
from drmas_bench.report.runs import load_run
from drmas_bench.types import UserError
from drmas_bench.workflows import protocol as P

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_view", ROOT / "scripts" / "bench_view.py")
B = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(B)

needs_browser = pytest.mark.skipif(B.browser() is None, reason="no headless Chromium (Debian: apt-get install -y chromium)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("view")
    a = B.scripted_search_run(base / "a", questions=24, n=1)
    b = B.scripted_search_run(base / "b", questions=16, n=1)
    # run B differs: its answerer is always right, so some questions flip between the runs
    recs = [json.loads(x) for x in (b / "samples.jsonl").read_text().splitlines()]
    for r in recs:
        if r["final_answer"] is None or not r["correct"]:
            r["correct"], r["reward"] = True, 1.0
    (b / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return a, b


def unpack(chunk: str):
    return json.loads(gzip.decompress(base64.b64decode(chunk)))


# ------------------------------------------------------------------ the page's data, no browser


def test_turns_carry_protocol_parsing_and_the_env_observation(runs):
    run = load_run(runs[0])
    for rec in run.records:
        tv = V.turns_view(rec, "search_route")
        assert [t["agent"] for t in tv] == [t["agent"] for t in rec["turns"]]
        steps = rec["extra"]["env"]["steps"]
        with_env = [t for t in tv if "env" in t]
        assert [t["env"] for t in with_env] == steps  # every env step shown once, in order
        for t, raw in zip(tv, rec["turns"]):
            text = raw["completion"]["text"]
            if t["agent"] == "verifier":
                assert t["verdict"] == P.search_verdict(text)
            else:
                assert t["action"] == P.project(t["agent"], text)
            assert t["valid"] == raw["valid"] and (not t["reasons"]) == P.valid(
                {"verifier": "search_verifier"}.get(t["agent"], t["agent"]), text)
        if rec["task"]["id"] == "q12":  # the verifier searched at step 4: nobody acted, its turn holds the step
            assert with_env[-1]["agent"] == "verifier" and with_env[-1]["env"]["done"]
        searched = [t for t in with_env if t["env"]["query"] is not None]
        assert all(t["agent"] == "searcher" and t["env"]["observation"].startswith("<information>") for t in searched)


def test_rows_and_chunks_hold_every_selected_record(runs):
    run = load_run(runs[0])
    entry, chunks = V.run_data(run)
    assert len(entry["rows"]) == len(run.records) == 24
    details = [d for c in chunks for d in unpack(c)]
    assert len(chunks) == -(-24 // V.CHUNK) and len(details) == 24
    by_key = {(r["task"]["benchmark"], r["task"]["id"]): r for r in run.records}
    for row, d in zip(entry["rows"], details):
        rec = by_key[(row["b"], row["id"])]
        assert d["question"] == rec["task"]["question"] and len(d["turns"]) == len(rec["turns"])
        assert row["c"] == rec["correct"] and row["nv"] == sum(not t["valid"] for t in rec["turns"])
    assert entry["summary"]["compliance"]["workflow"] == "search_route"


def test_pairs_match_the_same_question_and_keep_the_unpaired():
    a = [{"b": "x", "id": "1", "s": 0}, {"b": "x", "id": "2", "s": 0}]
    b = [{"b": "x", "id": "2", "s": 0}, {"b": "x", "id": "3", "s": 0}]
    assert V.pairs(a, b) == [[0, -1], [1, 0], [-1, 1]]
    assert V.pairs(a, None) == [[0], [1]]


def test_a_page_cannot_be_closed_early_by_record_text(tmp_path, runs):
    run = load_run(runs[0])
    run.records[0]["task"]["question"] = "</script><script>alert(1)</script>"
    html = V.render([run])
    index = re.search(r'<script type="application/json" id="index">(.*?)</script>', html, re.DOTALL).group(1)
    assert json.loads(index)["runs"][0]["rows"]  # the whole index survives inside its element


def test_cli_writes_the_page_and_refuses_bad_input(tmp_path, runs, capsys):
    out = tmp_path / "page.html"
    assert cli.main(["view", str(runs[0]), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000 and "wrote" in capsys.readouterr().out
    assert cli.main(["view", str(runs[0]), "--out", str(tmp_path / "page.txt")]) != 0
    assert ".html" in capsys.readouterr().err
    assert cli.main(["view", str(runs[0]), str(runs[1]), str(runs[0])]) != 0
    assert "one run or two" in capsys.readouterr().err
    assert cli.main(["view", str(tmp_path / "nowhere")]) != 0
    assert "not a run directory" in capsys.readouterr().err


def test_a_corrupt_line_stops_with_the_repair_hint_and_changes_nothing(tmp_path, runs, capsys):
    import shutil

    d = tmp_path / "bad"
    shutil.copytree(runs[0], d)
    lines = (d / "samples.jsonl").read_text().splitlines()
    lines.insert(3, "{not json")
    (d / "samples.jsonl").write_text("\n".join(lines) + "\n")
    before = (d / "samples.jsonl").read_bytes()
    assert cli.main(["view", str(d)]) != 0
    err = capsys.readouterr().err
    assert "samples.jsonl:4" in err and "runs repair" in err
    assert (d / "samples.jsonl").read_bytes() == before and not (d / "view.html").exists()


def test_records_from_before_the_env_account_still_render(tmp_path, runs):
    d = tmp_path / "old"
    import shutil

    shutil.copytree(runs[0], d)
    recs = [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]
    for r in recs:
        r["extra"].pop("env")
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    entry, chunks = V.run_data(load_run(d))
    assert not any("env" in t for c in chunks for dd in unpack(c) for t in dd["turns"])
    assert [r["k"] for r in entry["rows"]] == [V.search_steps(r).count("search") for r in V._order(recs)]


def test_more_than_two_runs_is_a_user_error(runs):
    with pytest.raises(UserError):
        V.render([load_run(runs[0])] * 3)


# ------------------------------------------------------------------ in the browser


@needs_browser
def test_the_page_in_chromium_filters_and_expands(tmp_path, runs):
    page = V.write_view([runs[0]], tmp_path / "one.html")
    recs = load_run(runs[0]).records
    wrong = [r for r in V._order(recs) if not r.correct]
    assert 0 < len(wrong) < len(recs)
    shot = tmp_path / "view.png"
    res = B.open_page(page, "correct=incorrect&open=0", screenshot=shot)
    assert res["errors"] == [] and res["console"] == [], res  # the page logs nothing when all is well
    assert res["shown"] == len(wrong) and res["total"] == len(recs)
    assert res["turns"] == len(wrong[0].turns)  # the first incorrect one, opened: all its turns
    assert shot.stat().st_size > 10_000
    everything = B.open_page(page)
    assert everything["shown"] == len(recs) and everything["turns"] == 0 and everything["errors"] == []
    text = B.open_page(page, "text=country%207%3F&open=0")
    assert text["shown"] == 1 and text["turns"] > 0


@needs_browser
def test_two_runs_side_by_side(tmp_path, runs):
    page = V.write_view(list(runs), tmp_path / "two.html")
    a = {(r["task"]["benchmark"], r["task"]["id"]): r for r in load_run(runs[0]).records}
    b = {(r["task"]["benchmark"], r["task"]["id"]): r for r in load_run(runs[1]).records}
    flips = [k for k in a if k in b and not a[k]["correct"] and b[k]["correct"]]
    assert flips
    res = B.open_page(page, "correct=b-only&open=0")
    assert res["errors"] == [] and res["shown"] == len(flips) and res["total"] == len(a.keys() | b.keys())
    first = min(flips, key=lambda k: (k[0], V._natural(k[1])))
    assert res["turns"] == len(a[first]["turns"]) + len(b[first]["turns"])


@needs_browser
def test_a_big_run_draws_only_the_rows_in_view(tmp_path, runs):
    big = B.repeat_run(runs[0], tmp_path / "big", 1200)
    page = V.write_view([big], tmp_path / "big.html")
    res = B.open_page(page, "open=1000")
    assert res["errors"] == [] and res["shown"] == 1200
    assert res["rows_drawn"] < 80 and res["turns"] > 0  # lazily drawn; a row far down still opens


@needs_browser
def test_a_math_run_shows_the_solvers_box_and_the_verdicts(tmp_path):
    d = B.scripted_math_run(tmp_path / "math", questions=12)
    recs = sorted(load_run(d).records, key=lambda r: r["task"]["id"])
    page = V.write_view([d], tmp_path / "math.html")
    invalid = [r for r in recs if any(not t["valid"] for t in r["turns"])]
    assert 0 < len(invalid) < len(recs)
    res = B.open_page(page, "valid=invalid&open=0")
    assert res["errors"] == [] and res["shown"] == len(invalid) and res["turns"] == len(invalid[0]["turns"])
    entry, chunks = V.run_data(load_run(d))
    turns = [t for dd in unpack(chunks[0]) for t in dd["turns"]]
    from drmas_bench.grading.extract import reference_boxed

    assert {t["verdict"] for t in turns if t["agent"] == "verifier"} == {"approve", "reject"}
    assert all(t["action"] == reference_boxed(t["response"]) for t in turns if t["agent"] == "solver")


@needs_browser
def test_the_browser_check_sees_a_broken_page(tmp_path, runs):
    """The console and error checks above can fail: a damaged chunk must show up in both."""
    html = V.render([load_run(runs[0])])
    html = re.sub(r'(<script type="text/plain" id="chunk-0-0">)[^<]*', r"\1bm90IGd6aXA=", html)
    page = tmp_path / "broken.html"
    page.write_text(html, encoding="utf-8")
    res = B.open_page(page, "open=0")
    assert res["errors"] and res["console"] and res["turns"] == 0


@needs_browser
def test_every_per_agent_block_of_the_summary_is_drawn(tmp_path, runs):
    """Blocks other than compliance (e.g. per-agent effects) are drawn the same way, nested ones as rows."""
    run = load_run(runs[0])
    summary = V.metrics.summarize(run.records, workflow="search_route")
    summary["effects"] = {"workflow": "search_route", "agents": {"verifier": {"latency_s": {"p50": 0.1, "p95": 0.2}}},
                          "benchmarks": {"nq": {"search": {"evidence_recall": 0.5}}}}
    page = tmp_path / "effects.html"
    page.write_text(V.render([run], [summary]), encoding="utf-8")
    res = B.open_page(page)
    assert res["errors"] == [] and "compliance per agent" in res["headings"] and "effects per agent" in res["headings"]
    assert "effects · benchmarks" in res["headings"]


def test_natural_order_of_question_ids():
    ids = ["q10", "q2", "q1", "b"]
    assert sorted(ids, key=V._natural) == ["b", "q1", "q2", "q10"]
