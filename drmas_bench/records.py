"""Reading stored trajectory records (the dicts of ``samples.jsonl``): the small accessors that
metrics, compliance and each workflow's effects share. A leaf: it imports no project module."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def as_dict(r: Any) -> dict[str, Any]:
    """A record as a dict: a stored one as it is, a `Trajectory` by its ``to_dict()``."""
    return r if isinstance(r, dict) else r.to_dict()


def record_extra(r: dict[str, Any]) -> dict[str, Any]:
    """A record's ``extra`` mapping ({} when it has none)."""
    return r["extra"] if isinstance(r.get("extra"), dict) else {}


def turn_text(turn: dict[str, Any]) -> str:
    """A recorded turn's response text ("" when it has none)."""
    return str((turn.get("completion") or {}).get("text") or "")


def rate(num: int | float, den: int) -> float | None:
    """``num / den``, None when ``den`` is 0."""
    return num / den if den else None


def mean_or_none(xs: Sequence[float]) -> float | None:
    """The mean of ``xs``, None when there are none."""
    return float(np.mean(xs)) if len(xs) else None
