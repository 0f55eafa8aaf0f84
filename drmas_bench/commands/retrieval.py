"""`drmas-bench retrieval corpus | index | eval | serve`: build corpora and indexes, evaluate
retrievers, serve an index on POST /retrieve. The work is done by ``drmas_retrieval``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from drmas_bench.types import UserError

RAW = argparse.RawDescriptionHelpFormatter

EPILOG = """examples:
  drmas-bench retrieval index --corpus $DRMAS_DATA_DIR/corpus/mini_corpus.jsonl --kind bm25 --out idx/bm25
  drmas-bench retrieval eval --index idx/bm25 --questions $DRMAS_DATA_DIR/corpus/covered_questions.jsonl --k 1,3,5,10
  drmas-bench retrieval serve --index idx/bm25 --port 8000
"""

CORPUS_EPILOG = """example:
  drmas-bench retrieval corpus --from $DRMAS_DATA_DIR/corpus/hotpotqa_dev_rpt1100/dev.jsonl \\
      $DRMAS_DATA_DIR/corpus/musique_train_hipporag100/musique_train.json --out my_corpus.jsonl

Reads HotpotQA/2Wiki `context`, IRCoT `contexts`, MuSiQue/PopQA `paragraphs` and title+text rows
(.json or .jsonl, optionally .gz); writes {"id", "title", "text"} lines, deduplicated, ids 0, 1, ...
"""

INDEX_EPILOG = """examples:
  drmas-bench retrieval index --corpus corpus.jsonl --kind bm25 --out idx/bm25
  drmas-bench retrieval index --corpus corpus.jsonl --kind dense --out idx/minilm          # all-MiniLM-L6-v2, offline
  drmas-bench retrieval index --corpus corpus.jsonl --kind dense --encoder intfloat/e5-base-v2 --faiss hnsw --out idx/e5
  drmas-bench retrieval index --corpus corpus.jsonl --kind lucene --out idx/lucene        # needs drmas-bench[lucene]
  drmas-bench retrieval index --kind dense --out idx/minilm --faiss hnsw --reuse-embeddings  # no re-encoding
  drmas-bench retrieval index --kind dense --faiss ivfpq --embeddings-from idx/minilm --out idx/minilm-pq
  for i in 0 1 2 3; do CUDA_VISIBLE_DEVICES=$i drmas-bench retrieval index --kind dense --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2 --part $i/4 --out idx/e5 & done; wait
  drmas-bench retrieval index --kind dense --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2 --import-faiss e5_Flat.index --out idx/e5  # no encoding

A corpus is jsonl with `id` and `contents` ("Title"\\ntext) or `title` + `text`. A killed dense
build resumes from its last complete embedding shard when rerun with the same flags.
A relative path that does not exist is also looked up under $DRMAS_DATA_DIR.
"""

EVAL_EPILOG = """example:
  drmas-bench retrieval eval --index idx/bm25 --questions corpus/covered_questions.jsonl --k 1,3,5,10

--index takes a directory (kind from its manifest), kind:DIR (bm25:, dense:, lucene:) or a server
URL (http://127.0.0.1:8000). Metrics: all@k (every supporting passage in the top k), any@k (at least
one), mrr (first supporting passage), ans@k (a gold answer string in a top-k passage).
"""

SERVE_EPILOG = """example:
  drmas-bench retrieval serve --index idx/bm25 --port 8000
  curl -s localhost:8000/retrieve -H 'content-type: application/json' \\
       -d '{"queries": ["who wrote Hamlet?"], "topk": 3, "return_scores": true}'

Accepts {"query": str, ...} and {"queries": [str], ...}; answers {"result": [[{"document":
{"id", "contents"}, "score"}, ...]]} (bare documents when return_scores is false, as the reference).
SIGTERM or Ctrl-C shuts it down gracefully (requests in flight answered, port released) and exits 0.
Binds 127.0.0.1 unless --host says otherwise. A body over --max-body-bytes, a query over
--max-query-chars or more than --max-batch queries gets HTTP 413 with the reason; big requests are
searched piece by piece, taking turns with the others, so they cannot starve small ones.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("retrieval", help="build corpora and indexes (BM25, dense, Lucene), evaluate, serve /retrieve",
                       description="Corpora, BM25 / dense / Lucene indexes, retriever evaluation and the /retrieve server.",
                       epilog=EPILOG, formatter_class=RAW)
    rsub = p.add_subparsers(dest="retrieval_command", metavar="ACTION", required=True)
    for add in (_corpus_parser, _index_parser, _eval_parser, _serve_parser):
        add(rsub)


