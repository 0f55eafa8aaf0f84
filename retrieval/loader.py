"""One entry point to open any retriever, and one to build any index.

``load_retriever(spec)`` where ``spec`` is

* ``bm25:DIR`` / ``dense:DIR`` / ``lucene:DIR``  an index directory of that kind,
* ``DIR``                                        an index directory (kind read from its manifest),
* ``http://host:port`` (or ``https://...``)      a running /retrieve server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from drmas_retrieval.base import RetrievalError, Retriever
from drmas_retrieval.store import KINDS, read_manifest


def parse_spec(spec: str | os.PathLike[str]) -> tuple[str, str]:
    """(kind, location) of a retriever spec; kind is one of bm25, dense, lucene, http."""
    s = os.fspath(spec)
    if s.startswith(("http://", "https://")):
        return "http", s
    head, sep, rest = s.partition(":")
    if sep and head in KINDS:
        if not rest:
            raise RetrievalError(f"retriever spec {s!r} names no directory")
        return head, rest
    return read_manifest(s)["kind"], s


def load_retriever(spec: str | os.PathLike[str], **options: Any) -> Retriever:
    """Open the retriever a spec names. ``options`` go to its constructor:
    bm25 (``mmap``, ``threads``), dense (``encoder``, ``device``, ``batch_size``, ``gpu``, ``gpu_shard``,
    ``gpu_fp16``, ``mmap``, ``ef_search``, ``nprobe``, ``threads``), lucene (``k1``, ``b``, ``threads``), http (``timeout``,
    ``connect_timeout``, ``retries``, ``backoff``, ``max_backoff``, ``batch_size``, ``body``).
    An unknown option is a RetrievalError naming it."""
    kind, where = parse_spec(spec)
    try:
        if kind == "http":
            from drmas_retrieval.client import HTTPRetriever

            return HTTPRetriever(where, **options)
        if not Path(where).is_dir():
            raise RetrievalError(f"index directory not found: {where}")
        if kind == "bm25":
            from drmas_retrieval.bm25 import BM25Retriever

            return BM25Retriever(where, **options)
        if kind == "dense":
            from drmas_retrieval.dense import DenseRetriever

            return DenseRetriever(where, **options)
        from drmas_retrieval.lucene import LuceneRetriever

        return LuceneRetriever(where, **options)
    except TypeError as e:
        if "unexpected keyword argument" in str(e):
            raise RetrievalError(f"{kind} retriever: {e}".replace("__init__() ", "")) from None
        raise


def build_index(kind: str, corpus: str | os.PathLike[str], out: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
    """Build an index of ``kind`` (bm25 | dense | lucene) from a corpus file into ``out``; return
    its manifest. ``options`` go to ``build_bm25`` / ``build_dense`` / ``build_lucene``."""
    if kind == "bm25":
        from drmas_retrieval.bm25 import build_bm25

        return build_bm25(corpus, out, **options)
    if kind == "dense":
        from drmas_retrieval.dense import build_dense

        return build_dense(corpus, out, **options)
    if kind == "lucene":
        from drmas_retrieval.lucene import build_lucene

        return build_lucene(corpus, out, **options)
    raise RetrievalError(f"unknown index kind {kind!r} (known: {', '.join(KINDS)})")
