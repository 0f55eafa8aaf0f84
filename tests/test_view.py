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
from protocol_roles import P

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


def _append_in_step(run: Path, i: int) -> None:
    """Append a changed copy of record ``i`` (same sample) to samples.jsonl, the compact records and the
    index, as the store appends one."""
    import zlib

    from drmas_bench import compact
    from drmas_bench.run_stamps import mismatch_signature

    raw = (run / "samples.jsonl").read_bytes().split(b"\n")[i]
    rec = json.loads(raw)
    rec["reward"], rec["correct"], rec["final_answer"] = 1.0, True, "again"
    line = json.dumps(rec, ensure_ascii=False).encode("utf-8")
    start = (run / "samples.jsonl").stat().st_size
    n = len((run / "samples.index").read_text().splitlines())
    with open(run / "samples.jsonl", "ab") as f:
        f.write(line + b"\n")
    with open(run / "records.compact.jsonl", "a", encoding="utf-8") as f:
        f.write(compact.line(rec, "search_route"))
    entry = [rec["task"]["benchmark"], rec["task"]["id"], rec["sample_idx"], n + 1, start, start + len(line) + 1,
             zlib.crc32(line), mismatch_signature(rec)]
    with open(run / "samples.index", "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, separators=(",", ":")) + "\n")


def test_the_page_read_a_record_at_a_time_is_the_page_of_the_loaded_run(tmp_path, runs):
    """`write_view` streams the run (compact records + index when in step, else samples.jsonl): the
    same page as `render` of the run loaded whole, with a repeated sample (the last copy wins, in the
    place of the first) and a line cut off by a kill (left out)."""
    import shutil

    d = B.synth_run(runs[0], tmp_path / "synth", 300)
    assert (d / "records.compact.jsonl").exists() and (d / "samples.index").exists()
    from_compact = V.write_view([d], tmp_path / "c.html").read_text(encoding="utf-8")
    assert from_compact == V.render([load_run(d)])
    _append_in_step(d, 3)  # a repeated sample in step with the compact records and the index
    html = V.write_view([d], tmp_path / "c.html").read_text(encoding="utf-8")
    assert html == V.render([load_run(d)]) and '"a":"again"' in html and len(load_run(d).records) == 300
    e = tmp_path / "dup"
    shutil.copytree(runs[0], e)
    recs = [json.loads(x) for x in (e / "samples.jsonl").read_text().splitlines()]
    again = json.loads(json.dumps(recs[3]))
    again["reward"], again["correct"], again["final_answer"] = 1.0, True, "again"
    with open(e / "samples.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(again) + "\n" + json.dumps(recs[4])[:50])  # the last line cut off mid-append
    html = V.write_view([e], tmp_path / "d.html").read_text(encoding="utf-8")
    assert html == V.render([load_run(e)]) and '"a":"again"' in html
    assert len(load_run(e).records) == 24


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
    from drmas_bench.records import view
    from drmas_bench.suites.search.rules import search_steps

    assert [r["k"] for r in entry["rows"]] == [search_steps(view(r)).count("search") for r in V._order(recs)]


def test_a_run_stopped_by_a_limit_says_so_on_its_page(tmp_path, runs):
    import shutil

    from drmas_bench.report.labels import stopped_text

    d = tmp_path / "stopped"
    shutil.copytree(runs[0], d)
    assert V.stopped(load_run(d)) == ""  # no summary.json: nothing to say
    stop = {"limit": "max_usd", "reason": "the run reached --max-usd 0.5 (0.51 spent)", "samples_finished": 24,
            "samples_planned": 40}
    (d / "summary.json").write_text(json.dumps({"run": {"stopped": stop}}), encoding="utf-8")
    html = V.render([load_run(d)])
    assert f'<p class="stopped">{stopped_text(stop)}</p>' in html and "24 of 40 samples" in html
    (d / "summary.json").write_text("{not json", encoding="utf-8")
    assert 'class="stopped"' not in V.render([load_run(d)])  # an unreadable summary.json: the page still builds


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
    """A block other than compliance and effects with per-agent entries is drawn as a labelled table
    too; the workflow's effects block per benchmark in its own."""
    run = load_run(runs[0])
    summary = V.metrics.summarize(run.records, workflow="search_route")
    summary["memory"] = {"workflow": "search_route", "agents": {"verifier": {"notes_kept": 3, "recall_rate": 0.5}}}
    page = tmp_path / "effects.html"
    page.write_text(V.render([run], [summary]), encoding="utf-8")
    res = B.open_page(page)
    assert res["errors"] == [] and "Memory of the search workflow, per agent" in res["headings"]
    assert "Why: what the search workflow's agents did to the score" in res["headings"]
    assert "notes kept" in res["report_text"] and "recall (%)" in res["report_text"]


# ------------------------------------------------------------------ the report half: labels, charts, widths


def _keys(obj, out=None):
    """Every dict key in a summary, at any depth."""
    out = set() if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(str(k))
            _keys(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _keys(v, out)
    return out


@pytest.fixture(scope="module")
def pages(tmp_path_factory, runs):
    base = tmp_path_factory.mktemp("pages")
    return V.write_view([runs[0]], base / "one.html"), V.write_view(list(runs), base / "two.html")


def _expected_bars(run):
    """The bars each chart of one run must have, from its summary (not from the page)."""
    s = V.metrics.summarize(run.records, workflow=run.workflow)
    agents = s["micro"]["agents"]
    comp = s["compliance"]["agents"]
    rows = len(s["benchmarks"]) + 1 + (len(s["benchmarks"]) > 1)  # benchmarks, micro, macro
    return s, {"score-avg": rows, "agent-calls": len(agents), "agent-tokens": 2 * len(agents),
               "agent-latency": 2 * len(agents),
               "compliance": sum(1 + sum(1 for k in v["invalid_reasons"].values() if k) for v in comp.values())}


@needs_browser
@pytest.mark.parametrize("width", [1400, 390])
def test_the_report_fits_the_page_with_human_labels_and_charts(pages, runs, width):
    """At a desktop's 1,400 px and a phone's 390 px nothing is wider than the page, no raw summary
    key is visible, and each chart has a bar per agent / benchmark / reason of the run."""
    res = B.open_page(pages[0], size=f"{width},1400", frame_width=width if width < 500 else None)
    assert res["errors"] == [] and res["console"] == []
    assert res["inner_width"] == width
    assert res["scroll_width"] <= res["inner_width"] and res["too_wide"] == [], res["too_wide"]
    assert res["scrolls_sideways"] == []  # no table in a box of its own that scrolls sideways
    summary, want = _expected_bars(load_run(runs[0]))
    raw = {k for k in _keys(summary) if "_" in k}
    assert {"usage_unknown_calls", "calls_per_traj", "valid_rate", "missing_verify_tag"} <= raw  # the check can bite
    assert [k for k in raw if k in res["report_text"]] == []
    if width > 600:  # a phone shows the column heads as each cell's CSS label, which innerText leaves out
        assert "calls per trajectory" in res["report_text"] and "valid (%)" in res["report_text"]
        assert "latency p50 / p95 (s)" in res["report_text"]
        # one label table for the page and summary.md
        from drmas_bench.report.labels import label
        from drmas_bench.report.markdown import format_summary_markdown

        md = format_summary_markdown(summary)
        for k in ("calls_per_traj", "prompt_tokens_per_call", "completion_tokens_per_call", "tokens_per_question",
                  "invalid_reasons", "length_cut", "empty_responses", "evidence_recall", "call_latency_s"):
            assert label(k) in md and label(k) in res["report_text"], k
    assert dict(res["charts"]) == want


@needs_browser
def test_two_runs_list_what_changed_and_fit_a_phone(pages, runs):
    a = {(r["task"]["benchmark"], r["task"]["id"]): r["correct"] for r in load_run(runs[0]).records}
    b = {(r["task"]["benchmark"], r["task"]["id"]): r["correct"] for r in load_run(runs[1]).records}
    fixed = sum(1 for k in a if k in b and not a[k] and b[k])
    broken = sum(1 for k in a if k in b and a[k] and not b[k])
    assert fixed > 0
    res = B.open_page(pages[1], size="390,1400", frame_width=390)
    assert res["errors"] == [] and res["scroll_width"] <= res["inner_width"] == 390 and res["too_wide"] == []
    assert res["scrolls_sideways"] == []  # no table in a box of its own that scrolls sideways
    assert res["charts"][0] == ["changes", 3]
    assert f"fixed: {fixed}" in res["report_text"] and (broken == 0 or f"broken: {broken}" in res["report_text"])


def test_change_kinds_match_a_plain_loop(runs):
    ra, rb = load_run(runs[0]), load_run(runs[1])
    cs = V.sections.changes(ra.views, rb.views)
    a = {(r.benchmark, r.task_id): r.correct for r in ra.views}
    b = {(r.benchmark, r.task_id): r.correct for r in rb.views}
    want = {k: ("fixed" if not a[k] and b[k] else "broken" if a[k] and not b[k] else "unchanged") for k in a if k in b}
    assert {(c.benchmark, c.id): c.kind for c in cs} == want


def test_labels_and_values():
    from drmas_bench.report.labels import label, value

    assert label("usage_unknown_calls") == "calls with unknown usage" and label("calls_per_traj") == "calls per trajectory"
    assert label("pass^4") == "pass^4 (%)" and label("some_new_key") == "some new key"
    assert value("valid_rate", 0.25) == "25.0" and value("latency_s", {"p50": 1.0, "p95": 2.5}) == "1.00 / 2.50"
    assert value("usd_per_question", 0.000123456) == "0.0001235" and value("calls", None) == "–"


def test_natural_order_of_question_ids():
    ids = ["q10", "q2", "q1", "b"]
    assert sorted(ids, key=V._natural) == ["b", "q1", "q2", "q10"]


# ------------------------------------------------------------------ the leaderboard page


@pytest.fixture(scope="module")
def board(tmp_path_factory, runs):
    out = tmp_path_factory.mktemp("board")
    assert cli.main(["leaderboard", str(runs[0]), str(runs[1]), "--ci", "--n-boot", "50", "--out", str(out)]) == 0
    from drmas_bench import report

    tables = report.build_leaderboard([load_run(r) for r in runs], report.parse_metrics("avg@n,pass@n"), ci=True,
                                      paper=report.load_paper(), n_boot=50)
    return out / "leaderboard.html", tables


@needs_browser
def test_the_leaderboard_page_sorts_marks_and_plots(board):
    page, tables = board
    t = tables[0]
    col = 1 + t.columns.index(V.metrics.MICRO)
    res = B.open_page(page, f"sort=0:{col}", size="1400,1400")  # a number column sorts high to low first
    assert res["errors"] == [] and res["console"] == [] and res["tables"] == len(tables)
    value = {r.label: getattr(r.cells.get(V.metrics.MICRO), "value", None) for r in t.rows}
    assert res["before"] == [r.label for r in t.rows]
    assert res["after"] == sorted(value, key=lambda k: (value[k] is None, -(value[k] or 0.0)))
    assert res["after"] != res["before"]  # the click reordered the rows
    assert res["flags"] == sum(1 for tb in tables for r in tb.rows if r.source == "reproduced" and r.notes) > 0
    assert res["charts"] == [["pareto-search", 2, 2]]  # run b: fewer tokens, lower score; both on the front
    assert res["scroll_width"] <= res["inner_width"] and res["too_wide"] == []
    assert res["scrolls_sideways"] == []  # no table in a box of its own that scrolls sideways
    assert res["sorters_shown"] == 0  # the heads sort on a desktop


@needs_browser
def test_the_leaderboard_page_fits_a_phone(board):
    """Rows become cards (the heads hidden), so a select above each table sorts it."""
    res = B.open_page(board[0], size="390,1400", frame_width=390)
    assert res["errors"] == [] and res["inner_width"] == 390
    assert res["scroll_width"] <= 390 and res["too_wide"] == [], res["too_wide"]
    assert res["scrolls_sideways"] == []  # no table in a box of its own that scrolls sideways
    assert res["sorters_shown"] == res["tables"] == len(board[1])