def _corpus_parser(rsub: argparse._SubParsersAction) -> None:
    """`drmas-bench retrieval corpus: build a corpus file`."""
    q = rsub.add_parser("corpus", help="build a corpus jsonl from QA datasets' paragraph files",
                        epilog=CORPUS_EPILOG, formatter_class=RAW)
    q.add_argument("--from", dest="inputs", nargs="+", required=True, metavar="FILE", help="paragraph files")
    q.add_argument("--out", required=True, help="corpus jsonl to write")
    q.add_argument("--no-dedupe", action="store_true", help="keep repeated (title, text) paragraphs")
    q.add_argument("--contents", action="store_true", help='write {"id", "contents"} rows (the reference form)')
    q.set_defaults(func=cmd_corpus)


def _index_parser(rsub: argparse._SubParsersAction) -> None:
    """`drmas-bench retrieval index: build an index`."""
    from drmas_retrieval.dense import FAISS_KINDS

    q = rsub.add_parser("index", help="index a corpus (bm25 | dense | lucene)", epilog=INDEX_EPILOG, formatter_class=RAW)
    q.add_argument("--corpus", help="corpus jsonl (id + contents, or id + title + text); required unless --reuse-embeddings")
    q.add_argument("--kind", choices=["bm25", "dense", "lucene"], default="bm25", help="index kind (default bm25)")
    q.add_argument("--out", required=True, help="index directory to write")
    q.add_argument("--overwrite", action="store_true", help="replace an existing index (and a partial dense build)")
    q.add_argument("--limit", type=int, help="index only the first N passages")
    q.add_argument("--k1", type=float, default=0.9, help="BM25 k1 (bm25, lucene; default 0.9)")
    q.add_argument("--b", type=float, default=0.4, help="BM25 b (bm25, lucene; default 0.4)")
    q.add_argument("--stemmer", help="bm25: PyStemmer language, e.g. english (default none)")
    q.add_argument("--encoder", default=None, help="dense: sentence-transformers model (default all-MiniLM-L6-v2, offline)")
    q.add_argument("--faiss", choices=FAISS_KINDS, default="flat",
                   help="dense: FAISS index: flat (exact) | hnsw | ivf | ivfpq (compressed, docs/retrieval.md) (default flat)")
    q.add_argument("--nlist", type=int, help="dense ivf / ivfpq: inverted lists (default about 4 sqrt(n))")
    q.add_argument("--nprobe", type=int, default=16, help="dense ivf / ivfpq: lists searched per query, stored as the default (default 16)")
    q.add_argument("--pq-m", type=int, help="dense ivfpq: sub-quantisers per vector, must divide the vector size (default dim / 8)")
    q.add_argument("--pq-nbits", type=int, default=8, help="dense ivfpq: bits per sub-quantiser code (default 8: pq_m bytes per vector)")
    q.add_argument("--batch-size", type=int, default=64, help="dense: passages per forward pass (default 64)")
    q.add_argument("--shard-size", type=int, default=50_000, help="dense: passages per resumable shard (default 50000)")
    q.add_argument("--reuse-embeddings", action="store_true",
                   help="dense: only rebuild the FAISS index (--faiss) of the dense index in --out from its kept shards")
    q.add_argument("--embeddings-from", metavar="DIR",
                   help="dense: write a new index in --out with the FAISS kind --faiss, from the kept shards of the "
                        "dense index DIR (DIR is left as it is; no encoding)")
    q.add_argument("--part", metavar="I/N",
                   help="dense: encode only every N-th embedding shard starting at I (0-based), so N processes, one "
                        "per GPU or machine, build one index in a shared --out; the last to finish writes the FAISS index")
    q.add_argument("--import-faiss", metavar="FILE",
                   help="dense: use this FAISS index, built elsewhere over --corpus with --encoder (e.g. the reference's "
                        "e5_Flat.index over wiki-18), instead of encoding; linked into --out, not copied")
    q.add_argument("--max-length", type=int, help="dense: tokens per passage (default: the model's)")
    q.add_argument("--device", help="dense: cpu | cuda (default: cuda when available)")
    q.add_argument("--threads", type=int, help="lucene: indexing threads (default 1); dense: torch CPU threads (default: torch's)")
    q.set_defaults(func=cmd_index)


def _eval_parser(rsub: argparse._SubParsersAction) -> None:
    """`drmas-bench retrieval eval: measure a retriever`."""
    q = rsub.add_parser("eval", help="recall@k, MRR and answer recall of a retriever", epilog=EVAL_EPILOG,
                        formatter_class=RAW)
    q.add_argument("--index", required=True, help="index directory, kind:DIR, or http://host:port")
    q.add_argument("--questions", required=True, help="jsonl with question, golden_answers, supporting_passage_ids")
    q.add_argument("--k", default="1,3,5,10", help="comma-separated cut-offs (default 1,3,5,10)")
    q.add_argument("--limit", type=int, help="first N questions only")
    q.add_argument("--batch-size", type=int, default=64, help="queries per search call (default 64)")
    q.add_argument("--device", help="dense: encoder device (default: cuda when available)")
    q.add_argument("--threads", type=int, help="dense: torch CPU threads for query encoding (default: torch's)")
    q.add_argument("--json", dest="json_out", help="also write the metrics as JSON to this file")
    _add_dense_search_arguments(q)
    q.set_defaults(func=cmd_eval)


