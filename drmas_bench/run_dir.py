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
go through ``safe_name``; ``inside`` checks that a path stays within its run directory (all four,
with ``atomic_write`` and ``fingerprint``, live in the leaf ``drmas_bench.files``, which every layer
may import).

Every sample carries its run's stamp (``"run"``: the identity's fingerprint, workflow, model
contents, data hash; ``run_stamps``), and a resume checks each kept sample against the run being
resumed, not only config.yaml: a sample drawn with other sampling, by another model or workflow, or
from another benchmark file is refused with one line. A run directory whose config.yaml is gone is
rebuilt from the current command only when every sample carries that command's stamp.

What a run directory reports (summary, leaderboard, cost) is ``run_samples.select_records``: the
samples of the latest command's selection (its benchmarks, its first ``limit`` questions, sample
indices below its ``n``); samples outside it stay on disk and count again when a larger selection
is run.

A line that cannot be read stops every reader (``run_samples.read_samples``) with one error naming
``drmas-bench runs repair RUN`` (``repair_samples``), which moves such lines into
``samples.jsonl.quarantine`` and keeps every good one.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

import yaml

from drmas_bench import compact
from drmas_bench.compact import COMPACT
from drmas_bench.files import atomic_write, fingerprint, inside
from drmas_bench.log import write_traceback
from drmas_bench.records import RecordView, view
from drmas_bench.run_index import INDEX, SampleIndex, cut_partial_line
from drmas_bench.run_samples import (
    QUARANTINE,
    SAMPLES,
    parse_sample_line,
    read_samples,
    repair_hint,
    sample_key,
    select_records,
    selection_of,
    selection_test,
)
from drmas_bench.run_stamps import mismatch_signature, run_stamp, sample_mismatch
from drmas_bench.types import Trajectory, UserError

logger = logging.getLogger(__name__)

CONFIG = "config.yaml"
LOCK = ".lock"
SUMMARY_KEY = ".summary-key"  # what summary.json was computed from (RunDir.summary_key)
ERROR_LOG = "error.log"


# ------------------------------------------------------------------------------- one writer


class RunLock:
    """An exclusive lock on ``RUN/.lock`` for the life of this object (or ``with`` block).

    The file holds the holder's PID. A second process gets one UserError naming that PID; a lock
    whose process died was released by the kernel and is taken over silently."""

    def __init__(self, run: str | os.PathLike) -> None:

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


