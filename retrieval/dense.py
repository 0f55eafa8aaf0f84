"""Dense retrieval: a sentence encoder (``drmas_retrieval.encoders``) + FAISS.

Embeddings are mean pooled (the models' own pooling) and L2-normalised, so inner product = cosine
similarity. Passages are encoded in the reference form ``"Title"\\ntext``.

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
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from drmas_retrieval.base import Hit, RetrievalError, Retriever, check_search_args, first_line
from drmas_retrieval.corpus import read_corpus, require_corpus
from drmas_retrieval.encoders import (  # noqa: F401
    DEFAULT_ENCODER,
    Encoder,
    EncoderConfig,
    SentenceEncoder,
    default_prefixes,
    resolve_model_path,
)
from drmas_retrieval.faiss_index import (  # noqa: F401
    FAISS_DISTRIBUTIONS,
    FAISS_KINDS,
    IVF_KINDS,
    MAX_TRAIN,
    FaissParams,
    _faiss,
    _make_index,
    _to_gpus,
    gpu_placement,
    index_bytes,
    installed_faiss,
)
from drmas_retrieval.store import (
    OFFSETS,
    PASSAGES,
    PassageStore,
    atomic_write_text,
    corpus_fingerprint,
    dir_lock,
    has_passages,
    prepare_out_dir,
    read_manifest,
    removed_on_failure,
    write_manifest,
    write_passages,
)

EMB_DIR = "emb"
STATE = "build_state.json"
INDEX_FILE = "faiss.index"


# ----------------------------------------------------------------------------------------- build


def _shard_path(out: Path, i: int) -> Path:
    return out / EMB_DIR / f"shard_{i:05d}.npy"


def _shard_ok(path: Path, rows: int, dim: int | None) -> bool:
    try:
        a = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return a.ndim == 2 and a.shape[0] == rows and (dim is None or a.shape[1] == dim) and a.dtype == np.float32


def _check_build_args(shard_size: int, part: tuple[int, int] | None, overwrite: bool) -> None:
    if shard_size < 1:
        raise RetrievalError(f"shard_size must be at least 1, got {shard_size}")
    if part is not None and not (len(part) == 2 and 0 <= part[0] < part[1]):
        raise RetrievalError(f"part must be (i, n) with 0 <= i < n, got {part}")
    if overwrite and part is not None:  # one part would delete the shards the others are writing
        raise RetrievalError("overwrite cannot be combined with part: clear the directory once, then start the parts")


def _start_or_resume(out_dir: Path, state: dict[str, Any], overwrite: bool) -> tuple[Path, bool]:
    """The build folder ready for ``state`` (what the vectors depend on): (folder, resumed). A partial
    build made with another state is refused unless ``overwrite``, which clears it first."""
    if overwrite and out_dir.is_dir():
        shutil.rmtree(out_dir / EMB_DIR, ignore_errors=True)
        for name in (STATE, INDEX_FILE):
            (out_dir / name).unlink(missing_ok=True)
    out_dir = prepare_out_dir(out_dir, overwrite)
    state_path = out_dir / STATE
    if state_path.is_file():
        old = json.loads(state_path.read_text(encoding="utf-8"))
        if old != state:
            diff = sorted(k for k in state if old.get(k) != state[k])
            raise RetrievalError(f"{out_dir}: holds a partial build with different {', '.join(diff)}; "
                                 "pass overwrite=True / --overwrite to start over")
        return out_dir, True
    if (out_dir / EMB_DIR).exists():
        shutil.rmtree(out_dir / EMB_DIR)
    atomic_write_text(state_path, json.dumps(state, indent=2) + "\n")
    return out_dir, False


def _encode_shards(store: PassageStore, out_dir: Path, enc_cfg: EncoderConfig | None, enc: Encoder | None,
                   shard_size: int, part: tuple[int, int] | None, progress: bool,
                   on_shard: Callable[[int, int], None] | None) -> None:
    """Encode every shard of this ``part`` not yet on disk, each saved whole (temp file + rename);
    the encoder is loaded only when a shard is left to encode."""
    from tqdm import tqdm

    n = len(store)
    n_shards = (n + shard_size - 1) // shard_size
    dim = None if enc is None else enc.dim
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
    _check_build_args(shard_size, part, overwrite)
    require_corpus(corpus)
    t0 = time.perf_counter()
    fp = faiss_params or FaissParams()
    enc_cfg = encoder if isinstance(encoder, EncoderConfig) else (None if encoder is not None else EncoderConfig())
    identity = enc_cfg.identity() if enc_cfg is not None else encoder.identity()  # type: ignore[union-attr]
    state = {"corpus": corpus_fingerprint(corpus), "limit": limit, "encoder": identity, "shard_size": shard_size}
    out_dir, resumed = _start_or_resume(Path(out), state, overwrite)
    state_path = out_dir / STATE
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
    _encode_shards(store, out_dir, enc_cfg, enc, shard_size, part, progress, on_shard)

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

