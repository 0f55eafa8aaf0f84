"""The in-process BM25's size guard: the corpus measured from its head, a build that would not fit
refused before anything is written (one line naming Lucene), one near the limit warned about."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from drmas_retrieval import RetrievalError, sizing
from drmas_retrieval.bm25 import build_bm25

CORPUS = Path(__file__).parent / "data" / "retrieval_corpus.jsonl"


def write_corpus(path: Path, n: int, seed: int = 0) -> int:
    """``n`` passages of 20-180 random words; returns the bytes written."""
    rng = random.Random(seed)
    lines = [json.dumps({"id": str(i), "title": f"t{i}", "text": " ".join(f"w{rng.randrange(5000)}" for _ in range(rng.randint(20, 180)))})
             for i in range(n)]
    data = ("\n".join(lines) + "\n").encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return len(data)


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz"])
def test_corpus_size_from_its_head(tmp_path, monkeypatch, name):
    path = tmp_path / name
    text = write_corpus(path, 3000)
    assert sizing.corpus_size(path) == (3000, text)  # small: read whole, exact
    monkeypatch.setattr(sizing, "SAMPLE_BYTES", 64 * 1024)  # now only the head is read
    n, est = sizing.corpus_size(path)
    assert abs(n - 3000) / 3000 < 0.1 and abs(est - text) / text < 0.1


def test_a_build_that_cannot_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(sizing, "available_bytes", lambda: 10 * 2**20)
    out = tmp_path / "idx"
    with pytest.raises(RetrievalError) as err:
        build_bm25(CORPUS, out, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "--kind lucene" in msg and "24 passages" in msg and "GB are available" in msg
    assert not out.exists()
    m = build_bm25(CORPUS, out, progress=False, check_memory=False)  # the caller may know better
    assert m["n_passages"] == 24


def test_near_the_limit_warns_and_builds(tmp_path, monkeypatch, capsys):
    need = sizing.bm25_build_bytes(CORPUS.stat().st_size)
    monkeypatch.setattr(sizing, "available_bytes", lambda: int(need * 1.5))
    assert build_bm25(CORPUS, tmp_path / "idx", progress=False)["n_passages"] == 24
    assert "warning: bm25 (bm25s, in process)" in capsys.readouterr().err


def test_limit_scales_the_estimate(tmp_path):
    path = tmp_path / "c.jsonl"
    text = write_corpus(path, 400)
    full = sizing.check_bm25_fits(path, available=2**50)
    part = sizing.check_bm25_fits(path, limit=100, available=2**50)
    assert full == sizing.bm25_build_bytes(text)
    assert part - sizing.BUILD_BYTES_BASE == pytest.approx((full - sizing.BUILD_BYTES_BASE) / 4, abs=8)
    with pytest.raises(RetrievalError, match="about 400 passages of c.jsonl"):
        sizing.check_bm25_fits(path, available=full - 1)


def test_a_large_bm25s_index_warns_that_queries_are_slow():
    assert sizing.bm25_query_warning(25_200) is None  # the mini corpus
    line = sizing.bm25_query_warning(21_015_324)  # wiki-18
    assert line is not None and "\n" not in line and "--kind lucene" in line and "21,015,324 passages" in line
    assert sizing.bm25_query_warning(int(sizing.SLOW_QUERY_S / sizing.BM25_QUERY_S_PER_PASSAGE) + 10) is not None


# scripts/bench_retrieval.py --scale on 100-word passages (docs/scaling.md, "Retrieval at scale"):
# passages -> (corpus jsonl bytes, bm25s build peak RSS MiB, CPU ms a query)
MEASURED = {1_000_000: (729_564_234, 3652, 42.0), 2_000_000: (1_460_226_019, 7177, 74.6)}


def test_the_thresholds_agree_with_the_measured_builds_and_queries():
    for n, (corpus_bytes, peak_mib, query_ms) in MEASURED.items():
        est = sizing.bm25_build_bytes(corpus_bytes) / 2**20
        assert peak_mib <= est <= 1.1 * peak_mib  # above the measured peak, not far above
        assert sizing.bm25_query_warning(n) is None and query_ms < 1000 * sizing.SLOW_QUERY_S
    # the 1M-2M line reaches 0.1 s of CPU a query at about 2.8M passages: warned by then
    assert sizing.bm25_query_warning(2_800_000) is not None
