"""A run directory: the durable record of one evaluation.

    runs/<name>/config.yaml     the fully resolved configuration (written once; checked on resume)
    runs/<name>/samples.jsonl   one finished trajectory per line, appended and flushed per batch
    runs/<name>/summary.json    metrics (drmas_bench.metrics.summarize), written atomically
    runs/<name>/summary.md      the same as a Markdown table

Resuming: re-running the same command opens the same directory, reads the finished
(benchmark, task id, sample index) keys and skips them. A line cut short by a kill (the only
kind of damage an append can suffer) is dropped and the file truncated back to the last complete
line, so nothing finished is lost and nothing is counted twice. A changed configuration refuses to
mix into the old directory unless the caller asks to start afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import yaml

from drmas_bench.types import Trajectory, UserError

CONFIG = "config.yaml"
SAMPLES = "samples.jsonl"


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


class RunDir:
    """Open (or create) a run directory for a configuration.

    Args:
        path: the run directory.
        config: the resolved configuration. Its ``identity`` part (what changes a sample's result:
            team, models, sampling, seed, workflow options) must match an existing run's;
            the rest (benchmarks, limit, n) may grow between invocations.
        fresh: start afresh: delete the old samples and summaries instead of resuming.
    """

    def __init__(self, path: str | os.PathLike, config: dict[str, Any], fresh: bool = False):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.samples_path = self.path / SAMPLES
        cfg_path = self.path / CONFIG
        if fresh:
            for name in (SAMPLES, "summary.json", "summary.md", CONFIG):
                (self.path / name).unlink(missing_ok=True)
        if cfg_path.exists():
            try:
                old = yaml.safe_load(cfg_path.read_text()) or {}
            except yaml.YAMLError as e:
                raise UserError(f"{cfg_path}: unreadable run config ({e}); use --fresh to start afresh") from None
            if fingerprint(old.get("identity", {})) != fingerprint(config.get("identity", {})):
                diff = sorted(k for k in set(old.get("identity", {})) | set(config.get("identity", {}))
                              if old.get("identity", {}).get(k) != config.get("identity", {}).get(k))
                raise UserError(
                    f"{self.path} holds a run with a different configuration (differs in: {', '.join(diff)}); "
                    f"choose another --out or pass --fresh to start afresh"
                )
        atomic_write(cfg_path, yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
        self._repair_tail()

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
        """Every finished trajectory as a dict (the last copy wins if a key repeats)."""
        if not self.samples_path.exists():
            return []
        by_key: dict[tuple, dict[str, Any]] = {}
        with open(self.samples_path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    raise UserError(f"{self.samples_path}:{lineno}: corrupt sample line; use --fresh to start afresh") from None
                by_key[(rec["task"]["benchmark"], rec["task"]["id"], rec["sample_idx"])] = rec
        return list(by_key.values())

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
