"""Lucene BM25 via pyserini (the `lucene` extra). Without the extra, the error names it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from drmas_retrieval import RetrievalError, load_retriever
from drmas_retrieval.lucene import build_lucene

CORPUS = Path(__file__).parent / "data" / "retrieval_corpus.jsonl"
HAVE_PYSERINI = importlib.util.find_spec("pyserini") is not None


@pytest.mark.skipif(HAVE_PYSERINI, reason="pyserini is installed")
def test_missing_extra_names_it(tmp_path):
    with pytest.raises(RetrievalError, match=r"pip install drmas-bench\[lucene\]"):
        build_lucene(CORPUS, tmp_path / "lucene", progress=False)
    assert not (tmp_path / "lucene").exists()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_PYSERINI, reason="needs the lucene extra: pip install drmas-bench[lucene]")
def test_lucene_index_and_search(tmp_path):
    m = build_lucene(CORPUS, tmp_path / "lucene", progress=False)
    assert m["kind"] == "lucene" and m["n_passages"] == 24
    r = load_retriever(tmp_path / "lucene")
    hits = r.search(["Who designed the Amber Lighthouse?", "carnivorous plants with sticky droplets", "", "zzzz"], 3)
    assert {h.id for h in hits[0][:2]} == {"p0", "p2"}
    assert hits[1][0].id == "p9" and hits[1][0].title == "Sundew"
    assert hits[2] == [] and hits[3] == []
    assert r.search(["Who designed the Amber Lighthouse?"], 3) == hits[:1]  # batch and single agree
    r.close()
