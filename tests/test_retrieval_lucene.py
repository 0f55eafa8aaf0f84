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


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.skipif(not HAVE_PYSERINI, reason="needs the lucene extra: pip install drmas-bench[lucene]")
def test_lucene_on_the_mini_corpus_matches_bm25s(data_dir, tmp_path):
    """The two sparse backends score alike (same k1/b; Lucene adds Porter stemming): on the mini
    corpus, recall of a supporting passage (any@k) stays within 1 point of bm25s at every k."""
    from drmas_retrieval.bm25 import build_bm25
    from drmas_retrieval.evaluate import evaluate, read_questions

    corpus = data_dir / "corpus" / "mini_corpus.jsonl"
    questions = data_dir / "corpus" / "covered_questions.jsonl"
    if not corpus.is_file() or not questions.is_file():
        pytest.skip("mini corpus not in the data dir")
    m = build_lucene(corpus, tmp_path / "lucene", progress=False)
    assert m["n_passages"] == 25_200
    build_bm25(corpus, tmp_path / "bm25", progress=False)
    qs = read_questions(questions)
    ks = (1, 3, 5, 10)
    with load_retriever(tmp_path / "lucene") as lucene, load_retriever(tmp_path / "bm25") as bm25:
        ours = evaluate(lucene, qs, ks=ks, progress=False)["overall"]
        base = evaluate(bm25, qs, ks=ks, progress=False)["overall"]
    assert ours["n_with_support"] == base["n_with_support"] > 3000
    for k in ks:
        assert abs(ours[f"any@{k}"] - base[f"any@{k}"]) <= 0.01, (k, ours, base)
    assert ours["any@10"] > 0.97


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_PYSERINI, reason="needs the lucene extra: pip install drmas-bench[lucene]")
def test_search_eval_with_the_lucene_retriever(tmp_path):
    """`eval --retriever lucene:DIR`: the search workflow's searcher queries a Lucene index in-process."""
    import json

    from drmas_bench.api import EvalConfig, evaluate

    data = tmp_path / "data" / "qa" / "bamboogle"
    data.mkdir(parents=True)
    rows = [{"id": f"q{i}", "question": f"Who designed the Amber Lighthouse {i}?", "golden_answers": ["Kelmouth"]}
            for i in range(2)]
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_lucene(CORPUS, tmp_path / "idx", progress=False)
    s = evaluate(EvalConfig(model="tiny-random", suite="search", benchmarks=["bamboogle"], n=1, max_new_tokens=4,
                            data_dir=str(tmp_path / "data"), retriever=f"lucene:{tmp_path / 'idx'}",
                            engine_args={"device": "cpu"}, out=str(tmp_path / "run"), progress=False))
    assert sum(1 for _ in open(tmp_path / "run" / "samples.jsonl")) == 2
    cfg = (tmp_path / "run" / "config.yaml").read_text()
    assert "lucene" in cfg