def _serve_parser(rsub: argparse._SubParsersAction) -> None:
    """`drmas-bench retrieval serve: the /retrieve server`."""
    q = rsub.add_parser("serve", help="serve an index on POST /retrieve (FastAPI + uvicorn)", epilog=SERVE_EPILOG,
                        formatter_class=RAW)
    q.add_argument("--index", required=True, help="index directory or kind:DIR")
    q.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1; 0.0.0.0 = all)")
    q.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    q.add_argument("--topk", type=int, default=3, help="topk for requests that give none (default 3)")
    q.add_argument("--device", help="dense: encoder device (default: cuda when available)")
    q.add_argument("--threads", type=int, help="dense: torch CPU threads for query encoding (default: torch's)")
    q.add_argument("--log-level", default="info", help="uvicorn log level (default info)")
    _add_dense_search_arguments(q)
    from drmas_retrieval.server import add_limit_arguments

    add_limit_arguments(q)  # --max-body-bytes, --max-query-chars, --max-batch (HTTP 413 beyond them)
    q.set_defaults(func=cmd_serve)


def _data_path(p: str) -> str:
    """A path as given, or under $DRMAS_DATA_DIR when it is relative and absent here."""
    env = os.environ.get("DRMAS_DATA_DIR")
    if not os.path.exists(p) and not os.path.isabs(p) and env and (Path(env) / p).exists():
        return str(Path(env) / p)
    return p


def _positive(name: str, v: int | None) -> None:
    if v is not None and v < 1:
        raise UserError(f"{name} must be at least 1, got {v}")


