"""drmas_retrieval: corpus reading / building, passage store, BM25 (bm25s), evaluation, loader, CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drmas_retrieval import Hit, Passage, RetrievalError, Retriever, build_corpus, load_retriever, read_corpus
from drmas_retrieval.base import format_contents, parse_contents
from drmas_retrieval.bm25 import BM25Params, BM25Retriever, build_bm25
from drmas_bench.grading.qa import normalize_qa
from drmas_retrieval.evaluate import contains_answer, evaluate, format_report, normalize_answer, read_questions
from drmas_retrieval.loader import parse_spec
from drmas_retrieval.store import MANIFEST, PassageStore, write_passages

DATA = Path(__file__).parent / "data"
CORPUS = DATA / "retrieval_corpus.jsonl"
QUESTIONS = DATA / "retrieval_questions.jsonl"


def write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bm25_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("idx") / "bm25"
    build_bm25(CORPUS, out, progress=False)
    return out


# ------------------------------------------------------------------------------------ corpus


def test_contents_round_trip():
    assert format_contents("Kelmouth", "A town.") == '"Kelmouth"\nA town.'
    assert parse_contents('"Kelmouth"\nA town.\nMore.') == ("Kelmouth", "A town.\nMore.")
    assert parse_contents("Plain title\ntext") == ("Plain title", "text")
    assert parse_contents("no newline at all") == ("", "no newline at all")


def test_read_corpus_both_forms(tmp_path):
    f = write_lines(tmp_path / "c.jsonl", [
        {"id": "a", "contents": '"Title A"\nText of A.'},
        "",
        {"id": 7, "title": "Title B", "text": "Text of B.", "sources": ["x"]},
        {"id": "c", "text": "No title."},
    ])
    ps = list(read_corpus(f))
    assert ps == [Passage("a", "Title A", "Text of A."), Passage("7", "Title B", "Text of B."), Passage("c", "", "No title.")]
    assert [p.id for p in read_corpus(f, limit=2)] == ["a", "7"]
    assert ps[0].contents == '"Title A"\nText of A.'


@pytest.mark.parametrize("bad, reason", [
    ('{"id": "a", "title": "T", "text": "x"', "not valid JSON"),
    ('["a", "b"]', "expected a JSON object"),
    ('{"title": "T", "text": "x"}', "missing or invalid 'id'"),
    ('{"id": "a", "title": "T"}', "needs 'contents' or 'title' + 'text'"),
    ('{"id": "a", "contents": 5}', "'contents' must be a string"),
])
def test_read_corpus_malformed_line_names_file_and_line(tmp_path, bad, reason):
    f = write_lines(tmp_path / "bad.jsonl", [{"id": "ok", "title": "T", "text": "x"}, bad])
    with pytest.raises(RetrievalError, match=r"bad\.jsonl:2: .*" + re.escape(reason)):
        list(read_corpus(f))
    with pytest.raises(RetrievalError, match="corpus file not found"):
        list(read_corpus(tmp_path / "missing.jsonl"))


def test_build_corpus_from_dataset_shapes(tmp_path):
    hf = write_lines(tmp_path / "hotpot_hf.jsonl", [{"id": "q1", "question": "?", "context": {
        "title": ["Alpha", "Beta"], "sentences": [["Alpha is one.", " It is first."], ["Beta is two."]]}}])
    orig = tmp_path / "hotpot_orig.json"
    orig.write_text(json.dumps([{"_id": "q2", "context": [["Alpha", ["Alpha is one.", " It is first."]],
                                                         ["Gamma", ["Gamma  is three."]]]}]))
    ircot = write_lines(tmp_path / "ircot.jsonl", [{"question_id": "q3", "contexts": [
        {"id": "0", "title": "Delta", "paragraph_text": "Delta is four.", "is_supporting": True}]}])
    musique = tmp_path / "musique.json"
    musique.write_text(json.dumps([{"id": "q4", "paragraphs": [
        {"idx": 0, "title": "Epsilon", "paragraph_text": "Epsilon is five."},
        {"idx": 1, "title": "Empty", "paragraph_text": ""}]}]))
    popqa = tmp_path / "popqa.json"
    popqa.write_text(json.dumps([{"id": 0, "paragraphs": [{"title": "Zeta", "text": "Zeta is six.", "is_supporting": True}]}]))
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"title": "Eta", "text": "Eta is seven."}, {"title": "Beta", "text": "Beta is two."}]))
    out = tmp_path / "corpus.jsonl"
    n = build_corpus([hf, orig, ircot, musique, popqa, rows], out)
    got = [(p.id, p.title, p.text) for p in read_corpus(out)]
    assert got == [("0", "Alpha", "Alpha is one. It is first."), ("1", "Beta", "Beta is two."),
                   ("2", "Gamma", "Gamma is three."), ("3", "Delta", "Delta is four."),
                   ("4", "Epsilon", "Epsilon is five."), ("5", "Zeta", "Zeta is six."), ("6", "Eta", "Eta is seven.")]
    assert n == 7
    assert build_corpus([hf, orig], tmp_path / "all.jsonl", dedupe=False) == 4
    build_corpus([ircot], tmp_path / "ref.jsonl", contents=True)
    assert json.loads((tmp_path / "ref.jsonl").read_text()) == {"id": "0", "contents": '"Delta"\nDelta is four.'}
    with pytest.raises(RetrievalError, match="no paragraphs found"):
        build_corpus([write_lines(tmp_path / "q.jsonl", [{"question": "?"}])], tmp_path / "x.jsonl")


def test_passage_store(tmp_path):
    ps = [Passage(str(i), f"T{i}", "ünïcode text " * i) for i in range(5)]
    assert write_passages(ps, tmp_path) == 5
    store = PassageStore(tmp_path)
    assert len(store) == 5 and store.get(3) == ps[3] and store.get_many([4, 0]) == [ps[4], ps[0]]
    store.close()
    with pytest.raises(RetrievalError, match="duplicate passage id '1'"):
        write_passages([Passage("1", "", "a"), Passage("1", "", "b")], tmp_path)


# --------------------------------------------------------------------------------------- BM25


def test_bm25_finds_the_right_passages(bm25_dir):
    r = BM25Retriever(bm25_dir)
    hits = r.search(["Who designed the Amber Lighthouse?", "carnivorous plants with sticky droplets"], k=3)
    assert len(hits) == 2 and len(hits[0]) == 3
    assert {h.id for h in hits[0][:2]} == {"p0", "p2"}
    assert hits[1][0].id == "p9"
    assert hits[0][0].score >= hits[0][1].score >= hits[0][2].score > 0
    assert r.search(["zzzz qqqq", ""], k=5) == [[], []]  # no term in common: no hits
    assert len(r.search_one("Kelmouth", k=100)) <= 24
    assert r.search([], 3) == []
    with pytest.raises(ValueError):
        r.search(["x"], 0)
    with pytest.raises(TypeError):
        r.search("a string, not a list", 3)  # type: ignore[arg-type]
    r.close()


def test_bm25_save_load_round_trip_same_hits(bm25_dir, tmp_path):
    queries = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines()]
    a = BM25Retriever(bm25_dir, mmap=True).search(queries, k=5)
    b = BM25Retriever(bm25_dir, mmap=False).search(queries, k=5)
    # an index built again in a second directory gives the very same hits
    build_bm25(CORPUS, tmp_path / "again", progress=False)
    c = load_retriever(tmp_path / "again").search(queries, k=5)
    assert a == b == c
    assert all(isinstance(h, Hit) and h.title and h.text for row in a for h in row)


def test_bm25_params_and_existing_index(bm25_dir, tmp_path):
    m = json.loads((bm25_dir / MANIFEST).read_text())
    assert m["kind"] == "bm25" and m["n_passages"] == 24 and m["params"]["k1"] == 0.9
    with pytest.raises(RetrievalError, match="already holds an index"):
        build_bm25(CORPUS, bm25_dir, progress=False)
    build_bm25(CORPUS, tmp_path / "lim", params=BM25Params(k1=1.2, b=0.75), limit=5, progress=False)
    r = BM25Retriever(tmp_path / "lim")
    assert len(r.passages) == 5 and r.params.k1 == 1.2
    with pytest.raises(RetrievalError, match="PyStemmer"):
        try:
            import Stemmer  # noqa: F401
            pytest.skip("PyStemmer is installed")
        except ImportError:
            build_bm25(CORPUS, tmp_path / "stem", params=BM25Params(stemmer="english"), progress=False)


# ------------------------------------------------------------------------------------- loader


def test_load_retriever_specs(bm25_dir, tmp_path):
    assert parse_spec(f"bm25:{bm25_dir}") == ("bm25", str(bm25_dir))
    assert parse_spec(bm25_dir) == ("bm25", str(bm25_dir))
    assert parse_spec("http://127.0.0.1:9/") == ("http", "http://127.0.0.1:9/")
    assert isinstance(load_retriever(f"bm25:{bm25_dir}"), BM25Retriever)
    with pytest.raises(RetrievalError, match="is a bm25 index, not dense"):
        load_retriever(f"dense:{bm25_dir}")
    with pytest.raises(RetrievalError, match="index directory not found"):
        load_retriever(tmp_path / "nowhere")
    with pytest.raises(RetrievalError, match=f"no {MANIFEST}"):
        load_retriever(tmp_path)
    with pytest.raises(RetrievalError, match="unexpected keyword argument 'bogus'"):
        load_retriever(bm25_dir, bogus=1)


def test_retrieval_does_not_import_the_harness():
    code = ("import sys, drmas_retrieval, drmas_retrieval.bm25, drmas_retrieval.dense, drmas_retrieval.lucene, "
            "drmas_retrieval.server, drmas_retrieval.client, drmas_retrieval.evaluate; "
            "bad = [m for m in sys.modules if m.startswith('drmas_bench')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------------- evaluate


class FixedRetriever(Retriever):
    """Returns a fixed ranking of passage ids for every query."""

    def __init__(self, ranking: dict[str, list[str]]):
        self.ranking = ranking

    def search(self, queries, k=3):
        return [[Hit(pid, f"title {pid}", f"text of {pid} with answer {pid.upper()}", 1.0) for pid in self.ranking[q][:k]]
                for q in queries]


def test_evaluate_metrics_exact(tmp_path):
    f = write_lines(tmp_path / "q.jsonl", [
        {"dataset": "d", "split": "s", "id": 1, "question": "q1", "golden_answers": ["answer B!"], "supporting_passage_ids": ["a", "b"]},
        {"dataset": "d", "split": "s", "id": 2, "question": "q2", "golden_answers": ["nothing"], "supporting_passage_ids": ["z"]},
        {"dataset": "e", "id": 3, "question": "q3", "answer": "answer X"},
    ])
    qs = read_questions(f)
    assert [q.group for q in qs] == ["d/s", "d/s", "e"]
    r = FixedRetriever({"q1": ["c", "a", "b", "d"], "q2": ["a", "b", "c", "d"], "q3": ["y", "x"]})
    res = evaluate(r, qs, ks=[1, 3], progress=False)
    ov = res["overall"]
    assert ov["n"] == 3 and ov["n_with_support"] == 2
    assert ov["all@1"] == 0 and ov["all@3"] == 0.5 and ov["any@1"] == 0 and ov["any@3"] == 0.5
    assert ov["mrr"] == pytest.approx((1 / 2 + 0) / 2)
    assert ov["ans@1"] == 0 and ov["ans@3"] == pytest.approx(2 / 3)  # q1 finds "answer b" at rank 3, q3 at rank 2
    assert res["groups"]["e"]["all@1"] is None
    table = format_report(res)
    assert "| d/s" in table and "| all" in table


def test_answer_normalisation():
    assert normalize_answer("The  Chief-of-Protocol!") == "chiefofprotocol"  # punctuation removed, as in SQuAD
    assert contains_answer(normalize_answer("She was Chief of Protocol."), ["chief of protocol"])
    # one normalisation: the QA grading's (what rewards use), so retrieval and grading agree
    assert normalize_answer("Jay-Z") == normalize_qa("Jay-Z") == "jayz"
    assert contains_answer(normalize_answer("a song by Jay-Z."), [normalize_answer("Jay-Z")])
    assert not contains_answer("polite people", ["pol"])  # word boundaries, not substrings
    assert not contains_answer("anything", [""])


def test_read_questions_errors(tmp_path):
    with pytest.raises(RetrievalError, match=r"q\.jsonl:1: not valid JSON"):
        read_questions(write_lines(tmp_path / "q.jsonl", ["{oops"]))
    with pytest.raises(RetrievalError, match=r"q2\.jsonl:1: needs a non-empty 'question'"):
        read_questions(write_lines(tmp_path / "q2.jsonl", [{"golden_answers": ["a"]}]))
    with pytest.raises(RetrievalError, match="questions file not found"):
        read_questions(tmp_path / "none.jsonl")


# ---------------------------------------------------------------------------------------- CLI


def test_cli_index_eval_and_errors(tmp_path, capsys):
    from drmas_bench.cli import main

    out = tmp_path / "idx"
    assert main(["retrieval", "index", "--corpus", str(CORPUS), "--kind", "bm25", "--out", str(out)]) == 0
    assert "bm25 index of 24 passages" in capsys.readouterr().out
    js = tmp_path / "m.json"
    assert main(["retrieval", "eval", "--index", str(out), "--questions", str(QUESTIONS), "--k", "1,3", "--json", str(js)]) == 0
    text = capsys.readouterr().out
    assert "all@3" in text and "fixture/test" in text
    m = json.loads(js.read_text())
    assert m["overall"]["any@3"] == 1.0 and m["overall"]["ans@3"] == 1.0
    assert main(["retrieval", "eval", "--index", str(out), "--questions", str(QUESTIONS), "--k", "1,x"]) == 2
    assert main(["retrieval", "eval", "--index", str(tmp_path / "none"), "--questions", str(QUESTIONS)]) == 2
    assert main(["retrieval", "index", "--corpus", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("drmas-bench: error:") == 3 and "corpus file not found" in err
    corpus = tmp_path / "built.jsonl"
    assert main(["retrieval", "corpus", "--from", str(CORPUS), "--out", str(corpus)]) == 0
    assert len(corpus.read_text().splitlines()) == 24


@pytest.mark.parametrize("action", ["index", "eval", "serve", "corpus"])
def test_cli_help_has_an_example(action, capsys):
    from drmas_bench.cli import main

    with pytest.raises(SystemExit) as e:
        main(["retrieval", action, "--help"])
    assert e.value.code == 0
    assert "example" in capsys.readouterr().out


# ------------------------------------------------------------------------------ the real data


@pytest.mark.data
def test_bm25_on_the_mini_corpus(data_dir, tmp_path):
    corpus = data_dir / "corpus" / "mini_corpus.jsonl"
    questions = data_dir / "corpus" / "covered_questions.jsonl"
    if not corpus.is_file() or not questions.is_file():
        pytest.skip("mini corpus not in the data dir")
    t0 = time.perf_counter()
    build_bm25(corpus, tmp_path / "bm25", progress=False)
    assert time.perf_counter() - t0 < 60
    res = evaluate(load_retriever(tmp_path / "bm25"), read_questions(questions, limit=150), ks=[10], progress=False)
    assert res["overall"]["any@10"] > 0.9 and res["overall"]["ans@10"] > 0.5
