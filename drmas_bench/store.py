"""A run directory: the durable record of one evaluation.

    runs/<name>/config.yaml     the fully resolved configuration (written once; checked on resume)
    runs/<name>/samples.jsonl   one finished trajectory per line, appended and flushed per batch
    runs/<name>/summary.json    metrics (drmas_bench.metrics.summarize), written atomically
    runs/<name>/summary.md      the same as a Markdown table

Resuming: re-running the same command opens the same directory, reads the finished
(benchmark, task id, sample index) keys and skips them. A line cut short by a kill (the only
kind of damage an append can suffer) is dropped and the file truncated back to the last complete
line, so nothing finished is lost and nothing is counted twice. A changed configuration refuses to
mix into the old directory unless the caller asks to start afresh; while no sample is finished
yet there is nothing to mix, so a corrected command simply replaces the configuration.

One writer: ``RUN/.lock`` is held (``fcntl.flock``, the holder's PID written inside) by the process
that runs; a second process is refused with one line naming the holder. The kernel releases the
lock when its process dies, so a lock left by a killed run is simply taken over.

Identity by content: ``model_identity`` (a model folder's real path and a hash of its files) and
``file_sha256`` (benchmark files) go into the configuration, so resuming onto other weights or
other data is refused even when the path given is the same text. Names that become file names
go through ``safe_name``; ``inside`` checks that a path stays within its run directory.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import tempfile
import traceback
from pathlib import Path
from typing import Any, Iterable

import yaml

from drmas_bench.types import Trajectory, UserError

CONFIG = "config.yaml"
SAMPLES = "samples.jsonl"
LOCK = ".lock"
ERROR_LOG = "error.log"
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


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


# ------------------------------------------------------------------------------- one writer



def sample_key(rec: dict[str, Any]) -> tuple[str, str, int]:
    """A record's (benchmark, task id, sample index): what a resumed run skips and a repeat replaces."""
    return str(rec["task"]["benchmark"]), str(rec["task"]["id"]), int(rec["sample_idx"])


def read_samples(path: str | os.PathLike, missing_ok: bool = False, hint: str = "") -> list[dict[str, Any]]:
    """Every trajectory record of a samples.jsonl, the one reader (run store, reports, summaries).

    The last copy of a repeated (benchmark, task id, sample index) wins, as appends replace. A cut-off
    last line (a run killed while appending) is ignored; any other bad line is a UserError naming
    file and line (+ `hint`). A missing file: [] with `missing_ok`, else a UserError."""
    p = Path(path)
    if not p.is_file():
        if missing_ok:
            return []
        raise UserError(f"{p} not found: not a finished or started run directory")
    by_key: dict[tuple, dict[str, Any]] = {}
    lines = p.read_text(encoding="utf-8").split("\n")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            key = sample_key(rec)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            if lineno == len(lines):  # no newline after it: cut off by a kill mid-append
                continue
            raise UserError(f"{p}:{lineno}: not a trajectory record (corrupt line){hint}") from None
        by_key[key] = rec
    return list(by_key.values())


class RunLock:
    """An exclusive lock on ``RUN/.lock`` for the life of this object (or ``with`` block).

    The file holds the holder's PID. A second process gets one UserError naming that PID; a lock
    whose process died was released by the kernel and is taken over silently."""

    def __init__(self, run: str | os.PathLike) -> None:
        import fcntl

        self.path = inside(run, Path(run) / LOCK)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(self._fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(self._fd)
            self._fd = None
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise UserError(f"{Path(run)} is in use by another drmas-bench process (PID {holder}); "
                                f"wait for it to finish or choose another --out") from None
            raise
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def make_run_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Create the run directory (and parents); a path that cannot be a writable directory is one
    UserError naming ``flag``."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{flag} {p}: exists and is not a directory") from None
    except NotADirectoryError:
        raise UserError(f"{flag} {p}: a parent of it is a file, not a directory") from None
    except OSError as e:
        raise UserError(f"{flag} {p}: cannot create the run directory ({e.strerror})") from None
    if not p.is_dir():
        raise UserError(f"{flag} {p}: exists and is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=p, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"{flag} {p}: the run directory is not writable ({e.strerror})") from None
    return p


def write_error_log(run: str | os.PathLike, exc: BaseException) -> Path:
    """Append ``exc``'s traceback to ``RUN/error.log``; returns the log's path."""
    import time

    path = Path(run) / ERROR_LOG
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} PID {os.getpid()}\n")
        f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    return path


# ------------------------------------------------------------------------------- identity by content

PARTIAL_HASH_OVER = 8 * 1024 * 1024  # files larger than this are hashed by size, mtime, first and last MiB
_MIB = 1024 * 1024


def _cache_path() -> Path:
    from drmas_bench.models import cache_dir

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


def atomic_write(path: Path, text: str) -> None:
    """Write a file so that readers see the old or the new content, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fingerprint(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def diff_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two nested mappings differ (a non-mapping difference is its own key)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            out += diff_keys(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [prefix.rstrip(".") or "(all)"]


def _data_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Benchmarks present in both ``data`` sections whose file hashes differ."""
    return [f"data.{b}" for b in sorted(set(old) & set(new)) if old[b] != new[b]]


