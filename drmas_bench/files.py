"""File names, atomic writes and identity by content: the helpers every layer shares (the run
directory, the engines, the model adapters, provenance, the call cache, the trainer's checkpoints).
A leaf: it imports only `types`.

- `cache_dir()`: the user cache folder (``$DRMAS_CACHE_DIR``, else ``$XDG_CACHE_HOME/drmas-bench``,
  else ``~/.cache/drmas-bench``);
- `safe_name(name, what)`: a name that may become one file name, else one UserError; `inside(root,
  path)`: a path that stays within its root, else one UserError;
- `atomic_write(path, text)`: readers see the old or the new content, never half of it;
- `file_sha256`, `model_identity`: a file's and a model folder's identity by content (hashes cached
  in the user cache, keyed by real path, size and mtime); `fingerprint`: a short hash of a mapping.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from drmas_bench.types import UserError

_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def cache_dir() -> Path:
    """The user cache: ``$DRMAS_CACHE_DIR``, else ``$XDG_CACHE_HOME/drmas-bench``, else
    ``~/.cache/drmas-bench`` (read at every call, so tests can point it elsewhere)."""
    env = os.environ.get("DRMAS_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "drmas-bench"


# ------------------------------------------------------------------------------- safe paths


def safe_name(name: Any, what: str) -> str:
    """``name`` if it may become one file name (``[A-Za-z0-9_.-]+``, no ``..``), else one UserError."""
    s = str(name)
    if not _SAFE_NAME.fullmatch(s) or ".." in s:
        raise UserError(f"{what} {s!r}: not a valid name (letters, digits, '_', '-', '.'; no '..' or '/') "
                        f"since it becomes a file name")
    return s


def inside(root: str | os.PathLike, path: str | os.PathLike) -> Path:
    """``path`` resolved, if it lies within ``root`` (resolved); else one UserError."""
    r, p = Path(root).resolve(), Path(path).resolve()
    if p != r and r not in p.parents:
        raise UserError(f"refusing to write {p}: it is outside the run directory {r}")
    return p


# ------------------------------------------------------------------------------- identity by content

PARTIAL_HASH_OVER = 8 * 1024 * 1024  # files larger than this are hashed by size, mtime, first and last MiB
_MIB = 1024 * 1024


def _cache_path() -> Path:
    return cache_dir() / "fingerprints.json"


def load_hash_cache() -> dict[str, str]:
    try:
        data = json.loads(_cache_path().read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def save_hash_cache(cache: dict[str, str]) -> None:
    try:
        if len(cache) > 20000:  # keep the file small: drop the oldest half
            cache = dict(list(cache.items())[-10000:])
        atomic_write(_cache_path(), json.dumps(cache))
    except OSError:
        pass  # a read-only cache dir costs time, not correctness


def file_sha256(path: str | os.PathLike, cache: dict[str, str] | None = None, partial_over: int | None = None) -> str:
    """sha256 of a file's bytes, or, above ``partial_over`` bytes, of its size plus its first and
    last MiB (``partial:`` prefix). ``cache`` maps "realpath|size|mtime_ns|mode" to a hash."""
    p = Path(path).resolve()
    st = p.stat()
    partial = partial_over is not None and st.st_size > partial_over
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}|{'partial' if partial else 'full'}"
    if cache is not None and key in cache:
        return cache[key]
    h = hashlib.sha256()
    with open(p, "rb") as f:
        if partial:
            h.update(str(st.st_size).encode())
            h.update(f.read(_MIB))
            f.seek(st.st_size - _MIB)
            h.update(f.read(_MIB))
        else:
            for chunk in iter(lambda: f.read(_MIB), b""):
                h.update(chunk)
    digest = ("partial:" if partial else "") + h.hexdigest()
    if cache is not None:
        cache[key] = digest
    return digest


def model_identity(folder: str | os.PathLike) -> dict[str, str]:
    """What a model folder is: its real path and one hash over its files.

    Small files (config, tokenizer, weight index) are hashed in full; files over
    ``PARTIAL_HASH_OVER`` (the weights) by size and their first and last MiB (which hold a
    safetensors file's header: every tensor's name, dtype, shape and offset). Hashes are cached in
    the user cache dir keyed by (real path, size, mtime), so a 7B folder costs milliseconds after
    the first look. This tells apart two checkpoints (``latest`` moved, weights replaced, config
    changed); it does not prove that a weight file was not edited in its middle with size and mtime
    kept."""
    real = Path(folder).resolve()
    cache = load_hash_cache()
    before = len(cache)
    h = hashlib.sha256()
    for f in sorted(real.rglob("*")):
        rel = f.relative_to(real)
        if not f.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        h.update(f"{rel.as_posix()}\0{file_sha256(f, cache, PARTIAL_HASH_OVER)}\n".encode())
    if len(cache) != before:
        save_hash_cache(cache)
    return {"path": str(real), "content": h.hexdigest()[:32]}


def umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc/self/status), else
    by setting and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write(path: Path, text: str | bytes) -> None:
    """Write a file so that readers see the old or the new content, never half of it; its mode is
    a plain file's under the umask (0644 under 022), as ``open`` would make it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp's 0600 is for the temporary name: the file itself follows umask
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fingerprint(config: dict[str, Any]) -> str:
    """A short hash of a JSON-able mapping (a run's identity, its default name)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]
