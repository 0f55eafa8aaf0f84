"""On-disk pieces shared by every index kind: the passage store and the index manifest.

An index directory holds

* ``drmas_index.json``   the manifest: kind, passage count, parameters, build time. Written last,
                         so a directory without it is an incomplete build.
* ``passages.jsonl``     the passages in row order (``{"id", "title", "text"}`` per line) and
* ``passages.offsets.npy`` the byte offset of every line (int64, n + 1 entries).

Both passage files are memory-mapped on load: a hit's row number becomes its passage with one
slice, whatever the corpus size, and the operating system shares the pages between processes.
"""

from __future__ import annotations

import json
import mmap
import os
import time
from array import array
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from drmas_retrieval.base import Passage, RetrievalError

MANIFEST = "drmas_index.json"
FORMAT = "drmas-retrieval-index"
FORMAT_VERSION = 1
PASSAGES = "passages.jsonl"
OFFSETS = "passages.offsets.npy"
KINDS = ("bm25", "dense", "lucene")


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file via temp file + rename (readers never see half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@contextmanager
def removed_on_failure(tmp: Path) -> Iterator[Path]:
    """A temporary file written inside the block, removed when the block fails or is interrupted
    (Ctrl-C, SIGTERM: ``drmas_bench.signals``), so a stopped build leaves no half-written copy of a
    corpus-sized file behind; a finished block renames it into place itself."""
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def corpus_fingerprint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Name, size and modification time of a corpus file: enough to tell a resumed build that
    the corpus changed under it."""
    p = Path(path)
    st = p.stat()
    return {"path": str(p.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_manifest(index_dir: Path, kind: str, n_passages: int, params: dict[str, Any],
                   corpus: dict[str, Any] | None = None, build_s: float | None = None) -> dict[str, Any]:
    """Write ``drmas_index.json`` (atomically) and return its content."""
    m = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "kind": kind,
        "n_passages": int(n_passages),
        "params": params,
        "corpus": corpus or {},
        "build_s": None if build_s is None else round(build_s, 3),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_text(index_dir / MANIFEST, json.dumps(m, indent=2) + "\n")
    return m


def read_manifest(index_dir: str | os.PathLike[str], kind: str | None = None) -> dict[str, Any]:
    """Read and check an index directory's manifest. Options: ``kind`` = the kind the caller
    expects (a mismatch is an error). Raises ``RetrievalError`` naming the directory."""
    d = Path(index_dir)
    if not d.is_dir():
        raise RetrievalError(f"index directory not found: {d}")
    mp = d / MANIFEST
    if not mp.is_file():
        raise RetrievalError(f"{d}: no {MANIFEST} (not an index directory, or an incomplete build: "
                             "rerun `drmas-bench retrieval index`)")
    try:
        m = json.loads(mp.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RetrievalError(f"{mp}: not valid JSON ({e.msg})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise RetrievalError(f"{mp}: not a drmas-bench retrieval index manifest")
    if m.get("version") != FORMAT_VERSION:
        raise RetrievalError(f"{mp}: index format version {m.get('version')} (this code reads {FORMAT_VERSION}); rebuild it")
    if m.get("kind") not in KINDS:
        raise RetrievalError(f"{mp}: unknown index kind {m.get('kind')!r} (known: {', '.join(KINDS)})")
    if kind is not None and m["kind"] != kind:
        raise RetrievalError(f"{d}: is a {m['kind']} index, not {kind}")
    return m


def prepare_out_dir(out: str | os.PathLike[str], overwrite: bool) -> Path:
    """Create the output directory of a build. An existing complete index is kept unless
    ``overwrite``; an incomplete one (no manifest) is reused, which is what lets a killed dense
    build resume."""
    d = Path(out)
    if (d / MANIFEST).exists():
        if not overwrite:
            raise RetrievalError(f"{d}: already holds an index (pass overwrite=True / --overwrite to rebuild)")
        (d / MANIFEST).unlink()
    d.mkdir(parents=True, exist_ok=True)
    return d


# ------------------------------------------------------------------------------ passage store


def write_passages(passages: Iterable[Passage], index_dir: Path, check_unique: bool = True) -> int:
    """Write the passage store (``passages.jsonl`` + ``passages.offsets.npy``); return the count.

    Options: ``check_unique`` rejects a corpus with a repeated id (RetrievalError naming the id).
    The offsets file is written last, so its presence marks a complete store."""
    offsets = array("q", [0])
    seen: set[str] = set()
    tmp = index_dir / f"{PASSAGES}.tmp-{os.getpid()}"  # several build processes may share the directory
    pos = 0
    with removed_on_failure(tmp), open(tmp, "wb") as f:
        for p in passages:
            if check_unique:
                if p.id in seen:
                    raise RetrievalError(f"duplicate passage id {p.id!r} in the corpus (ids must be unique)")
                seen.add(p.id)
            b = (p.to_json() + "\n").encode("utf-8")
            f.write(b)
            pos += len(b)
            offsets.append(pos)
    os.replace(tmp, index_dir / PASSAGES)
    tmp_off = index_dir / f"passages.offsets.tmp-{os.getpid()}.npy"
    with removed_on_failure(tmp_off):
        np.save(tmp_off, np.frombuffer(offsets, dtype=np.int64))
    os.replace(tmp_off, index_dir / OFFSETS)
    return len(offsets) - 1


def dir_lock(index_dir: Path, name: str) -> Any:
    """An exclusive inter-process lock on ``index_dir/.<name>.lock``, e.g. so one of several build
    processes writes the passage store while the others wait for it."""
    from drmas_retrieval.locks import file_lock

    return file_lock(Path(index_dir) / f".{name}.lock")


def has_passages(index_dir: Path) -> bool:
    return (index_dir / PASSAGES).is_file() and (index_dir / OFFSETS).is_file()


class PassageStore:
    """Random access to an index directory's passages by row number (memory-mapped)."""

    def __init__(self, index_dir: str | os.PathLike[str]):
        d = Path(index_dir)
        if not has_passages(d):
            raise RetrievalError(f"{d}: passage store missing ({PASSAGES} / {OFFSETS})")
        self.path = d / PASSAGES
        self.offsets = np.load(d / OFFSETS, mmap_mode="r")
        self._file = open(self.path, "rb")
        size = os.fstat(self._file.fileno()).st_size
        if size != int(self.offsets[-1]):
            self._file.close()
            raise RetrievalError(f"{self.path}: size {size} does not match its offsets ({int(self.offsets[-1])}); rebuild the index")
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def get(self, row: int) -> Passage:
        if not 0 <= row < len(self):
            raise IndexError(f"passage row {row} out of range (0..{len(self) - 1})")
        a, b = int(self.offsets[row]), int(self.offsets[row + 1])
        rec = json.loads(self._mm[a:b])  # type: ignore[index]
        return Passage(rec["id"], rec["title"], rec["text"])

    def get_many(self, rows: Iterable[int]) -> list[Passage]:
        return [self.get(int(r)) for r in rows]

    def iter_range(self, start: int, stop: int) -> Iterator[Passage]:
        for r in range(start, min(stop, len(self))):
            yield self.get(r)

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        self._file.close()
