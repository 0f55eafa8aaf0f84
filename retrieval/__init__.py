"""drmas_retrieval: corpora, BM25 / dense indexes, the /retrieve server and client. Imports nothing from drmas_bench.

The pieces (each its own module; heavy libraries are imported only when used):

``base``      ``Hit``, ``Passage``, the ``Retriever`` interface, ``RetrievalError``
``corpus``    read / write corpus jsonl (``id`` + ``contents`` or ``title`` + ``text``), ``build_corpus``
``store``     the memory-mapped passage store and the index manifest (``drmas_index.json``)
``bm25``      bm25s BM25 (the embedded default)
``lucene``    Lucene BM25 via pyserini (extra: ``pip install drmas-bench[lucene]``)
``dense``     sentence encoder + FAISS (extra: ``pip install drmas-bench[dense]``), resumable build
``client``    ``HTTPRetriever``: the same interface over a /retrieve server
``server``    FastAPI ``/retrieve`` + ``/health``
``evaluate``  recall@k (all / any supporting passages), MRR, answer-string recall
``loader``    ``load_retriever(spec)`` and ``build_index(kind, corpus, out)``

Example::

    from drmas_retrieval import build_index, load_retriever
    build_index("bm25", "corpus.jsonl", "idx/bm25")
    with load_retriever("idx/bm25") as r:            # or "dense:idx/e5", "http://127.0.0.1:8000"
        for hit in r.search(["who wrote Hamlet?"], k=3)[0]:
            print(hit.id, hit.title, hit.score)
"""

from __future__ import annotations

from drmas_retrieval.base import Hit, Passage, RetrievalError, Retriever, format_contents, parse_contents
from drmas_retrieval.corpus import build_corpus, read_corpus, write_corpus
from drmas_retrieval.loader import build_index, load_retriever, parse_spec

__all__ = [
    "Hit", "Passage", "RetrievalError", "Retriever", "format_contents", "parse_contents",
    "build_corpus", "read_corpus", "write_corpus", "build_index", "load_retriever", "parse_spec",
]
