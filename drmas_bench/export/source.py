"""A finished run directory read for export: its config, summary.json and the selected records,
plus what every format writes from them (per-model and per-agent token usage, the metric figures of
each benchmark block, where a benchmark's data comes from).

What counts as exportable: a run directory (config.yaml) whose eval finished (summary.json, written
last) and whose summary still counts the samples on disk. A run stopped by a limit that wrote its
summary is exported with ``stopped`` set (each format flags it); a run killed before its summary, a
run in progress and a summary older than the samples are refused. An unreadable samples line is left
out with a warning and named in ``unreadable_lines`` (the formats record it), never silently.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from drmas_bench.benchmarks.catalog import get_benchmark
from drmas_bench.records import RecordView, TurnView, views
from drmas_bench.run_dir import CONFIG, LOCK
from drmas_bench.run_samples import SAMPLES, parse_sample_line, repair_hint, sample_key, select_records
from drmas_bench.types import UserError

logger = logging.getLogger(__name__)

SUMMARY = "summary.json"

#: summary keys of a benchmark block whose values are score figures (a number, or {k: number})
METRIC_PREFIXES = ("avg@", "pass@", "pass^")


@dataclass
class Usage:
    """Tokens and calls of one model or one agent, summed over the exported records."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    unknown_calls: int = 0  # calls whose engine reported no token counts (counted as 0 here)
    usd: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class FinishedRun:
    """What the export formats read from a run directory."""

    path: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    unreadable_lines: list[int] = field(default_factory=list)
    stopped: str | None = None  # why a limit stopped the run before its selection was done; None = complete

    @cached_property
    def views(self) -> list[RecordView]:
        """The records as typed views (`records.RecordView`), built once."""
        return views(self.records)

    @property
    def name(self) -> str:
        return self.path.resolve().name

    @property
    def suite(self) -> str:
        return str(self.config.get("suite") or (self.summary.get("run") or {}).get("suite") or "?")

    @property
    def workflow(self) -> str:
        return str(self.config.get("workflow") or (self.summary.get("run") or {}).get("workflow") or "?")

    @property
    def n(self) -> int:
        return int(self.config.get("n") or max((r.sample_idx or 0 for r in self.views), default=0) + 1)

    @property
    def benchmarks(self) -> list[str]:
        return list(self.summary.get("benchmarks") or {}) or sorted({r.benchmark for r in self.views})

    @property
    def team(self) -> dict[str, Any]:
        return (self.config.get("identity") or {}).get("team") or {}

    def agent_model(self, agent: str, wg: str | None = None) -> str:
        """The model an agent's turns ran on (by the turn's worker group when given)."""
        team = self.team
        if wg is None:
            a = (team.get("agents") or {}).get(agent)
            wg = a.get("wg") if isinstance(a, dict) else a
        g = (team.get("worker_groups") or {}).get(wg) if wg else None
        if isinstance(g, str):
            return g
        if isinstance(g, dict) and g.get("model"):
            return str(g["model"])
        return str(wg or agent)

    @property
    def models(self) -> list[str]:
        """The team's distinct models, in the team file's agent order."""
        return list(dict.fromkeys(self.agent_model(a) for a in (self.team.get("agents") or {}))) or ["unknown"]

    def usage(self, by: str) -> dict[str, Usage]:
        """Summed usage of every recorded call, keyed by its ``"model"`` or its ``"agent"``."""
        out: dict[str, Usage] = {}
        for r in self.views:
            for t in r.turns:
                key = self.agent_model(t.agent, t.wg) if by == "model" else t.agent
                u = out.setdefault(key, Usage())
                add_turn(u, t)
        return out

    @property
    def started_at(self) -> str | None:
        return (self.config.get("provenance") or {}).get("started_at") or (self.summary.get("provenance") or {}).get("started_at")

    @property
    def finished_at(self) -> str | None:
        return (self.summary.get("provenance") or {}).get("finished_at")


def add_turn(u: Usage, turn: Any) -> None:
    """Add one recorded call's (`records.TurnView`, or a stored turn dict) tokens and dollars to ``u``."""
    c = TurnView.of(turn).call
    u.calls += 1
    if not c.tokens_recorded or not c.usage_known:
        u.unknown_calls += 1
    u.prompt_tokens += c.prompt_tokens
    u.completion_tokens += c.completion_tokens
    u.usd += c.cost_usd


def metric_figures(block: dict[str, Any]) -> dict[str, float]:
    """The score figures of one summary block (a benchmark, `micro` or `macro`) as flat names:
    ``avg@n``, ``pass@n``, ``pass@1`` ... from ``pass@k``, ``pass^2`` ... from ``pass^k``. Any key
    with one of :data:`METRIC_PREFIXES` is read, so figures a newer summary adds come along."""
    out: dict[str, float] = {}
    for key, val in block.items():
        if not key.startswith(METRIC_PREFIXES):
            continue
        if isinstance(val, dict) and key.endswith("k"):
            for k, v in val.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[f"{key[:-1]}{k}"] = float(v)
        elif isinstance(val, (int, float)) and not isinstance(val, bool):
            out[key] = float(val)
    return out


