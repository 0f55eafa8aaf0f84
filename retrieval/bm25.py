"""BM25 with ``bm25s``: the embedded default (pure Python + numpy, in-process, no Java).

Build: stream the corpus once, writing the passage store and tokenizing ``"Title"\\ntext`` in
chunks; index with ``bm25s.BM25``; save the sparse matrix under ``DIR/bm25s/``. Load: the matrix
is memory-mapped (``bm25s.BM25.load(dir, mmap=True)``), so a server starts at once and several
processes share the pages.

Defaults follow Anserini / pyserini (k1 = 0.9, b = 0.4, Lucene's BM25 variant), so the
``bm25`` and ``lucene`` backends score alike; tokenization differs (bm25s: lower-cased words of
2+ characters, English stop words removed, no stemming unless PyStemmer is installed and asked for;
Lucene: its English analyzer with Porter stemming).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from drmas_retrieval.base import Hit, Passage, RetrievalError, Retriever, check_search_args
from drmas_retrieval.corpus import count_passages, read_corpus, require_corpus
from drmas_retrieval.sizing import bm25_query_warning, check_bm25_fits
from drmas_retrieval.store import (PassageStore, corpus_fingerprint, prepare_out_dir, read_manifest,
                                   write_manifest, write_passages)

SUBDIR = "bm25s"


@dataclass
class BM25Params:
    """BM25 options.

    ``k1``, ``b``      term-frequency saturation and length normalisation (default 0.9 / 0.4, Anserini's).
    ``method``         bm25s scoring variant: lucene (default), robertson, atire, bm25l, bm25+.
    ``stopwords``      "en" (default) or "none".
    ``stemmer``        None (default) or a PyStemmer language, e.g. "english" (needs ``pip install PyStemmer``).
    ``lower``          lower-case before tokenizing (default True).
    ``token_pattern``  the regular expression of a token (default: words of 2+ word characters).
    ``chunk_size``     passages tokenized per chunk while building (default 10,000).
    """

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"
    stopwords: str = "en"
    stemmer: str | None = None
    lower: bool = True
    token_pattern: str = r"(?u)\b\w\w+\b"
    chunk_size: int = 10_000

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("chunk_size")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BM25Params":
        unknown = set(d) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise RetrievalError(f"unknown BM25 option(s): {', '.join(sorted(unknown))}")
        return cls(**d)


def _stemmer(name: str | None) -> Callable[..., Any] | None:
    if not name:
        return None
    try:
        import Stemmer  # PyStemmer
    except ImportError:
        raise RetrievalError(f"BM25 stemmer {name!r} needs PyStemmer: pip install PyStemmer") from None
    return Stemmer.Stemmer(name).stemWord


def _stopwords(p: BM25Params) -> str | list[str]:
    return [] if p.stopwords in ("none", "", None) else p.stopwords


def build_bm25(corpus: str | os.PathLike[str], out: str | os.PathLike[str], params: BM25Params | None = None,
               overwrite: bool = False, progress: bool = True, limit: int | None = None,
               check_memory: bool = True) -> dict[str, Any]:
    """Build a bm25s index of a corpus file into ``out``; return the manifest.

    Options: ``params`` (BM25Params), ``overwrite`` an existing index, ``progress`` bars (tqdm),
    ``limit`` = index only the first N passages (tests, quick looks). ``check_memory``: first
    estimate the build's peak memory from the corpus size and refuse, in one line naming Lucene,
    when it is above the memory available (``sizing.check_bm25_fits``)."""
    import bm25s
    from bm25s.tokenization import Tokenized, Tokenizer
    from tqdm import tqdm

    require_corpus(corpus)
    if check_memory:
        check_bm25_fits(corpus, limit)
    p = params or BM25Params()
    t0 = time.perf_counter()
    out_dir = prepare_out_dir(out, overwrite)
    tok = Tokenizer(lower=p.lower, splitter=p.token_pattern, stopwords=_stopwords(p), stemmer=_stemmer(p.stemmer))
    ids: list[list[int]] = []
    total = count_passages(corpus) if progress and limit is None else limit
    bar = tqdm(total=total, desc="bm25: tokenize", unit="psg", disable=not progress)

    def stream() -> Iterator[Passage]:
        chunk: list[str] = []
        for ps in read_corpus(corpus, limit=limit):
            chunk.append(ps.contents)
            yield ps
            if len(chunk) >= p.chunk_size:
                ids.extend(tok.tokenize(chunk, update_vocab=True, return_as="ids", show_progress=False))
                bar.update(len(chunk))
                chunk.clear()
        if chunk:
            ids.extend(tok.tokenize(chunk, update_vocab=True, return_as="ids", show_progress=False))
            bar.update(len(chunk))

    n = write_passages(stream(), out_dir)
    bar.close()
    if n == 0:
        raise RetrievalError(f"corpus {corpus} holds no passages")
    model = bm25s.BM25(k1=p.k1, b=p.b, method=p.method)
    model.index(Tokenized(ids=ids, vocab=tok.get_vocab_dict()), show_progress=progress)
    del ids
    model.save(str(out_dir / SUBDIR), show_progress=False)
    return write_manifest(out_dir, "bm25", n, p.to_dict(), corpus_fingerprint(corpus), time.perf_counter() - t0)


class BM25Retriever(Retriever):
    """In-process BM25 over a bm25s index directory.

    Options: ``mmap`` (default True) memory-maps the index instead of reading it into RAM;
    ``threads`` = bm25s retrieval threads (default 0: the calling thread; -1: all cores).
    Passages with score 0 (no query term in common) are not returned."""

    kind = "bm25"

    def __init__(self, index_dir: str | os.PathLike[str], mmap: bool = True, threads: int = 0):
        import bm25s

        self.dir = Path(index_dir)
        self.manifest = read_manifest(self.dir, "bm25")
        self.params = BM25Params.from_dict(self.manifest["params"])
        self.passages = PassageStore(self.dir)
        try:
            self.model = bm25s.BM25.load(str(self.dir / SUBDIR), mmap=mmap, load_corpus=False, show_progress=False)
        except (OSError, ValueError) as e:
            raise RetrievalError(f"{self.dir / SUBDIR}: cannot load the bm25s index ({e})") from None
        self.threads = threads
        self._stem = _stemmer(self.params.stemmer)
        slow = bm25_query_warning(len(self.passages))
        if slow:
            print(slow, file=sys.stderr)

    def tokenize(self, queries: list[str]) -> list[list[str]]:
        import bm25s

        p = self.params
        return bm25s.tokenize(queries, lower=p.lower, token_pattern=p.token_pattern, stopwords=_stopwords(p),
                              stemmer=self._stem, return_ids=False, show_progress=False)

    def search(self, queries: list[str], k: int = 3) -> list[list[Hit]]:
        check_search_args(queries, k)
        if not queries:
            return []
        kk = min(k, len(self.passages))
        rows, scores = self.model.retrieve(self.tokenize(list(queries)), k=kk, show_progress=False,
                                           n_threads=self.threads)
        out: list[list[Hit]] = []
        for r_row, s_row in zip(rows, scores):
            hits = []
            for r, s in zip(r_row, s_row):
                if s > 0:
                    ps = self.passages.get(int(r))
                    hits.append(Hit(ps.id, ps.title, ps.text, float(s)))
            out.append(hits)
        return out

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "index": self.dir.name, "n_passages": len(self.passages), "params": self.params.to_dict()}

    def close(self) -> None:
        self.passages.close()
