"""Scale mode of scripts/bench_retrieval.py (``--scale SIZES``): bm25s, Lucene and FAISS on a
synthetic corpus of the paper's passage size, one child process per measurement.

The corpus: 100-word passages (wiki-18's size) with 2-4 word titles, words drawn from a
Zipf-Mandelbrot law (p(r) ~ 1 / (r + 2.7)) over 300,000 word forms whose 33 most frequent are
bm25s's English stop words (removed at index time, as real stop words are). Queries: 4-7 words of
a random passage among the first 100,000 (so every size holds their source) around a few stop
words, like a question. FAISS rows are random unit vectors (no encoder runs), queries too.

Each child prints one JSON line: build (``build_s``, ``build_cpu_s``, ``build_peak_rss_mb``,
``index_mb``) or search (``load_s``, ``rss_mb`` after loading, ``search_peak_rss_mb``,
``qps_batched``, ``qps_single``, ``qps_cpu``), and the load average (1 min) when it ended. Peak RSS
is the child's own ``ru_maxrss``; Lucene's includes the JVM in the same process. IVF and HNSW rows
also give ``recall_at_k``: the share of the exact top-k that they return, over the first
``RECALL_QUERIES`` queries (the exact top-k computed from the same vectors, regenerated chunk by
chunk). The flat and HNSW stores are sized once before the vectors are
added (so the peak is the index, not a doubling vector's copy); IVF's lists grow as FAISS grows them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORDS_PER_PASSAGE = 100
VOCAB = 300_000
QUERY_SOURCE = 100_000  # queries come from the first this many passages
N_QUERIES = 1000
SINGLE = 100
RECALL_QUERIES = 200  # ivf / hnsw recall: the exact top-k of this many queries (it reads every vector for each)
FLAT_QUERIES = 64  # flat reads every vector for every query: fewer queries, the same cost per query
DEFAULT_WORK = "/tmp/drmas_retrieval_scale"
FAISS_KINDS = ("flat", "ivf", "hnsw")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _vocab(rng: Any) -> list[str]:
    from bm25s.stopwords import STOPWORDS_EN

    letters = "abcdefghijklmnopqrstuvwxyz"
    seen = set(STOPWORDS_EN)
    words = list(STOPWORDS_EN)
    while len(words) < VOCAB:
        lens = rng.integers(3, 11, size=VOCAB)
        for n in lens:
            w = "".join(letters[i] for i in rng.integers(0, 26, size=n))
            if w not in seen:
                seen.add(w)
                words.append(w)
                if len(words) == VOCAB:
                    break
    return words


def generate_corpus(path: Path, n: int, seed: int = 0) -> tuple[Path, Path]:
    """Write ``n`` synthetic passages to ``path`` (jsonl: id, title, text) and the queries beside it
    (``.queries.jsonl``); kept when already complete (a ``.done`` marker holds ``n``)."""
    import numpy as np

    done, qpath = path.with_suffix(".done"), path.with_suffix(".queries.jsonl")
    if done.is_file() and int(done.read_text() or 0) >= n and qpath.is_file():
        return path, qpath
    rng = np.random.default_rng(seed)
    words = np.array(_vocab(rng), dtype=object)
    ranks = np.arange(VOCAB, dtype=np.float64)
    cdf = np.cumsum(1.0 / (ranks + 2.7))
    cdf /= cdf[-1]
    tmp = path.with_suffix(".tmp")
    t0 = time.perf_counter()
    with open(tmp, "w", encoding="utf-8") as f:
        for a in range(0, n, 50_000):
            m = min(50_000, n - a)
            body = np.searchsorted(cdf, rng.random((m, WORDS_PER_PASSAGE)))
            head = np.searchsorted(cdf, rng.random((m, 4)) * (1 - cdf[199]) + cdf[199])  # titles: no top-200 words
            tl = rng.integers(2, 5, size=m)
            lines = [json.dumps({"id": f"s{a + i}", "title": " ".join(words[head[i, :tl[i]]]),
                                 "text": " ".join(words[body[i]])}) for i in range(m)]
            f.write("\n".join(lines) + "\n")
            print(f"[scale] corpus {a + m:,}/{n:,} passages ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    os.replace(tmp, path)
    _write_queries(path, qpath, rng, words)
    done.write_text(str(n))
    return path, qpath


def _write_queries(path: Path, qpath: Path, rng: Any, words: Any) -> None:
    stop = ["what", "is", "the", "of", "who", "in", "which", "was"]
    picks = sorted(set(int(x) for x in rng.integers(0, QUERY_SOURCE, size=N_QUERIES * 2)))[:N_QUERIES]
    want, out = set(picks), []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i in want:
                toks = [w for w in json.loads(line)["text"].split() if len(w) > 3]
                k = int(rng.integers(4, 8))
                chosen = [toks[j] for j in rng.choice(len(toks), size=min(k, len(toks)), replace=False)]
                out.append({"question": " ".join(stop[:2] + chosen[:2] + stop[2:4] + chosen[2:]), "passage": f"s{i}"})
            if i >= picks[-1]:
                break
    qpath.write_text("".join(json.dumps(q) + "\n" for q in out), encoding="utf-8")


# ---------------------------------------------------------------------------------------- children


def _dir_mb(d: Path) -> float:
    return round(sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) / 2**20, 1)


def _build_sparse(kind: str, corpus: Path, n: int, out: Path) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    if kind == "bm25":
        from drmas_retrieval.bm25 import build_bm25

        build_bm25(corpus, out, overwrite=True, progress=False, limit=n)
    else:
        from drmas_retrieval.lucene import LuceneParams, build_lucene

        build_lucene(corpus, out, LuceneParams(threads=1), overwrite=True, progress=False, limit=n)
    return {"build_s": round(time.perf_counter() - t0, 1), "build_cpu_s": round(time.process_time() - c0, 1),
            "build_peak_rss_mb": round(peak_rss_mb()), "index_mb": _dir_mb(out)}


def _timed(fn: Any, queries: Any, batch: int) -> tuple[float, float]:
    """(queries per second of wall time, queries per second of this process's CPU)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for a in range(0, len(queries), batch):
        fn(queries[a:a + batch])
    return len(queries) / max(time.perf_counter() - t0, 1e-9), len(queries) / max(time.process_time() - c0, 1e-9)


def _rates(fn: Any, queries: Any) -> dict[str, float]:
    """Batched (64 a call) and single (one a call, at most ``SINGLE`` queries) rates; CPU rate of
    the batched run."""
    wall, cpu = _timed(fn, queries, 64)
    single, _ = _timed(fn, queries[:min(SINGLE, len(queries) // 4)], 1)
    return {"qps_batched": round(wall, 1), "qps_cpu": round(cpu, 1), "qps_single": round(single, 1)}


def _search_sparse(kind: str, index: Path, qpath: Path, k: int, n_queries: int = N_QUERIES) -> dict[str, Any]:
    from drmas_retrieval import load_retriever

    queries = [json.loads(line)["question"] for line in qpath.read_text(encoding="utf-8").splitlines()][:n_queries]
    t0 = time.perf_counter()
    r = load_retriever(index, **({"threads": 0} if kind == "bm25" else {"threads": 1}))
    load_s = time.perf_counter() - t0
    loaded = rss_mb()
    r.search(queries[:2], k)
    out = {"load_s": round(load_s, 2), "rss_mb": round(loaded), **_rates(lambda q: r.search(q, k), queries),
           "search_peak_rss_mb": round(peak_rss_mb())}
    r.close()
    return out


def _faiss_index(kind: str, dim: int, n: int, hnsw: tuple[int, int, tuple[int, ...]] = (32, 200, (128,))) -> Any:
    """A FAISS index of ``kind``; ``hnsw`` = (M, efConstruction, efSearch values). Flat and HNSW get their
    vector store sized for ``n`` rows at once."""
    import faiss

    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
        _reserve(index, n, dim)
        return index
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw[0], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = hnsw[1]
        index.hnsw.efSearch = hnsw[2][0]
        _reserve(faiss.downcast_index(index.storage), n, dim)
        return index
    nlist = 1024
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.nprobe = 16
    return index


def _reserve(flat: Any, n: int, dim: int) -> None:
    """Give a flat store the capacity of ``n`` rows (resize, then back to empty: the capacity stays)."""
    flat.codes.resize(n * dim * 4)
    flat.codes.resize(0)


def _faiss_bytes(kind: str, n: int, dim: int) -> int:
    """The index's size: vectors, plus ids and centroids (ivf) or level-0 links (hnsw, M 32)."""
    vec = n * dim * 4
    return vec + (n * 8 + 1024 * dim * 4 if kind == "ivf" else n * (2 * 32 * 4 + 12) if kind == "hnsw" else 0)


def _unit_rows(rng: Any, m: int, dim: int) -> Any:
    import numpy as np

    x = rng.standard_normal((m, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def _faiss_run(kind: str, n: int, dim: int, k: int, hnsw: tuple[int, int, tuple[int, ...]] = (32, 200, (128,))) -> dict[str, Any]:
    """Build a FAISS index of ``n`` random unit vectors (generation not timed) and search it;
    ivf / hnsw: also their recall of the exact top-k; hnsw: searched at each efSearch given."""
    import faiss
    import numpy as np

    faiss.omp_set_num_threads(1)
    index = _faiss_index(kind, dim, n, hnsw)
    build = build_cpu = 0.0
    if kind == "ivf":  # 40 training rows per list (FAISS's minimum is 39)
        x = _unit_rows(np.random.default_rng(3), 40 * 1024, dim)
        t0, c0 = time.perf_counter(), time.process_time()
        index.train(x)
        build, build_cpu = build + time.perf_counter() - t0, build_cpu + time.process_time() - c0
    for a, x in _chunks(n, dim):
        t0, c0 = time.perf_counter(), time.process_time()
        index.add(x)
        build, build_cpu = build + time.perf_counter() - t0, build_cpu + time.process_time() - c0
        print(f"[scale] faiss {kind}: {a + len(x):,}/{n:,} rows ({build:.0f} s, {build_cpu:.0f} s CPU)", file=sys.stderr, flush=True)
    del x
    qs = _unit_rows(np.random.default_rng(2), FLAT_QUERIES if kind == "flat" else N_QUERIES, dim)
    out: dict[str, Any] = {"build_s": round(build, 1), "build_cpu_s": round(build_cpu, 1), "index_mb": round(_faiss_bytes(kind, n, dim) / 2**20, 1),
                           "rss_mb": round(rss_mb()), "build_peak_rss_mb": round(peak_rss_mb())}
    if kind == "ivf":
        out["params"] = f"nlist {index.nlist}, nprobe {index.nprobe}"
    exact = _exact_topk(qs[:RECALL_QUERIES], n, dim, k) if kind != "flat" else None
    searches = []
    for ef in (hnsw[2] if kind == "hnsw" else (0,)):  # hnsw: one search row per efSearch, same build
        found: dict[str, Any] = {}
        if kind == "hnsw":
            index.hnsw.efSearch = ef
            found["params"] = f"M {hnsw[0]}, efConstruction {hnsw[1]}, efSearch {ef}"
        found.update(_rates(lambda q: index.search(q, k), qs))
        if exact is not None:
            _, got = index.search(qs[:RECALL_QUERIES], k)
            found[f"recall_at_{k}"] = round(float(np.mean([len(set(g) & set(e)) / k for g, e in zip(got, exact)])), 3)
        searches.append(found)
    out.update(searches[0])
    out["search_peak_rss_mb"] = round(peak_rss_mb())
    if len(searches) > 1:
        out["more"] = searches[1:]
    return out


def _chunks(n: int, dim: int, size: int = 100_000) -> Any:
    """The ``n`` base vectors, 100,000 at a time, the same on every call (seed 1)."""
    import numpy as np

    rng = np.random.default_rng(1)
    for a in range(0, n, size):
        yield a, _unit_rows(rng, min(size, n - a), dim)


def _exact_topk(qs: Any, n: int, dim: int, k: int) -> Any:
    """The exact inner-product top-k ids of ``qs`` over the ``n`` base vectors, chunk by chunk."""
    import numpy as np

    best_s = np.full((len(qs), k), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(qs), k), dtype=np.int64)
    for a, x in _chunks(n, dim):
        s = qs @ x.T
        top = np.argpartition(-s, k, axis=1)[:, :k]
        cand_s = np.concatenate([best_s, np.take_along_axis(s, top, axis=1)], axis=1)
        cand_i = np.concatenate([best_i, top + a], axis=1)
        keep = np.argsort(-cand_s, axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(cand_s, keep, axis=1), np.take_along_axis(cand_i, keep, axis=1)
    return best_i


def child_main(args: argparse.Namespace) -> int:
    """One measurement (``--child build:KIND:N`` / ``search:KIND:N`` / ``faiss:KIND:N``); one JSON line."""
    step, kind, n_s = args.child.split(":")
    n, work = int(n_s), Path(args.work_dir or DEFAULT_WORK)
    corpus = work / "corpus.jsonl"
    index = work / f"{kind}-{n}"
    if step == "build":
        row = _build_sparse(kind, corpus, n, index)
    elif step == "search":
        row = _search_sparse(kind, index, corpus.with_suffix(".queries.jsonl"), args.k, args.n_queries)
    else:
        row = _faiss_run(kind, n, args.dim, args.k, (args.hnsw_m, args.hnsw_ef_construction,
                                                      tuple(int(e) for e in str(args.hnsw_ef_search).split(","))))
    row["load_avg"] = round(os.getloadavg()[0], 1)
    print(json.dumps(row), flush=True)
    return 0


# ---------------------------------------------------------------------------------------- driver


def _estimate_gb(kind: str, n: int, dim: int) -> float:
    """A rough peak (GB) before a run, to skip what cannot fit here (--max-rss-gb)."""
    if kind in FAISS_KINDS:
        return n * dim * 4 * (1.1 if kind != "hnsw" else 1.2) / 1e9 + 0.5
    if kind == "bm25":
        return 0.5 + n * 4.0e-6  # measured: about 4 KB a passage at 100k
    return 2.0 + n * 1.0e-6  # Lucene: the JVM's heap plus the passage store being written


def _child(args: argparse.Namespace, spec: str) -> dict[str, Any]:
    timeout = args.child_timeout
    cmd = [sys.executable, str(Path(__file__).with_name("bench_retrieval.py")), "--child", spec, "--k", str(args.k),
           "--dim", str(args.dim), "--n-queries", str(args.n_queries), "--work-dir", str(args.work_dir or DEFAULT_WORK), "--hnsw-m", str(args.hnsw_m),
           "--hnsw-ef-construction", str(args.hnsw_ef_construction), "--hnsw-ef-search", str(args.hnsw_ef_search)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"note": f"over {timeout:.0f} s: stopped"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        err = [ln for ln in p.stderr.splitlines() if ln.strip()]
        return {"note": f"failed (rc {p.returncode}): {err[-1][:160] if err else ''}"}
    return json.loads(lines[-1])


def scale_main(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    sizes = sorted(int(x) for x in args.scale.split(",") if x.strip())
    work = Path(args.work_dir or DEFAULT_WORK)
    work.mkdir(parents=True, exist_ok=True)
    generate_corpus(work / "corpus.jsonl", sizes[-1])
    rows = []
    for kind in [k.strip() for k in args.scale_kinds.split(",") if k.strip()]:
        for n in sizes:
            row: dict[str, Any] = {"backend": kind if kind not in FAISS_KINDS else f"faiss {kind} {args.dim}-d", "passages": n}
            est = _estimate_gb(kind, n, args.dim)
            if est > args.max_rss_gb:
                row["note"] = f"skipped: estimated peak {est:.1f} GB > --max-rss-gb {args.max_rss_gb:g}"
            elif kind in FAISS_KINDS:
                row.update(_child(args, f"faiss:{kind}:{n}"))
            else:
                row.update(_child(args, f"build:{kind}:{n}"))
                if "note" not in row:
                    build_load = row.pop("load_avg", None)
                    row.update(_child(args, f"search:{kind}:{n}"))
                    row["load_avg"] = f"{build_load} / {row.get('load_avg', '')}"
            print(f"[scale] {row}", file=sys.stderr, flush=True)
            more = row.pop("more", [])
            rows.append(row)
            rows.extend({"backend": row["backend"], "passages": n, **m, "load_avg": row.get("load_avg"),
                         "note": "same build, another efSearch"} for m in more)
            if args.json_out:
                Path(args.json_out).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    cols = ["backend", "params", "passages", "build_s", "build_cpu_s", "build_peak_rss_mb", "index_mb", "load_s", "rss_mb",
            "search_peak_rss_mb", "qps_batched", "qps_single", "qps_cpu", f"recall_at_{args.k}", "load_avg", "note"]
    print(f"\nsynthetic corpus, k={args.k}, {min(args.n_queries, N_QUERIES)} queries (bm25 / lucene; faiss: {N_QUERIES}, flat {FLAT_QUERIES}) (batches of 64; single: {SINGLE} one per call; qps_cpu: batched, per CPU second), "
          f"1 thread; {os.cpu_count()} CPUs visible, load average {os.getloadavg()[0]:.1f}\n")
    print(tabulate([[r.get(c, "") for c in cols] for r in rows], headers=cols, tablefmt="github"))
    return 0
