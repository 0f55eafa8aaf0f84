#!/usr/bin/env python
"""Benchmark retrieval backends on one corpus: index build time, load time and queries/s.

Every backend answers the same queries with the same k; one table comes out (markdown). A backend
that cannot run here (e.g. Lucene without the `lucene` extra) gets a row saying why.

Options:
  --corpus FILE        corpus jsonl (default: $DRMAS_DATA_DIR/corpus/mini_corpus.jsonl)
  --questions FILE     where the queries come from (default: $DRMAS_DATA_DIR/corpus/covered_questions.jsonl)
  --n-queries N        queries to run (default 1000)
  --k K                hits per query (default 10)
  --batch-size B       queries per search call in the batched run (default 64)
  --single N           also time N queries sent one per call (default 100; 0 = skip)
  --kinds LIST         comma-separated backends: bm25,lucene,dense (default all three)
  --work-dir DIR       where the indexes are built (default: a temporary directory, deleted after)
  --dense-index DIR    reuse this dense index (its manifest's build time is reported) instead of
                       building one; built there when it does not exist yet (resumable)
  --encoder NAME       dense encoder (default all-MiniLM-L6-v2, offline)
  --faiss LIST         FAISS kinds of the dense backend, one row each, all from the same embeddings
                       (default flat; e.g. flat,ivfpq). Rows after flat also report overlap@k: the
                       share of the exact (flat) top-k they return.
  --nprobe LIST        ivf / ivfpq lists searched per query, comma-separated: one row each (default 16)
  --rerank LIST        ivf / ivfpq: also re-score R x k candidates exactly from the kept embeddings,
                       comma-separated R values, one row each (default 0 = off)
  --threads N          threads of every backend: bm25s / Lucene search, torch query encoding (default 1)
  --json FILE          also write the rows as JSON

Scale mode (synthetic corpora at the paper's corpus size; nothing is read from the data folder):
  --scale SIZES        passages, comma-separated (e.g. 250000,500000,1000000): one synthetic corpus
                       is generated once under --work-dir (default /tmp/drmas_retrieval_scale, kept and
                       reused) at the largest size, smaller sizes index its first N passages. Each
                       backend and size runs in a child process of its own: build time and peak RSS,
                       then load, RSS, queries/s (batched and single) in another child.
  --scale-kinds LIST   bm25,lucene,flat,ivf,hnsw (default bm25,lucene,flat,ivf); flat / ivf / hnsw are
                       FAISS over random unit vectors of --dim (no encoder runs: its cost per query
                       is measured by scripts/bench_encoder.py)
  --dim D              vector size of the FAISS rows (default 768: e5-base-v2, the reference's
                       wiki-18 index)
  --n-queries N        bm25 / lucene rows: the first N of the 1,000 generated queries (default 1000)
  --max-rss-gb G       skip a (backend, size) whose estimated peak is above this (default 8)
  --child-timeout S    stop a (backend, size) child after S seconds of wall time (default 900; raise
                       it on a loaded machine)
  --hnsw-m M, --hnsw-ef-construction E, --hnsw-ef-search S
                       the hnsw rows' graph degree, build breadth and search breadths (default
                       32, 200, 128: the dense index's defaults; a smaller build breadth builds faster;
                       several efSearch values, comma-separated, give one row each from one build)

Example:
  python scripts/bench_retrieval.py --dense-index /tmp/idx/minilm --n-queries 1000 --k 10
  nice -n 10 python scripts/bench_retrieval.py --scale 250000,500000,1000000 --json /tmp/scale.json
  python scripts/bench_retrieval.py --kinds dense --faiss flat,ivfpq --dense-index /tmp/idx/minilm
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def default_data(rel: str) -> str | None:
    env = os.environ.get("DRMAS_DATA_DIR")
    return str(Path(env) / rel) if env else None


def timed_search(r: Any, queries: list[str], k: int, batch: int) -> tuple[float, list]:
    t0 = time.perf_counter()
    hits: list = []
    for a in range(0, len(queries), batch):
        hits.extend(r.search(queries[a:a + batch], k))
    return time.perf_counter() - t0, hits


def bench_one(kind: str, args: argparse.Namespace, work: Path, queries: list[str], sup: list[set[str]],
              faiss_kind: str = "flat", exact: list | None = None, nprobe: int = 16, rerank: int = 0) -> dict[str, Any]:
    from drmas_retrieval import RetrievalError, load_retriever
    from drmas_retrieval.dense import IVF_KINDS

    row: dict[str, Any] = {"backend": kind if kind != "dense" else f"dense/{faiss_kind}"}
    if kind == "dense" and faiss_kind in IVF_KINDS:
        row["backend"] += f" nprobe {nprobe}" + (f" rerank {rerank}" if rerank else "")
    try:
        if kind == "bm25":
            from drmas_retrieval.bm25 import build_bm25

            m = build_bm25(args.corpus, work / "bm25", overwrite=True, progress=False)
            row["build_s"] = m["build_s"]
            where, opts = work / "bm25", {"threads": args.threads}
        elif kind == "lucene":
            from drmas_retrieval.lucene import LuceneParams, build_lucene

            m = build_lucene(args.corpus, work / "lucene", LuceneParams(threads=args.threads), overwrite=True, progress=False)
            row["build_s"] = m["build_s"]
            where, opts = work / "lucene", {}
        else:
            from drmas_retrieval.dense import DEFAULT_ENCODER, EncoderConfig, build_dense
            from drmas_retrieval.store import MANIFEST, read_manifest

            where = Path(args.dense_index) if args.dense_index else work / "dense"
            if (where / MANIFEST).is_file():
                m = read_manifest(where, "dense")
                row["note"] = "reused index; build time from its manifest"
            else:
                m = build_dense(args.corpus, where, progress=True,
                                encoder=EncoderConfig(model=args.encoder or DEFAULT_ENCODER, threads=args.threads))
            row["build_s"] = m["build_s"]
            row["model"] = m["params"]["encoder"]["model"].rsplit("/", 1)[-1]
            if faiss_kind != m["params"]["faiss"]["kind"]:  # another FAISS kind from the same embeddings
                from drmas_retrieval.dense import FaissParams, rebuild_faiss

                t0 = time.perf_counter()
                rebuild_faiss(where, FaissParams(kind=faiss_kind, nprobe=nprobe), progress=False,
                              out=work / f"dense-{faiss_kind}", overwrite=True)
                row["build_s"] = round(time.perf_counter() - t0, 1)
                row["note"] = "FAISS build only (same embeddings)"
                where = work / f"dense-{faiss_kind}"
            from drmas_retrieval.dense import INDEX_FILE

            row["index_mb"] = round((where / INDEX_FILE).stat().st_size / 2**20, 1)
            opts = {"threads": args.threads, "rerank": rerank}
        t0 = time.perf_counter()
        r = load_retriever(where, **opts)
        row["load_s"] = round(time.perf_counter() - t0, 2)
        row["passages"] = r.info().get("n_passages")
        r.search(queries[:2], args.k)  # warm-up
        secs, hits = timed_search(r, queries, args.k, args.batch_size)
        row["qps_batched"] = round(len(queries) / secs, 1)
        if args.single:
            s1, _ = timed_search(r, queries[:args.single], args.k, 1)
            row["qps_single"] = round(min(args.single, len(queries)) / s1, 1)
        if exact is not None:
            row[f"overlap@{args.k}"] = round(100 * sum(len({x.id for x in a} & {x.id for x in e}) / max(1, len(e))
                                                       for a, e in zip(hits, exact)) / len(hits), 1)
        row["_hits"] = hits
        with_sup = [(h, s) for h, s in zip(hits, sup) if s]
        if with_sup:
            row[f"any@{args.k}"] = round(100 * sum(bool(s & {x.id for x in h}) for h, s in with_sup) / len(with_sup), 1)
        r.close()
    except RetrievalError as e:
        row["note"] = f"unavailable: {e}"
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example:\n  python scripts/bench_retrieval.py --dense-index /tmp/idx/minilm --n-queries 1000 --k 10")
    ap.add_argument("--corpus", default=default_data("corpus/mini_corpus.jsonl"),
                    help="corpus jsonl (default: $DRMAS_DATA_DIR/corpus/mini_corpus.jsonl)")
    ap.add_argument("--questions", default=default_data("corpus/covered_questions.jsonl"),
                    help="queries come from here (default: $DRMAS_DATA_DIR/corpus/covered_questions.jsonl)")
    ap.add_argument("--n-queries", type=int, default=1000, help="queries to run (default 1000)")
    ap.add_argument("--k", type=int, default=10, help="hits per query (default 10)")
    ap.add_argument("--batch-size", type=int, default=64, help="queries per search call, batched run (default 64)")
    ap.add_argument("--single", type=int, default=100, help="also time N queries sent one per call (default 100; 0 = skip)")
    ap.add_argument("--kinds", default="bm25,lucene,dense", help="backends, comma-separated (default bm25,lucene,dense)")
    ap.add_argument("--work-dir", help="where indexes are built (default: a temporary directory, deleted after)")
    ap.add_argument("--dense-index", help="reuse this dense index (its manifest's build time is reported); "
                                          "built there when absent (resumable)")
    ap.add_argument("--encoder", help="dense encoder (default all-MiniLM-L6-v2, offline)")
    ap.add_argument("--faiss", default="flat", help="FAISS kinds of the dense backend, comma-separated, one row each (default flat)")
    ap.add_argument("--nprobe", default="16", help="ivf / ivfpq lists searched per query, comma-separated, one row each (default 16)")
    ap.add_argument("--rerank", default="0", help="ivf / ivfpq exact re-scoring factors, comma-separated, one row each (default 0 = off)")
    ap.add_argument("--threads", type=int, default=1, help="threads of every backend: bm25s and Lucene search, torch query encoding (default 1)")
    ap.add_argument("--json", dest="json_out", help="also write the rows as JSON")
    ap.add_argument("--scale", help="synthetic corpora of these sizes, comma-separated (scale mode)")
    ap.add_argument("--scale-kinds", default="bm25,lucene,flat,ivf", help="scale mode backends (default bm25,lucene,flat,ivf)")
    ap.add_argument("--dim", type=int, default=768, help="scale mode: FAISS vector size (default 768)")
    ap.add_argument("--max-rss-gb", type=float, default=8.0, help="scale mode: skip runs estimated above this peak (default 8)")
    ap.add_argument("--child-timeout", type=float, default=900.0, help="scale mode: seconds a child may run (default 900)")
    ap.add_argument("--hnsw-m", type=int, default=32, help="scale mode: HNSW graph degree M (default 32)")
    ap.add_argument("--hnsw-ef-construction", type=int, default=200, help="scale mode: HNSW efConstruction (default 200)")
    ap.add_argument("--hnsw-ef-search", default="128", help="scale mode: HNSW efSearch, comma-separated: one row each, same build (default 128)")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # scale mode: one measurement in a child process
    args = ap.parse_args(argv)
    if args.child:
        from bench_retrieval_scale import child_main

        return child_main(args)
    if args.scale:
        from bench_retrieval_scale import scale_main

        return scale_main(args)
    if not args.corpus or not args.questions:
        ap.error("give --corpus and --questions (or set DRMAS_DATA_DIR)")

    from tabulate import tabulate

    from drmas_retrieval.evaluate import read_questions

    qs = read_questions(args.questions, limit=args.n_queries)
    queries, sup = [q.question for q in qs], [set(q.supporting) for q in qs]
    tmp = None if args.work_dir else tempfile.TemporaryDirectory(prefix="bench_retrieval_")
    work = Path(args.work_dir or tmp.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        if kind not in ("bm25", "lucene", "dense"):
            ap.error(f"unknown backend {kind!r} (known: bm25, lucene, dense)")
        faiss_kinds = [f.strip() for f in args.faiss.split(",") if f.strip()] if kind == "dense" else ["flat"]
        exact = None
        from drmas_retrieval.dense import IVF_KINDS

        for fk in faiss_kinds:
            ivf = fk in IVF_KINDS
            for nprobe, rerank in [(int(p), int(r)) for p in args.nprobe.split(",") for r in args.rerank.split(",")] if ivf else [(16, 0)]:
                print(f"[bench] {kind}{'/' + fk if kind == 'dense' else ''} ...", file=sys.stderr, flush=True)
                row = bench_one(kind, args, work, queries, sup, fk, exact, nprobe, rerank)
                hits = row.pop("_hits", None)
                if kind == "dense" and fk == "flat":
                    exact = hits  # the exact neighbours the approximate kinds are compared with
                rows.append(row)
    if tmp is not None:
        tmp.cleanup()
    cols = ["backend", "model", "passages", "build_s", "load_s", "index_mb", "qps_batched", "qps_single",
            f"any@{args.k}", f"overlap@{args.k}", "note"]
    print(f"\n{len(queries)} queries, k={args.k}, batch {args.batch_size}; corpus {Path(args.corpus).name}; "
          f"{os.cpu_count()} CPUs visible\n")
    print(tabulate([[r.get(c, "") for c in cols] for r in rows], headers=cols, tablefmt="github"))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
