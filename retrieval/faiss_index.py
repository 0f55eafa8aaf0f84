"""FAISS for dense retrieval: which build is installed, the index kinds and their options, the
memory an index needs and how it is placed on GPUs (sharded or replicated).

``flat`` (exact inner product, the reference's choice), ``hnsw`` (graph search), ``ivf`` (inverted
lists) and ``ivfpq`` (inverted lists of product-quantised codes, ``pq_m`` bytes per vector) are the
kinds; :func:`gpu_placement` is the placement decision and :func:`index_bytes` its memory.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from drmas_retrieval.base import RetrievalError, first_line

FAISS_KINDS = ("flat", "hnsw", "ivf", "ivfpq")
IVF_KINDS = ("ivf", "ivfpq")
MAX_TRAIN = 1_000_000  # default cap of the ivf / ivfpq training sample (wiki-18 would ask 4.7M: 14 GB of 768-d floats)


# the PyPI distributions that all install the same top-level ``faiss`` module
FAISS_DISTRIBUTIONS = ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu11", "faiss-gpu-cu12", "faiss-gpu-cu13", "faiss")


def installed_faiss() -> list[str]:
    """The FAISS distributions installed in this environment, as ``name==version``."""
    from importlib import metadata

    found = []
    for name in FAISS_DISTRIBUTIONS:
        try:
            found.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return found


def _faiss() -> Any:
    found = installed_faiss()
    if len(found) > 1:
        # they overwrite each other's files in site-packages/faiss: what imports is a mix of both
        raise RetrievalError(f"several FAISS builds are installed side by side ({', '.join(found)}); keep one: "
                             "pip uninstall the others, then reinstall drmas-bench[dense] (CPU) or drmas-bench[dense-gpu] (GPU)")
    try:
        import faiss
    except ImportError:
        raise RetrievalError("dense retrieval needs FAISS: pip install drmas-bench[dense] "
                             "(faiss-cpu), or drmas-bench[dense-gpu] (faiss-gpu)") from None
    return faiss


# ----------------------------------------------------------------------------------------- FAISS


@dataclass
class FaissParams:
    """FAISS options.

    ``kind``             flat (exact, default) | hnsw | ivf | ivfpq.
    ``hnsw_m``           HNSW neighbours per node (default 32).
    ``ef_construction``  HNSW build breadth (default 200).
    ``ef_search``        HNSW search breadth (default 128; raise for recall, lower for speed).
    ``nlist``            IVF lists, ivf and ivfpq (None = about 4 * sqrt(n), at most n / 39).
    ``nprobe``           IVF lists visited per query (default 16).
    ``train_size``       IVF training sample (default 256 per list up to 1,000,000 vectors, for
                         ivfpq at least 64 per PQ centroid; at most n).
    ``pq_m``             ivfpq: bytes per vector = sub-quantisers (None = dim / 8: 48 for 384-d,
                         96 for 768-d vectors); must divide dim.
    ``pq_nbits``         ivfpq: bits per sub-quantiser code (default 8).
    """

    kind: str = "flat"
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    nlist: int | None = None
    nprobe: int = 16
    train_size: int | None = None
    pq_m: int | None = None
    pq_nbits: int = 8

    def __post_init__(self) -> None:
        if self.kind not in FAISS_KINDS:
            raise RetrievalError(f"unknown FAISS index kind {self.kind!r} (known: {', '.join(FAISS_KINDS)})")
        if self.pq_m is not None and self.pq_m < 1:
            raise RetrievalError(f"pq_m must be a positive integer, got {self.pq_m}")
        if not 1 <= self.pq_nbits <= 16:
            raise RetrievalError(f"pq_nbits must be in 1..16, got {self.pq_nbits}")

    def resolve(self, dim: int, n: int) -> FaissParams:
        """Fill the size-dependent defaults (nlist, pq_m) for ``n`` vectors of ``dim``; checks pq_m."""
        if self.kind in IVF_KINDS and self.nlist is None:
            self.nlist = max(1, min(int(4 * math.sqrt(n)), n // 39))
        if self.kind == "ivfpq":
            if self.pq_m is None:
                self.pq_m = max(1, dim // 8)
            if dim % self.pq_m:
                raise RetrievalError(f"pq_m={self.pq_m} does not divide the vector size {dim}")
            if self.training_rows(n) < 2 ** self.pq_nbits:  # FAISS would stop with a C++ exception
                raise RetrievalError(f"ivfpq with pq_nbits={self.pq_nbits} trains {2 ** self.pq_nbits} centroids and needs at "
                                     f"least as many vectors, got {self.training_rows(n)}; use flat, or lower pq_nbits")
        return self

    def training_rows(self, n: int) -> int:
        """How many vectors ivf / ivfpq train on."""
        if self.train_size:
            return min(n, self.train_size)
        want = min(256 * int(self.nlist or 1), MAX_TRAIN)
        if self.kind == "ivfpq":
            want = max(want, 64 * 2 ** self.pq_nbits)
        return min(n, want)


def index_bytes(n: int, dim: int, params: FaissParams, fp16: bool = False) -> int:
    """About how many bytes a FAISS index of ``n`` ``dim``-d vectors takes in memory (and on disk):
    the stored vectors or codes, ids, and the coarse quantiser / codebooks. ``fp16``: vectors kept
    as float16 (a GPU option). Checked against real indexes in tests/test_retrieval_dense.py."""
    p = FaissParams(**asdict(params)).resolve(dim, n)
    vec = n * dim * (2 if fp16 else 4)
    if p.kind == "flat":
        return vec
    if p.kind == "hnsw":
        return vec + n * (2 * p.hnsw_m * 4 + 12)  # level-0 links (2M int32) plus upper levels and levels table
    coarse = int(p.nlist or 1) * dim * 4
    if p.kind == "ivf":
        return vec + n * 8 + coarse  # vectors + 64-bit ids in the lists
    codes = n * ((int(p.pq_m or 1) * p.pq_nbits + 7) // 8)
    return codes + n * 8 + coarse + 2 ** p.pq_nbits * dim * 4  # codes + ids + quantiser + PQ codebooks


def gpu_placement(kind: str, n_gpu: int, gpu: bool | None, shard: bool = True) -> tuple[str, int]:
    """Where a FAISS index of ``kind`` goes when ``n_gpu`` GPUs are visible: ``("cpu", 0)``,
    ``("gpu", 1)``, ``("shard", n)`` (1/n of the vectors on each GPU, results merged) or
    ``("replicate", n)`` (the whole index on each GPU, queries split). ``gpu``: None = use GPUs
    when there are any, True = must (RetrievalError without one), False = never. HNSW has no GPU
    version and stays on the CPU."""
    if gpu is False or kind == "hnsw" or (gpu is None and n_gpu == 0):
        return ("cpu", 0)
    if n_gpu == 0:
        raise RetrievalError("gpu=True but FAISS sees no GPU (install faiss-gpu: pip install drmas-bench[dense-gpu])")
    if n_gpu == 1:
        return ("gpu", 1)
    return ("shard", n_gpu) if shard else ("replicate", n_gpu)


def _make_index(fp: FaissParams, dim: int, n: int) -> Any:
    faiss = _faiss()
    if fp.kind == "flat":
        return faiss.IndexFlatIP(dim)
    if fp.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, fp.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = fp.ef_construction
        return index
    fp.resolve(dim, n)
    quantizer = faiss.IndexFlatIP(dim)  # faiss keeps the quantizer alive
    if fp.kind == "ivf":
        return faiss.IndexIVFFlat(quantizer, dim, fp.nlist, faiss.METRIC_INNER_PRODUCT)
    return faiss.IndexIVFPQ(quantizer, dim, fp.nlist, fp.pq_m, fp.pq_nbits, faiss.METRIC_INNER_PRODUCT)


def _to_gpus(faiss: Any, index: Any, placement: tuple[str, int], fp16: bool, fp: FaissParams) -> Any:
    """Move a CPU index onto GPUs as :func:`gpu_placement` decided (faiss's multi-GPU cloner)."""
    mode, n = placement
    co = faiss.GpuMultipleClonerOptions()
    co.shard = mode == "shard"  # each GPU gets 1/n of the vectors; otherwise each gets all of them
    # float16: a flat index's vectors stored in half precision (IVF-flat storage ignores it); for
    # ivfpq the lookup tables, which GPU IVFPQ needs above 48 bytes a code (no separate field for them)
    co.useFloat16 = fp16 or (fp.kind == "ivfpq" and int(fp.pq_m or 0) > 48)
    try:
        return faiss.index_cpu_to_all_gpus(index, co=co, ngpu=n)
    except RuntimeError as e:  # out of GPU memory, an unsupported pq_m on GPU, ...
        raise RetrievalError(f"cannot put the FAISS index on {n} GPU(s) ({mode}): {first_line(e)}") from None