def _describe_models(changed: list[str], old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Collapse ``models.<wg>.*`` differences into one readable entry per worker group."""
    out, seen = [], set()
    for key in changed:
        parts = key.split(".")
        if parts[0] != "models" or len(parts) < 2:
            out.append(key)
            continue
        wg = parts[1]
        if wg in seen:
            continue
        seen.add(wg)
        o, n = old.get(wg) or {}, new.get(wg) or {}
        what = "other weights" if o.get("path") == n.get("path") else f"{n.get('path') or n.get('name')}"
        out.append(f"models.{wg} (was {o.get('path') or o.get('name')}, content {str(o.get('content'))[:8]}; "
                   f"now {what}, content {str(n.get('content'))[:8]})")
    return out


class RunDir:
    """Open (or create) a run directory for a configuration, holding its lock.

    Args:
        path: the run directory.
        config: the resolved configuration. Its ``identity`` part (what changes a sample's result:
            team, model contents, sampling, seed, workflow options) must match an existing run's;
            its ``data`` part (benchmark -> sha256 of the file read) must match for benchmarks
            both runs read; the rest (benchmarks, limit, n) may grow between invocations.
        fresh: start afresh: delete the old samples and summaries instead of resuming.
    """

    def __init__(self, path: str | os.PathLike, config: dict[str, Any], fresh: bool = False):
        self.path = make_run_dir(path)
        self.lock = RunLock(self.path)  # before anything is read or deleted
        try:
            self._open(config, fresh)
        except BaseException:
            self.lock.release()
            raise

    def _open(self, config: dict[str, Any], fresh: bool) -> None:
        self.config = config
        for name in (SAMPLES, ERROR_LOG):  # appended to in place: a planted symlink must not lead outside
            inside(self.path, self.path / name)
        self.samples_path = self.path / SAMPLES
        cfg_path = self.path / CONFIG
        if fresh:
            for name in (SAMPLES, "summary.json", "summary.md", CONFIG):
                (self.path / name).unlink(missing_ok=True)
        has_samples = self.samples_path.exists() and self.samples_path.stat().st_size > 0
        if cfg_path.exists() and has_samples:  # without finished samples there is nothing to mix
            try:
                old = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
            except (yaml.YAMLError, UnicodeDecodeError) as e:
                raise UserError(f"{cfg_path}: unreadable run config ({str(e).splitlines()[0]}); "
                                f"use --fresh to start afresh") from None
            old_id, new_id = old.get("identity", {}), config.get("identity", {})
            if "models" not in old_id:  # a run from before model identities: nothing to compare them with
                new_id = {k: v for k, v in new_id.items() if k != "models"}
            changed = diff_keys(old_id, new_id) if fingerprint(old_id) != fingerprint(new_id) else []
            changed = _describe_models(changed, old_id.get("models") or {}, new_id.get("models") or {})
            changed += _data_changes(old.get("data") or {}, config.get("data") or {})
            if changed:
                shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
                raise UserError(
                    f"{self.path} holds a run with a different configuration (differs in: {shown}); "
                    f"choose another --out or pass --fresh to start afresh"
                )
            config = {**config, "data": {**(old.get("data") or {}), **(config.get("data") or {})}}
            self.config = config
        atomic_write(cfg_path, yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
        self._repair_tail()

    def close(self) -> None:
        """Release the run directory's lock (also released when the process exits)."""
        self.lock.release()

    def log_error(self, exc: BaseException) -> Path:
        """Keep ``exc``'s traceback in ``RUN/error.log``; returns its path."""
        return write_error_log(self.path, exc)

    # ------------------------------------------------------------------------------- samples

    def _repair_tail(self) -> None:
        """Drop a trailing partial line left by a kill during an append."""
        p = self.samples_path
        if not p.exists() or p.stat().st_size == 0:
            return
        with open(p, "rb+") as f:
            data = f.read()
            if data.endswith(b"\n"):
                return
            cut = data.rfind(b"\n") + 1  # 0 when the only line is partial
            f.truncate(cut)

    def records(self) -> list[dict[str, Any]]:
        """Every finished trajectory as a dict (`read_samples`: the last copy wins if a key repeats)."""
        return read_samples(self.samples_path, missing_ok=True, hint="; use --fresh to start afresh")

    def done_keys(self) -> set[tuple[str, str, int]]:
        return {(r["task"]["benchmark"], r["task"]["id"], r["sample_idx"]) for r in self.records()}

    def append(self, trajectories: Iterable[Trajectory], with_tokens: bool = False) -> int:
        """Append finished trajectories and flush them to disk (one write, one fsync)."""
        lines = [json.dumps(t.to_dict(with_tokens), ensure_ascii=False) + "\n" for t in trajectories]
        if not lines:
            return 0
        with open(self.samples_path, "a", encoding="utf-8") as f:
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())
        return len(lines)

    # ------------------------------------------------------------------------------- summary

    def write_summary(self, summary: dict[str, Any], markdown: str) -> None:
        atomic_write(self.path / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False, default=str))
        atomic_write(self.path / "summary.md", markdown)
