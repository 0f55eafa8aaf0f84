"""Every run states how reproducible its numbers are: summary.json's ``reproducibility`` block.

Per worker group: its engine, model, dtype, whether the engine is batch-invariant (a request's tokens
and log-probs do not depend on what shares its batch) and why (not), and for a server the
``system_fingerprint`` values its answers carried (read from the records, so a resumed or split run
lists every one). Then the run's seed and its batching settings as each invocation that added samples
ran them (``RUN/batching.jsonl``). ``reproducible`` is True only when every group is batch-invariant:
the same command then gives the same records whatever the batching. A run resumed or split under
batching other than it started with is flagged (``batching_changed``) only where its records could
differ: a group that is not batch-invariant. (A resume at another ``max_batch`` of such a group is
refused already: the option is part of the run's identity.)

What a group says comes from its engine when the pool still holds it (``engine.determinism()``),
else from the engine class and the group's options (``declared_determinism``), known before anything
loads. summary.md states the block in one line (``report.labels.reproducibility_text``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from functools import partial
from pathlib import Path
from typing import Any

from drmas_bench.engines import engine_class, traits
from drmas_bench.engines.base import EngineBase, parse_options
from drmas_bench.records import view

logger = logging.getLogger(__name__)

BATCHING_FILE = "batching.jsonl"  # one line per invocation that ran with samples kept: its batching settings
BATCHING_KEYS = ("max_batch", "concurrency", "workers", "pool", "pool_budget")  # EvalConfig fields (max_batch: per group)


def live_determinism(engine: Any) -> dict[str, Any] | None:
    """A live engine's own ``determinism()`` answer; None when it gives none (a proxy or a Ray actor
    handle that does not forward it)."""
    ask = getattr(engine, "determinism", None)
    if not callable(ask):
        return None
    try:
        got = ask()
    except Exception:  # noqa: BLE001 - a remote handle cannot be asked this way
        return None
    return dict(got) if isinstance(got, dict) and "batch_invariant" in got else None


def group_determinism(kind: str, options: dict[str, Any], live: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a worker group's engine says of its determinism: the live engine's answer ``live`` when
    there is one, else the class's ``declared_determinism`` of ``options`` as they resolve here."""
    if live is not None:
        return dict(live)
    cls: Any = engine_class(kind)
    try:
        full = cls.resolved_options(dataclasses.asdict(parse_options(cls.Options, dict(options), kind=kind)))
    except Exception:  # noqa: BLE001 - options that do not parse here: as written
        full = dict(options)
    # a backend that is not an EngineBase (a protocol-only class) says what the default says
    declared = getattr(cls, "declared_determinism", None) or partial(EngineBase.declared_determinism.__func__, cls)  # type: ignore[attr-defined]
    return dict(declared(full))


class FingerprintTally:
    """The ``system_fingerprint`` values each worker group's calls carried, one record at a time (a
    reader the run's summary feeds)."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = {}

    def add(self, record: Any) -> None:
        for t in view(record).turns:
            fp = t.call.system_fingerprint
            if fp:
                self.seen.setdefault(t.wg or "?", set()).add(fp)

    def result(self) -> dict[str, list[str]]:
        return {wg: sorted(fps) for wg, fps in sorted(self.seen.items())}


def identity_team(team: Any) -> dict[str, Any]:
    """The team as a run's identity records it (``TeamSpec.to_dict``), without the batching options
    (``batching_options``: ``max_batch``) of a worker group whose engine is batch-invariant: they cannot
    change its records, so a resume or a split under other values of them is the same experiment.
    A group that is not batch-invariant keeps them, and a resume under another ``max_batch`` is refused."""
    doc = team.to_dict()
    for wg, g in team.worker_groups.items():
        names = set(getattr(engine_class(g.engine), "batching_options", ()))
        entry = (doc.get("worker_groups") or {}).get(wg)
        opts = entry.get("options") if isinstance(entry, dict) else None
        if not names or not isinstance(entry, dict) or not isinstance(opts, dict) or not names & set(opts):
            continue
        if group_determinism(g.engine, dict(g.options)).get("batch_invariant"):
            kept = {k: v for k, v in opts.items() if k not in names}
            if kept:
                entry["options"] = kept
            else:
                entry.pop("options")
    return doc


def batching_of(cfg: Any, team: Any) -> dict[str, Any]:
    """The batching settings an invocation ran with: ``EvalConfig``'s, and each worker group's
    engine options that decide its batches (``batching_options``: ``max_batch`` of the hf engine)."""
    out = {k: getattr(cfg, k, None) for k in BATCHING_KEYS if k != "max_batch"}
    per_group = {}
    for wg, g in team.worker_groups.items():
        names = getattr(engine_class(g.engine), "batching_options", ())
        got = {k: g.options[k] for k in names if k in g.options}
        if got:
            per_group[wg] = got
    out["max_batch"] = per_group
    return out


def read_batching(run: str | Path) -> list[dict[str, Any]]:
    """RUN/batching.jsonl's settings, oldest first ([] when there is none)."""
    path = Path(run) / BATCHING_FILE
    out: list[dict[str, Any]] = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                got = json.loads(line)
            except ValueError:
                continue
            if isinstance(got, dict):
                out.append(got)
    return out


