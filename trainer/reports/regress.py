"""Regression check of a training run's metric curves against stored bands.

    failures, lines = check_run("runs/ci-tiny", "trainer/recipes/tiny_bands.json")

A bands file is JSON::

    {"recipe": "tiny",
     "bands": [
       {"name": "final reward", "metric": "critic/score/mean", "stat": "last_k_mean", "k": 5, "min": 0.45},
       {"name": "grad norm",    "metric": "agent/*/actor/grad_norm", "stat": "max", "max": 20},
       {"name": "no NaN",       "metric": ["critic/score/mean", "actor/loss", "agent/*/actor/grad_norm"],
        "stat": "nonfinite", "max": 0},
       {"name": "skipped",      "metric": "actor/skipped_steps", "stat": "sum", "max": 0},
       {"name": "ran",          "metric": "critic/score/mean", "stat": "count", "min": 30}]}

``metric`` is a key of the step records in ``metrics.jsonl`` or a glob (``agent/*/actor/grad_norm``) or a list
of them. A glob band must hold for every key it matches (and fails when it matches nothing).
Statistics over the steps (in order): ``last_k_mean`` / ``first_k_mean`` (k = ``k``, default 5),
``mean``, ``max``, ``min``, ``last``, ``sum``, ``count`` (records carrying the key), ``nonfinite``
(NaN/inf values, summed over every matched key). ``min`` / ``max`` are inclusive bounds; a NaN
statistic fails any bound.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from pathlib import Path
from typing import Any

from drmas_bench.types import UserError

STATS = ("last_k_mean", "first_k_mean", "mean", "max", "min", "last", "sum", "count", "nonfinite")
_BAND_KEYS = {"name", "metric", "stat", "k", "min", "max", "note"}


def load_bands(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read and validate a bands file."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"bands file {p} not found")
    try:
        d = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    bands = d.get("bands") if isinstance(d, dict) else None
    if not isinstance(bands, list) or not bands:
        raise UserError(f"{p}: expected {{\"bands\": [...]}} with at least one band")
    for i, b in enumerate(bands):
        where = f"{p}: band {i + 1}"
        if not isinstance(b, dict):
            raise UserError(f"{where}: expected a mapping")
        bad = sorted(set(b) - _BAND_KEYS)
        if bad:
            raise UserError(f"{where}: unknown key(s) {', '.join(bad)}; allowed: {', '.join(sorted(_BAND_KEYS))}")
        if "metric" not in b or b.get("stat") not in STATS:
            raise UserError(f"{where}: needs `metric` and a `stat` among {', '.join(STATS)}")
        if "min" not in b and "max" not in b:
            raise UserError(f"{where}: needs a `min` or a `max` bound")
    return bands


def _values(records: list[dict[str, Any]], key: str) -> list[float]:
    out = []
    for r in records:
        v = r.get(key)
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)):
            out.append(float(v))
        elif v is None and key in r:
            out.append(float("nan"))
    return out


def _stat(vals: list[float], stat: str, k: int) -> float:
    if stat == "count":
        return float(len(vals))
    if stat == "nonfinite":
        return float(sum(1 for v in vals if not math.isfinite(v)))
    if not vals:
        return float("nan")
    if stat == "last_k_mean":
        tail = vals[-k:]
        return sum(tail) / len(tail)
    if stat == "first_k_mean":
        head = vals[:k]
        return sum(head) / len(head)
    if stat == "mean":
        return sum(vals) / len(vals)
    if stat == "sum":
        return sum(vals)
    if stat == "last":
        return vals[-1]
    if any(math.isnan(v) for v in vals):
        return float("nan")
    return max(vals) if stat == "max" else min(vals)


def _describe(stat: str, k: int) -> str:
    return {"last_k_mean": f"mean of the last {k} steps", "first_k_mean": f"mean of the first {k} steps"}.get(stat, stat)


def check_band(records: list[dict[str, Any]], band: dict[str, Any]) -> list[tuple[bool, str]]:
    """``[(ok, line), ...]``: one entry per matched key (one for ``nonfinite``, summed over keys)."""
    patterns = band["metric"] if isinstance(band["metric"], list) else [band["metric"]]
    stat, k = band["stat"], int(band.get("k", 5))
    name = band.get("name", ",".join(patterns))
    keys: list[str] = []
    for pat in patterns:
        seen = sorted({key for r in records for key in r if fnmatch.fnmatchcase(key, pat)})
        if not seen:
            if stat == "count":
                seen = [pat]
            else:
                return [(False, f"{name}: no metric matches {pat!r}")]
        keys += [s for s in seen if s not in keys]
    groups = [keys] if stat == "nonfinite" else [[key] for key in keys]
    out = []
    for group in groups:
        vals = [v for key in group for v in _values(records, key)]
        value = _stat(vals, stat, k)
        label = ",".join(patterns) if stat == "nonfinite" else group[0]
        problems = []
        if "min" in band and not value >= band["min"]:
            problems.append(f"< min {band['min']}")
        if "max" in band and not value <= band["max"]:
            problems.append(f"> max {band['max']}")
        bounds = " ".join(f"{b} {band[b]}" for b in ("min", "max") if b in band)
        if problems:
            out.append((False, f"{name}: {label} {_describe(stat, k)} = {value:.4g} {' and '.join(problems)}"))
        else:
            out.append((True, f"{name}: {label} {_describe(stat, k)} = {value:.4g} (ok: {bounds})"))
    return out


def check_run(run: str | os.PathLike, bands_path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """Check a run (directory or metrics file) against a bands file.

    Returns:
        ``(failures, lines)``: one-line reasons of the failed bands, and a line per checked band
        (``ok ...`` / ``FAIL ...``).
    """
    from drmas_trainer.runlog import read_metrics

    bands = load_bands(bands_path)
    records = [r for r in read_metrics(run) if "step" in r]
    if not records:
        return [f"{run}: the metrics file has no step records"], []
    failures, lines = [], []
    for band in bands:
        for ok, line in check_band(records, band):
            lines.append(("ok   " if ok else "FAIL ") + line)
            if not ok:
                failures.append(line)
    return failures, lines