def named_figures(block: dict[str, Any], n: int) -> dict[str, tuple[str, float]]:
    """:func:`metric_figures` named for readers outside this project: ``@n`` / ``^n`` written with the
    run's n (``avg@16``), a duplicate of an explicit k left out; where that name already holds
    another value (a run whose questions have different sample counts) the ``@n`` name is kept.
    -> {shown name: (the summary's name, value)}"""
    out: dict[str, tuple[str, float]] = {}
    for name, v in metric_figures(block).items():
        shown = name.replace("@n", f"@{n}").replace("^n", f"^{n}")
        if shown in out and abs(out[shown][1] - v) > 1e-12:
            shown = name
        out.setdefault(shown, (name, v))
    return out


def metric_ci(block: dict[str, Any], name: str) -> tuple[float, float] | None:
    """The 95% CI a summary block records for ``name`` (its ``ci95``), when it has one; a k-indexed
    name (``pass^2``) is read from the family's dict (``ci95["pass^k"]["2"]``)."""
    cis = block.get("ci95") or {}
    ci = cis.get(name)
    m = re.fullmatch(r"(.+[@^])(\d+)", name)
    if ci is None and m and isinstance(cis.get(f"{m.group(1)}k"), dict):
        ci = cis[f"{m.group(1)}k"].get(m.group(2))
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci):
        return float(ci[0]), float(ci[1])
    return None


def benchmark_source(name: str) -> dict[str, str | None]:
    """Where benchmark ``name``'s questions come from: {"type": hub dataset id, "split", "config"}.
    A benchmark without a hub source (the built-in toy suite) is named ``drmas-bench/<name>``."""
    try:
        b = get_benchmark(name)
    except UserError:
        return {"type": f"drmas-bench/{name}", "split": "test", "config": None}
    if b.hub is not None:
        return {"type": b.hub.path, "split": b.hub.split, "config": b.hub.config}
    return {"type": f"drmas-bench/{name}", "split": b.split, "config": None}


#: the summary keys that may record a stop by a limit (at the top or under ``run``)
STOP_KEYS = ("stopped", "stopped_by", "stop_reason", "limit_reached")


def stop_reason(summary: dict[str, Any]) -> str | None:
    """Why a run stopped before its selection was done, as its summary records it (a spending or
    token limit), else None. Read defensively: any of :data:`STOP_KEYS` at the top or under
    ``run``, a string or a mapping with a ``reason`` / ``limit`` (else the mapping as JSON)."""
    for holder in (summary, summary.get("run") or {}):
        if not isinstance(holder, dict):
            continue
        for key in STOP_KEYS:
            v = holder.get(key)
            if isinstance(v, dict):
                v = v.get("reason") or v.get("limit") or json.dumps(v, sort_keys=True)
            if v:
                return str(v)
    return None


def _in_use(run: Path) -> bool:
    """True when a live process holds the run directory's lock (an eval or train writing to it)."""
    lock = run / LOCK
    if not lock.is_file():
        return False
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock taken by the probe
    return False


def read_records(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of a samples.jsonl (the last copy of a repeated key wins, as the run store
    keeps it) and the line numbers of unreadable lines, which are left out. A cut-off last line
    (a kill mid-append) is dropped without being counted, as the run store drops it."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    by_key: dict[tuple, dict[str, Any]] = {}
    bad: list[int] = []
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        rec = parse_sample_line(raw)
        if rec is None:
            if lineno != len(lines):
                bad.append(lineno)
            continue
        by_key[sample_key(rec)] = rec
    return list(by_key.values()), bad


def load_finished(run: str | os.PathLike) -> FinishedRun:
    """Read ``run`` for export, refusing what is not a finished run (module docstring)."""
    p = Path(run)
    if not (p / CONFIG).is_file():
        raise UserError(f"{p}: not a run directory (no {CONFIG}); export reads what `drmas-bench eval --out DIR` wrote")
    if _in_use(p):
        raise UserError(f"{p}: a drmas-bench process is still writing to this run; export it once it has finished")
    try:
        config = yaml.safe_load((p / CONFIG).read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{p / CONFIG}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(config, dict) or "identity" not in config:
        raise UserError(f"{p / CONFIG}: not a run config (no `identity`)")
    if not (p / SUMMARY).is_file():
        raise UserError(f"{p}: not a finished run (no {SUMMARY}: it was stopped before its summary); re-run the "
                        "same `drmas-bench eval` command to finish it, then export")
    try:
        summary = json.loads((p / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{p / SUMMARY}: unreadable ({e}); re-run the same `drmas-bench eval` command to rewrite it") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("micro"), dict):
        raise UserError(f"{p / SUMMARY}: not a run summary (no `micro` block)")
    if not (p / SAMPLES).is_file():
        raise UserError(f"{p}: no {SAMPLES}: nothing to export")
    records, bad = read_records(p / SAMPLES)
    records = select_records(records, config)
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        logger.warning(f"[export] warning: {p / SAMPLES}: {len(bad)} unreadable line(s) left out (line {shown}); "
                       f"the export records them; {repair_hint(p)}")
    if not records:
        raise UserError(f"{p}: no readable finished sample to export")
    counted = int(summary["micro"].get("samples") or 0)
    if not bad and counted != len(records):
        raise UserError(f"{p}: {SUMMARY} counts {counted} samples but {SAMPLES} holds {len(records)} of the run's "
                        "selection (a later eval was stopped before its summary); re-run the same `drmas-bench eval` "
                        "command to finish it, then export")
    stopped = stop_reason(summary)
    if stopped:
        logger.warning(f"[export] warning: {p} was stopped before its selection was done ({stopped}); the export "
                       "is flagged as partial")
    return FinishedRun(path=p, config=config, summary=summary, records=records, unreadable_lines=bad, stopped=stopped)