def note_batching(run: str | Path, now: dict[str, Any], kept: bool) -> list[dict[str, Any]]:
    """Append ``now`` to RUN/batching.jsonl when it differs from the last line (a run with no kept
    sample starts the file afresh) and return every distinct setting the run's samples came from."""
    path = Path(run) / BATCHING_FILE
    history = read_batching(run) if kept else []
    if not history or history[-1] != now:
        history.append(now)
        path.write_text("".join(json.dumps(h, sort_keys=True) + "\n" for h in history), encoding="utf-8")
    return history


def changed_keys(history: list[dict[str, Any]]) -> list[str]:
    """The batching settings that differ between the invocations of ``history``."""
    return [k for k in BATCHING_KEYS if len({json.dumps(h.get(k), sort_keys=True) for h in history}) > 1]


def reproducibility_block(team: Any, seed: Any, live: dict[str, dict[str, Any]] | None,
                          fingerprints: dict[str, list[str]], history: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's ``reproducibility`` (module docstring). ``team``: the run's TeamSpec; ``live``:
    the live engines' ``determinism()`` answers per worker group, where the pool still held one."""
    groups: dict[str, Any] = {}
    for wg, g in team.worker_groups.items():
        det = group_determinism(g.engine, dict(g.options), (live or {}).get(wg))
        entry = {"engine": g.engine, "model": g.model, "dtype": str(det.get("dtype", "unknown")),
                 "batch_invariant": bool(det.get("batch_invariant")), "why": str(det.get("why", ""))}
        if traits(g.engine).remote or "fingerprints" in det:  # a server: what its answers named it
            entry["fingerprints"] = sorted(set(det.get("fingerprints") or []) | set(fingerprints.get(wg) or []))
        groups[wg] = entry
    invariant = all(e["batch_invariant"] for e in groups.values())
    block: dict[str, Any] = {"reproducible": invariant, "seed": seed, "groups": groups,
                             "batching": history[-1] if history else {}}
    moved = changed_keys(history)
    if moved and not invariant:
        block["batching_changed"] = moved
    return block


def warn_changed_batching(history: list[dict[str, Any]], team: Any) -> None:
    """One warning when this invocation's batching differs from the kept samples' and a group is not
    batch-invariant (its new records may differ from what the old settings would have given)."""
    moved = changed_keys(history[-2:]) if len(history) > 1 else []
    if not moved:
        return
    loose = [wg for wg, g in team.worker_groups.items()
             if not group_determinism(g.engine, dict(g.options)).get("batch_invariant")]
    if loose:
        logger.warning(f"[eval] warning: this run's kept samples were made with other batching settings "
                       f"({', '.join(moved)}) and worker group(s) {', '.join(loose)} are not batch-invariant: "
                       f"new samples may differ from what the first settings would give (summary.json "
                       f"reproducibility.batching_changed)")
