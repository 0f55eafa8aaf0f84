"""The retriever a search run uses: the default spec, the note on a trained team's own, opening one.

One home for eval and the trainer: both open their retriever with :func:`open_retriever`, which
probes it once, so a server that is down or an index that is missing fails before any episode runs
(and, for eval, before the run directory is touched).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from drmas_bench.models import cache_dir
from drmas_bench.types import UserError
from drmas_retrieval import build_index, load_retriever
from drmas_retrieval.loader import parse_spec
from drmas_retrieval.store import read_manifest

logger = logging.getLogger(__name__)


def default_spec(data_dir) -> str:
    """The embedded default: BM25 over the mini corpus, cached under the user cache dir."""

    if data_dir is None or not (Path(data_dir) / "corpus" / "mini_corpus.jsonl").is_file():
        raise UserError("the search suite needs a retriever: pass --retriever bm25:DIR|lucene:DIR|dense:DIR|URL, "
                        "or a --data-dir holding corpus/mini_corpus.jsonl for the default BM25 index")
    out = cache_dir() / "indexes" / "mini_corpus-bm25"
    if not (out / "drmas_index.json").is_file():
        logger.info(f"[eval] building the default BM25 index of the mini corpus in {out}")
        build_index("bm25", Path(data_dir) / "corpus" / "mini_corpus.jsonl", out)
    return f"bm25:{out}"


def retriever_record(spec: str | None) -> dict[str, Any] | None:
    """What a checkpoint records of the retriever it was trained with: ``{kind, identity}``.
    identity: for an index folder a hash of its manifest's kind, size, parameters and corpus size
    (not its path, so a copy on another machine matches); for a server its URL."""
    if not spec:
        return None
    kind, where = parse_spec(spec)
    if kind == "http":
        return {"kind": kind, "identity": where.rstrip("/")}
    m = read_manifest(where)
    key = {"kind": m.get("kind"), "n_passages": m.get("n_passages"), "params": m.get("params"),
           "corpus_bytes": (m.get("corpus") or {}).get("bytes"), "encoder": m.get("encoder")}
    return {"kind": kind, "identity": hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}


def note_trained_retriever(team, retriever_spec: str | None) -> None:
    """A trained team records the retriever it learned with; say so when eval uses another one."""

    if not team.retriever or not retriever_spec:
        return
    try:
        now = retriever_record(retriever_spec)
    except Exception:  # an unreadable index fails later with its own message
        return
    if now != {k: team.retriever.get(k) for k in ("kind", "identity")}:
        logger.warning(f"[eval] note: the team was trained with retriever {team.retriever.get('kind')} "
                       f"({team.retriever.get('identity')}); this run uses {now['kind']} ({now['identity']})")


def open_retriever(spec: str, hint: str = "") -> Any:
    """The retriever named by ``spec`` (bm25:DIR | lucene:DIR | dense:DIR | http://HOST:PORT), probed
    with one query; any failure is one UserError ``retriever SPEC: <first line><hint>``."""

    try:
        retriever = load_retriever(spec)
        retriever.search(["probe"], 1)  # a server that is down, an index that is missing: fail here
    except Exception as e:  # noqa: BLE001 - any failure means "this retriever cannot serve the run"
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"retriever {spec}: {first}{hint}") from None
    return retriever