def write_error_log(run: str | os.PathLike, exc: BaseException) -> Path | None:
    """Append ``exc``'s traceback to ``RUN/error.log``; returns where it went (a temporary file when
    the run directory cannot be written, e.g. a full disk: no empty error.log is left behind;
    None when it went to stderr). See ``drmas_bench.log.write_traceback``."""

    return write_traceback(exc, Path(run) / ERROR_LOG)


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
            for name in (SAMPLES, INDEX, COMPACT, SUMMARY_KEY, "summary.json", "summary.md", CONFIG):
                (self.path / name).unlink(missing_ok=True)
        self._repair_tail()
        self.index = SampleIndex(self.path, self.samples_path, self._indexed_line, mismatch_signature).load()
        self._appended = False
        if compact.lines_in(self.path / COMPACT) != len(self.index):  # missing, older, or behind samples.jsonl
            compact.rebuild(self.path / COMPACT, self._each_record(), self.config.get("workflow"))
        kept = len(self.index)
        old: dict[str, Any] | None = None
        if cfg_path.exists() and kept:  # without finished samples there is nothing to mix
            try:
                old = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
            except (yaml.YAMLError, UnicodeDecodeError) as e:
                raise UserError(f"{cfg_path}: unreadable run config ({str(e).splitlines()[0]}); delete it to "
                                f"rebuild it from this command (every kept sample's stamp is checked against it), "
                                f"or choose another --out") from None
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
        self._check_kept(kept, config, config_missing=not cfg_path.exists())
        if (old is None and kept) or (old is not None and selection_of(old) != selection_of(config)):
            for name in ("summary.json", "summary.md"):  # they describe the old selection; rewritten at the end
                (self.path / name).unlink(missing_ok=True)
        atomic_write(cfg_path, yaml.safe_dump(config, sort_keys=False, allow_unicode=True))

    def _each_record(self) -> Iterable[dict[str, Any]]:
        """samples.jsonl's records one at a time, in file order (its lines were checked by the index)."""
        if not self.samples_path.is_file():
            return
        with open(self.samples_path, "rb") as f:
            for raw in f:
                rec = parse_sample_line(raw) if raw.endswith(b"\n") and raw.strip() else None
                if rec is not None:
                    yield rec

    def _indexed_line(self, raw: bytes, lineno: int) -> dict[str, Any] | None:
        """The index's reader of samples.jsonl lines: a record, or one UserError naming the repair."""
        rec = parse_sample_line(raw)
        if rec is None:
            raise UserError(f"{self.samples_path}:{lineno}: not a trajectory record (corrupt line); "
                            f"{repair_hint(self.path)}")
        return rec

    def _check_kept(self, kept: int, config: dict[str, Any], config_missing: bool) -> None:
        """Every kept sample must belong to the run ``config`` describes (``sample_mismatch``); with
        config.yaml gone, the samples' stamps are the only record, so each must carry one. Samples
        alike in everything the check reads share a signature (``run_index.signature``): the first
        sample of each is read and checked, not every sample."""
        stamps: dict[str, dict] = {}
        for lineno, rec in self.index.representatives():
            diffs = sample_mismatch(rec, config, stamps)
            b, tid, idx = sample_key(rec)
            where = f"{self.samples_path}:{lineno}: sample ({b}, {tid}, {idx})"
            fix = f"choose another --out, or pass --fresh to discard the {kept} kept samples"
            if diffs:
                gone = "; config.yaml is missing, so nothing else says what made them" if config_missing else ""
                raise UserError(f"{where} was not made by this configuration (it has {', '.join(diffs[:3])}){gone}; {fix}")
            if config_missing and not isinstance(rec.get("run"), dict):
                raise UserError(f"{where} records no model (written before samples carried their run's stamp) and "
                                f"config.yaml is missing, so what made it cannot be checked; restore "
                                f"{self.path / CONFIG}, or {fix}")
        if config_missing and kept:
            logger.info(
                f"[eval] {self.path / CONFIG} was missing: rebuilt from this command, whose stamp all "
                f"{kept} kept samples carry")

    def close(self) -> None:
        """Release the run directory's lock (also released when the process exits)."""
        self.lock.release()

    def log_error(self, exc: BaseException) -> Path | None:
        """Keep ``exc``'s traceback in ``RUN/error.log``; returns where it went (``write_error_log``)."""
        return write_error_log(self.path, exc)

    # ------------------------------------------------------------------------------- samples

    def _repair_tail(self) -> None:
        """Drop a trailing partial line left by a kill during an append (``run_index.cut_partial_line``)."""
        cut_partial_line(self.samples_path)

    def records(self) -> list[dict[str, Any]]:
        """Every finished trajectory as a dict (`read_samples`: the last copy wins if a key repeats)."""
        return read_samples(self.samples_path, missing_ok=True)

    def selected(self) -> list[dict[str, Any]]:
        """The records this run reports (``select_records`` over its configuration)."""
        return select_records(self.records(), self.config)

    def compact_views(self) -> list[RecordView]:
        """``selected`` as views of RUN/records.compact.jsonl (``drmas_bench.compact``), read a line at a
        time: what summaries read. A view keeps no run stamp, no requests, and as ``raw`` the figures only."""
        path = self.path / COMPACT
        selected = selection_test(self.config)
        by_key: dict[tuple, RecordView] = {}

        def keep(rec: dict[str, Any]) -> None:
            if selected(rec):  # the last copy of a key wins, in the place of the first (read_samples)
                rec.pop("run", None)  # neither the stamp nor each call's request (sampling) is summarized
                for t in rec.get("turns") or ():
                    if isinstance(t, dict):
                        t.pop("request", None)
                by_key[sample_key(rec)] = replace(view(rec), raw={"figures": rec["figures"]} if "figures" in rec else {})

        if not path.exists():
            for rec in self.selected():
                keep(compact.compact(rec, self.config.get("workflow")))
        else:
            with open(path, "rb") as f:
                f.readline()
                for raw in f:
                    keep(json.loads(raw))
        return list(by_key.values())

    def done_keys(self) -> set[tuple[str, str, int]]:
        """The (benchmark, task id, sample index) of every finished sample: from the index while
        nothing was appended since the run directory was opened (samples.jsonl is not read)."""
        if not self._appended:
            return set(self.index.opened_keys)
        return {sample_key(r) for r in self.records()}

    def append(self, trajectories: Iterable[Trajectory], with_tokens: bool = False) -> int:
        """Append finished trajectories, each with its run stamp, and flush them to disk (one write,
        one fsync)."""
        stamps: dict[str, dict[str, Any]] = {}
        recs, lines = [], []
        for t in trajectories:
            stamp = stamps.get(t.task.benchmark) or stamps.setdefault(t.task.benchmark, run_stamp(self.config, t.task.benchmark))
            recs.append({**t.to_dict(with_tokens), "run": stamp})
            lines.append(json.dumps(recs[-1], ensure_ascii=False).encode("utf-8"))
        if not lines:
            return 0
        with open(self.samples_path, "ab") as f:
            f.write(b"".join(raw + b"\n" for raw in lines))
            f.flush()
            os.fsync(f.fileno())
            end = f.tell()
        self._appended = True
        compact.append(self.path / COMPACT, recs, self.config.get("workflow"))
        self.index.add(recs, lines, end)  # after the samples are safe: a kill in between re-indexes the tail
        return len(lines)

    # ------------------------------------------------------------------------------- summary

    def summary_key(self, inputs: dict[str, Any]) -> str:
        """A hash of what summary.json's figures are computed from: the samples (the index's state),
        the configuration's selection and ``inputs`` (prices, workflow, grader, ...)."""
        return fingerprint({"samples": self.index.state(), "selection": selection_of(self.config), "inputs": inputs})

    def kept_summary(self, key: str) -> dict[str, Any] | None:
        """summary.json as written with ``key`` (``write_summary``), or None: another key, no key, or
        a summary that cannot be read."""
        try:
            if (self.path / SUMMARY_KEY).read_text(encoding="utf-8").strip() != key:
                return None
            doc = json.loads((self.path / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def write_summary(self, summary: dict[str, Any], markdown: str, key: str | None = None) -> None:
        """Write summary.json and summary.md; with ``key`` (``summary_key``), also RUN/.summary-key, so
        that the same summary may be reused: only when summary.json reads back as exactly ``summary``."""
        (self.path / SUMMARY_KEY).unlink(missing_ok=True)
        text = json.dumps(summary, indent=2, ensure_ascii=False, default=str)
        atomic_write(self.path / "summary.json", text)
        atomic_write(self.path / "summary.md", markdown)
        if key is not None and json.loads(text) == summary:
            atomic_write(self.path / SUMMARY_KEY, key + "\n")


# ------------------------------------------------------------------------------- repair


def repair_samples(run: str | os.PathLike) -> tuple[int, list[int], Path]:
    """``drmas-bench runs repair RUN``: move every unreadable line of RUN/samples.jsonl (``parse_sample_line``)
    into RUN/samples.jsonl.quarantine, verbatim, and keep every readable one, in order.

    Holds the run's lock (never while an eval writes). The quarantine is appended to and synced
    first, then samples.jsonl is replaced atomically, so a crash in between loses no line (at worst
    a re-run quarantines the same lines twice). A file with no bad line is left untouched, so the
    command is idempotent. Returns (records kept, line numbers moved, quarantine path)."""
    p = Path(run)
    if not p.is_dir():
        raise UserError(f"{p}: not a run directory")
    samples, quarantine = p / SAMPLES, p / QUARANTINE
    for f in (samples, quarantine):  # replaced and appended to: a planted symlink must not lead outside
        inside(p, f)
    with RunLock(p):
        if not samples.is_file():
            raise UserError(f"{p}: no {SAMPLES} to repair")
        data = samples.read_bytes()
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()  # the newline after the last line
        good: list[tuple[int, bytes]] = []
        bad: list[tuple[int, bytes]] = []
        for lineno, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            (good if parse_sample_line(raw) is not None else bad).append((lineno, raw))
        if bad:
            with open(quarantine, "ab") as out:
                out.write(b"".join(raw + b"\n" for _, raw in bad))
                out.flush()
                os.fsync(out.fileno())
            atomic_write(samples, b"".join(raw + b"\n" for _, raw in good))
    return len(good), [n for n, _ in bad], quarantine
