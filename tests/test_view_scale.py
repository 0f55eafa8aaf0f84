"""The run viewer on large runs: above ``PACK_ROWS`` trajectories the list's rows are packed and the
turns live beside the page (``<page>_files/``), loaded when opened; every filter still works in
Chromium (each count checked against the rows unpacked here); at 100,000 trajectories the page is
under 5 MB; the viewer reads a run a record at a time, so its peak memory grows by a small, bounded
amount per trajectory (slow tier). The large runs are written as the store writes them (samples,
compact records, index) from the records of a real scripted search run (`bench_view.synth_run`)."""

from __future__ import annotations

import base64
import gzip
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from drmas_bench.report import view as V
from drmas_bench.report.runs import load_run

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_view", ROOT / "scripts" / "bench_view.py")
B = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(B)

needs_browser = pytest.mark.skipif(B.browser() is None, reason="no headless Chromium (Debian: apt-get install -y chromium)")


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return B.scripted_search_run(tmp_path_factory.mktemp("scale") / "src", questions=48, n=2)


def _rows(page: Path) -> list[dict]:
    index = json.loads(re.search(r'<script type="application/json" id="index">(.*?)</script>', page.read_text(),
                                 re.DOTALL).group(1).replace("<\\/", "</"))
    return json.loads(gzip.decompress(base64.b64decode(index["runs"][0]["rows_packed"])))


def _check_filters(page: Path, total: int) -> None:
    rows = _rows(page)
    assert len(rows) == total
    bench, route, k = rows[0]["b"], rows[-1]["route"], rows[0]["k"]
    word = rows[len(rows) // 2]["q"].split()[-1].lower()
    cases = {"": total, f"bench={bench}": sum(r["b"] == bench for r in rows),
             "correct=correct": sum(r["c"] is True for r in rows), "correct=incorrect": sum(r["c"] is False for r in rows),
             "valid=invalid": sum(r["nv"] > 0 for r in rows), "valid=valid": sum(r["nv"] == 0 for r in rows),
             f"route={route}": sum(r["route"] == route for r in rows), f"k={k}": sum(str(r["k"]) == str(k) for r in rows),
             f"text={word}": sum(word in (r["q"] + " " + r["id"] + " " + r["b"] + " " + (r["a"] or "")).lower() for r in rows)}
    queries = [query + ("&" if query else "") + f"open={max(0, want - 1)}" for query, want in cases.items()]
    results = B.open_queries(page, queries)  # one browser, a frame per query
    assert len(results) == len(cases)
    for (query, want), res in zip(cases.items(), results):
        assert res["errors"] == [] and res["shown"] == want, (query, res.get("errors"), res.get("shown"), want)
        assert want == 0 or res["turns"] > 0, query  # the last row shown opens: its chunk is read from the folder


def _page_and_files(page: Path) -> tuple[bytes, dict[str, bytes]]:
    folder = page.with_name(page.stem + "_files")
    return page.read_bytes(), {f.name: f.read_bytes() for f in sorted(folder.iterdir())}


@needs_browser
@pytest.mark.slow
def test_a_run_above_the_packing_size_keeps_its_turns_beside_the_page_and_filters_work(tmp_path, src):
    total = V.PACK_ROWS + 500
    big = B.synth_run(src, tmp_path / "big", total)
    page = V.write_view([big], tmp_path / "big.html")
    files = tmp_path / "big_files"
    assert len(list(files.glob("chunk-0-*.js"))) == -(-total // V.CHUNK)
    assert 'id="chunk-' not in page.read_text()
    streamed = _page_and_files(page)
    # the same page from samples.jsonl alone (no compact records) and from the records held in memory
    (big / "records.compact.jsonl").unlink()
    assert _page_and_files(V.write_view([big], tmp_path / "big.html")) == streamed
    made: dict[str, bytes] = {}
    html = V.render([load_run(big)], files="big_files", write=lambda n, t: made.__setitem__(n, t.encode("ascii")))
    assert (html.encode("utf-8"), made) == streamed
    _check_filters(page, total)
    shutil.rmtree(files)  # the folder lost: the list still works, opening a trajectory says what is missing
    res = B.open_page(page, "open=3")
    assert res["shown"] == total and res["turns"] == 0 and any("big_files" in e for e in res["errors"])


@needs_browser
@pytest.mark.slow
def test_the_page_of_a_100k_run_stays_under_5_mb(tmp_path, src):
    big = B.synth_run(src, tmp_path / "big", 100_000)
    page = V.write_view([big], tmp_path / "big.html")
    print(f"page {page.stat().st_size / 1e6:.2f} MB, beside it "
          f"{sum(f.stat().st_size for f in (tmp_path / 'big_files').iterdir()) / 1e6:.1f} MB")
    assert page.stat().st_size <= 5_000_000
    _check_filters(page, 100_000)


@pytest.mark.slow
def test_the_viewers_peak_memory_grows_little_with_the_run(tmp_path, src):
    """`drmas-bench view` in a child process at 4,000 and 16,000 trajectories: peak RSS grows by at
    most 5 KB per trajectory (the records it reads are 8.5 KB of JSON each; holding them, as a
    viewer that loads the run does, costs ~38 KB per trajectory here; about 2 KB was measured). What
    remains per trajectory is its list row and byte range (~0.5 KB) and the streamed summary's
    numbers (~250 bytes)."""
    peak = {}
    for n in (4_000, 16_000):
        run = B.synth_run(src, tmp_path / f"run-{n}", n)
        cost = B.view_cost(run, tmp_path / f"page-{n}.html")
        assert cost["rc"] == 0
        peak[n] = cost["peak_rss_mb"] * 1024 * 1024
        shutil.rmtree(run)
    per = (peak[16_000] - peak[4_000]) / 12_000
    print(f"peak RSS {peak[4_000] / 2**20:.0f} -> {peak[16_000] / 2**20:.0f} MB: {per:.0f} bytes per trajectory")
    assert per <= 5_000
