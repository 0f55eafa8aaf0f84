"""How big a corpus is, and whether the in-process BM25 (bm25s) can index it here, told before
anything is built.

bm25s holds every passage's token ids in memory until it builds its sparse matrix, and the build
copies them a few times, so its peak grows with the corpus text: ``BUILD_BYTES_PER_CORPUS_BYTE``
bytes per byte of corpus (measured with ``scripts/bench_retrieval.py --scale`` on 100-word
passages, wiki-18's size; docs/scaling.md, "Retrieval"). A build whose estimate is above the
memory available refuses at once, in one line naming the alternative (Lucene, whose index is
written to disk as it goes); one above half of it warns.
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path
from typing import Any

from drmas_retrieval.base import RetrievalError
from drmas_retrieval.corpus import require_corpus

BUILD_BYTES_PER_CORPUS_BYTE = 5.2  # peak RSS of a bm25s build per byte of corpus jsonl (measured 5.0 at 500k, 1M and 2M passages)
BUILD_BYTES_BASE = 150 * 2**20  # the interpreter, numpy, bm25s
SAMPLE_BYTES = 4 * 2**20  # the head of the corpus read to measure a passage's size
ALTERNATIVE = ("build a Lucene index instead (drmas-bench retrieval index --kind lucene, the lucene extra: "
               "its index is written to disk as it goes), or index part of the corpus (limit)")


def corpus_size(corpus: str | os.PathLike[str]) -> tuple[int, int]:
    """``(passages, text bytes)`` of a corpus file, estimated from its size and its first
    ``SAMPLE_BYTES`` (exact when the file is smaller). A ``.gz`` file is measured uncompressed:
    its compression ratio is taken from the same head."""
    p = require_corpus(corpus)
    size = p.stat().st_size
    with open(p, "rb") as raw:
        if p.suffix == ".gz":
            head, read_raw, whole = _gz_head(raw)
        else:
            head = raw.read(SAMPLE_BYTES)
            whole = len(raw.read(1)) == 0
            read_raw = len(head)
    lines = sum(1 for ln in head.split(b"\n") if ln.strip())
    if whole:
        return lines, len(head)
    text_bytes = int(size * len(head) / max(read_raw, 1))
    return int(lines * text_bytes / max(len(head), 1)), text_bytes


def _gz_head(raw: Any) -> tuple[bytes, int, bool]:
    """The first ``SAMPLE_BYTES`` of a gzip stream, the compressed bytes they took, and whether
    that was all of it (fed 1 KB at a time, so the compressed count is close)."""
    d = zlib.decompressobj(wbits=31)
    out, used = bytearray(), 0
    while len(out) < SAMPLE_BYTES:
        chunk = raw.read(1024)
        if not chunk:
            return bytes(out), used, True
        used += len(chunk)
        out += d.decompress(chunk)
    return bytes(out[:SAMPLE_BYTES]), used, False


def bm25_build_bytes(text_bytes: int) -> int:
    """About the peak memory of building a bm25s index over ``text_bytes`` of corpus jsonl."""
    return int(BUILD_BYTES_BASE + BUILD_BYTES_PER_CORPUS_BYTE * text_bytes)


def available_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def check_bm25_fits(corpus: str | os.PathLike[str], limit: int | None = None, available: int | None = None) -> int:
    """Refuse (RetrievalError, one line) a bm25s build that would not fit in the memory available
    here, warn (stderr) above half of it; return the estimated bytes. ``limit``: only the first N
    passages are indexed. ``available``: bytes free (default: what the system says now)."""
    n, text = corpus_size(corpus)
    if limit is not None and n > limit:
        text, n = int(text * limit / n), limit
    need = bm25_build_bytes(text)
    free = available_bytes() if available is None else available
    gb = 2**30
    what = f"bm25 (bm25s, in process): indexing about {n:,} passages of {Path(corpus).name} needs about {need / gb:.1f} GB"
    if need > free:
        raise RetrievalError(f"{what}, {free / gb:.1f} GB are available here; {ALTERNATIVE}")
    if need > free / 2:
        print(f"[retrieval] warning: {what}, more than half of the {free / gb:.1f} GB available here; if it runs "
              f"out, {ALTERNATIVE}", file=sys.stderr)
    return need


# CPU per query of a bm25s search, per passage indexed (it scores every passage, then takes the
# top k): measured 8.2 ms at 250k, 17.9 ms at 500k, 42.0 ms at 1M and 74.6 ms at 2M passages (one
# thread), 33-42 ns a passage; so the warning starts at about 2.6M passages (2.8M by the 1M-2M line)
BM25_QUERY_S_PER_PASSAGE = 3.9e-8
SLOW_QUERY_S = 0.1


def bm25_query_warning(n_passages: int) -> str | None:
    """One line when a bm25s index of ``n_passages`` answers slower than ``SLOW_QUERY_S`` a query
    (on one core), naming Lucene; None below that."""
    est = BM25_QUERY_S_PER_PASSAGE * n_passages
    if est <= SLOW_QUERY_S:
        return None
    return (f"[retrieval] warning: bm25 (bm25s, in process) scores all {n_passages:,} passages for each query: about "
            f"{est:.2f} s of CPU a query; a Lucene index (--kind lucene) reads only the passages holding the query's terms")