def cmd_corpus(args: argparse.Namespace) -> int:
    from drmas_retrieval import RetrievalError, build_corpus

    try:
        n = build_corpus([_data_path(x) for x in args.inputs], args.out, dedupe=not args.no_dedupe,
                         contents=args.contents)
    except RetrievalError as e:
        raise UserError(str(e)) from None
    print(f"wrote {n} passages to {args.out}")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from drmas_retrieval import RetrievalError, build_index

    for name in ("limit", "batch_size", "shard_size", "max_length", "threads"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    for name in ("nlist", "nprobe", "pq_m", "pq_nbits"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.reuse_embeddings or args.embeddings_from:
        if args.kind != "dense":
            raise UserError("--reuse-embeddings / --embeddings-from need --kind dense")
        from drmas_retrieval.dense import rebuild_faiss

        src = args.embeddings_from or args.out
        try:
            m = rebuild_faiss(src, _faiss_params(args), out=args.out, overwrite=args.overwrite)
        except RetrievalError as e:
            raise UserError(str(e)) from None
        print(f"{args.faiss} FAISS index of {m['n_passages']} passages written to {args.out} from the embeddings of {src}")
        return 0
    if not args.corpus:
        raise UserError("--corpus is required (unless --reuse-embeddings)")
    if (args.import_faiss or args.part) and args.kind != "dense":
        raise UserError("--import-faiss / --part need --kind dense")
    opts: dict[str, Any] = {"overwrite": args.overwrite, "limit": args.limit}
    try:
        if args.kind == "bm25":
            from drmas_retrieval.bm25 import BM25Params

            opts["params"] = BM25Params(k1=args.k1, b=args.b, stemmer=args.stemmer)
        elif args.kind == "dense":
            from drmas_retrieval.dense import DEFAULT_ENCODER, EncoderConfig, import_faiss

            opts["encoder"] = EncoderConfig(model=args.encoder or DEFAULT_ENCODER, batch_size=args.batch_size,
                                            max_length=args.max_length, device=args.device, threads=args.threads)
            if args.import_faiss:
                m = import_faiss(_data_path(args.corpus), args.import_faiss, args.out, encoder=opts["encoder"],
                                 overwrite=args.overwrite)
                print(f"{m['params']['faiss']['kind']} FAISS index of {m['n_passages']} passages imported into {args.out} "
                      f"({m['params']['imported']['how']} to {args.import_faiss})")
                return 0
            opts["faiss_params"] = _faiss_params(args)
            opts["shard_size"] = args.shard_size
            if args.part:
                opts["part"] = _part(args.part)
        else:
            from drmas_retrieval.lucene import LuceneParams

            opts["params"] = LuceneParams(k1=args.k1, b=args.b, threads=args.threads or 1)
        m = build_index(args.kind, _data_path(args.corpus), args.out, **opts)
    except RetrievalError as e:
        raise UserError(str(e)) from None
    if "part" in m:
        i, n = m["part"]
        print(f"part {i}/{n} encoded; {m['shards_done']} of {m['n_shards']} embedding shards in {args.out}. The part "
              "that finishes last writes the FAISS index (or rerun any part once all have finished)")
        return 0
    print(f"{m['kind']} index of {m['n_passages']} passages written to {args.out} in {m['build_s']:.1f} s")
    return 0


def _part(text: str) -> tuple[int, int]:
    """``I/N`` -> (I, N) with 0 <= I < N."""
    i, sep, n = text.partition("/")
    if sep and i.strip().isdigit() and n.strip().isdigit() and 0 <= int(i) < int(n):
        return int(i), int(n)
    raise UserError(f"--part must be I/N with 0 <= I < N (e.g. 0/4 ... 3/4 for four GPUs), got {text!r}")


def _faiss_params(args: argparse.Namespace) -> Any:
    from drmas_retrieval.dense import FaissParams

    return FaissParams(kind=args.faiss, nlist=args.nlist, nprobe=args.nprobe, pq_m=args.pq_m, pq_nbits=args.pq_nbits)


def _add_dense_search_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("--nprobe", type=int, help="dense ivf / ivfpq: lists searched per query (default: the index's)")
    q.add_argument("--no-gpu-shard", dest="gpu_shard", action="store_false",
                   help="dense on several GPUs: copy the whole index onto each GPU instead of splitting it")
    q.add_argument("--gpu-fp16", action="store_true", help="dense on GPU: keep vectors as float16 (half the memory)")
    q.add_argument("--rerank", type=int, help="dense: re-score R x k FAISS candidates exactly from the kept embedding "
                                              "shards (for ivfpq; default off)")


def _open(spec: str, device: str | None, threads: int | None = None, args: argparse.Namespace | None = None) -> Any:
    from drmas_retrieval import RetrievalError, load_retriever, parse_spec

    _positive("--threads", threads)
    _positive("--nprobe", getattr(args, "nprobe", None))
    _positive("--rerank", getattr(args, "rerank", None))
    try:
        kind, _ = parse_spec(spec)
        opts = {"device": device, "threads": threads} if kind == "dense" else {}
        if kind == "dense" and args is not None:
            opts.update(nprobe=args.nprobe, gpu_shard=None if args.gpu_shard else False, gpu_fp16=args.gpu_fp16 or None,
                        rerank=args.rerank)
        return load_retriever(spec, **{k: v for k, v in opts.items() if v is not None})
    except RetrievalError as e:
        raise UserError(str(e)) from None


def cmd_eval(args: argparse.Namespace) -> int:
    from drmas_retrieval import RetrievalError
    from drmas_retrieval.evaluate import evaluate, format_report, read_questions

    try:
        ks = sorted({int(x) for x in args.k.split(",") if x.strip()})
    except ValueError:
        raise UserError(f"--k must be comma-separated integers, got {args.k!r}") from None
    if not ks or ks[0] < 1:
        raise UserError(f"--k values must be positive, got {args.k!r}")
    _positive("--limit", args.limit)
    _positive("--batch-size", args.batch_size)
    try:
        questions = read_questions(_data_path(args.questions), limit=args.limit)
        with _open(args.index, args.device, args.threads, args) as r:
            result = evaluate(r, questions, ks, batch_size=args.batch_size)
            result["retriever"] = r.info()
    except RetrievalError as e:
        raise UserError(str(e)) from None
    print(format_report(result, f"retriever: {args.index}"))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"metrics written to {args.json_out}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from drmas_retrieval import parse_spec
    from drmas_retrieval.server import limits_from_args, serve

    _positive("--topk", args.topk)
    try:
        limits = limits_from_args(args)
    except ValueError as e:
        raise UserError(str(e)) from None
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be 1..65535, got {args.port}")
    if args.index.startswith(("http://", "https://")):
        raise UserError("--index must be an index directory (serving a server URL would only proxy it)")
    r = _open(args.index, args.device, args.threads, args)
    kind, _ = parse_spec(args.index)
    print(f"serving {kind} index {args.index} ({r.info().get('n_passages')} passages) on http://{args.host}:{args.port}/retrieve")
    sig = serve(r, host=args.host, port=args.port, default_topk=args.topk, log_level=args.log_level, limits=limits)
    if sig is not None:  # a stop signal is how a server ends: a clean exit, not a failure
        from drmas_bench.signals import signal_name

        print(f"stopped by {signal_name(sig)}: the server shut down cleanly")
    return 0
