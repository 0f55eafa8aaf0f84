"""Checkpoints: ``RUN/ckpt/step_K/``, written atomically, with a ``latest`` pointer updated last.

    RUN/ckpt/step_K/
        team.yaml              agent -> worker group -> model folder, workflow, sampling, and for the
                               paper's workflows the prompts, protocol options and retriever record
                               (the format drmas_bench.agents.team.team_from_dict reads): `drmas-bench
                               eval --model RUN/ckpt/step_K` rebuilds the trained team and its protocol
        models/<wg>/           one Hugging Face folder per worker group (safetensors, config, tokenizer)
        optim/<wg>.pt          optimiser state (torch.save of tensors and numbers; loaded with
                               weights_only=True)
        trainer_state.json     step, data cursor, Python RNG state, counters, config fingerprint
        rng.pt                 torch RNG state (a uint8 tensor; weights_only=True)
        COMPLETE               written last: a folder without it is never used
    RUN/ckpt/latest -> step_K  relative symlink, replaced atomically after step_K is complete

The checkpoint root is ``RUN/ckpt`` unless the config names another (``ckpt_root``: a folder the
driver and every Ray node share, e.g. an NFS mount, or an fsspec URL such as ``s3://bucket/run1``:
same layout, a ``latest`` text file instead of the symlink, the marker written after a copy instead
of a rename; docs/scaling.md). The layout has one home, :mod:`drmas_bench.checkpoints.layout` (eval reads
it too): its functions take a root or folder as a ``Path`` (local) or a URL ``str`` and go through
fsspec for both (its local filesystem for a folder); they are imported here for the trainer's
modules. This module adds what only the trainer writes: the root's resolution, the driver's files
and the RNG state. Worker groups write their
``models/<wg>`` and ``optim/<wg>.pt`` there from their own nodes; before the marker is written the
driver checks every group's files are present *as the driver sees them* (:func:`missing_groups`),
so a checkpoint written to a node-local disk is never marked complete.

Writing: everything goes into ``ckpt/.tmp-step_K-<pid>/``, the marker is written and fsynced last,
the folder is renamed to ``step_K`` (one ``rename``), then ``latest`` is re-pointed (a new symlink
renamed over the old one). A kill at any moment leaves either the previous checkpoint or the new
one; leftovers (``.tmp-*`` folders, or a ``step_K`` without ``COMPLETE`` from a foreign copy) are
ignored by :func:`latest_checkpoint` and removed by :func:`clean_partial`.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from drmas_bench.checkpoints.layout import (  # noqa: F401  (the layout's one home; the trainer's modules import it from here)
    BEST,
    LATEST,
    MARKER,
    STEP_NAME,
    Location,
    begin,
    child,
    clean_partial,
    clear,
    commit,
    complete_checkpoints,
    fetch,
    filesystem,
    group_files_present,
    is_complete,
    is_url,
    latest_checkpoint,
    latest_pointer,
    missing_groups,
    point,
    prune,
    step_dir,
    upload,
)
from drmas_bench.files import inside, safe_name


def resolve_root(run: Path, ckpt_root: str | os.PathLike | None) -> Location:
    """The checkpoint root: ``ckpt_root`` (a folder: absolute; a relative one is taken from the
    driver's working directory, where the user typed it; an fsspec URL: as given, its filesystem
    checked now, so a missing backend package is a one-line error before training) or ``RUN/ckpt``."""
    if ckpt_root is None or str(ckpt_root) == "":
        return Path(run) / "ckpt"
    text = os.fspath(ckpt_root)
    if is_url(text):
        filesystem(text)
        return text.rstrip("/")
    return Path(text).expanduser().absolute()


def member(folder: Location, *parts: str) -> Location:
    """``folder/parts...``, refused (UserError) if a part is not a safe name or the path leaves a
    local ``folder``: worker-group names become ``models/<wg>`` and ``optim/<wg>.pt``."""

    for p in parts:
        safe_name(p.removesuffix(".pt"), "checkpoint entry")
    got = child(folder, *parts)
    return got if is_url(got) else inside(folder, got)


def write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def driver_files(tmp: Location) -> Iterator[Path]:
    """The local folder the driver writes its files of checkpoint ``tmp`` into: ``tmp`` itself (each
    file fsynced where it lies), or for a URL a local staging folder uploaded into ``tmp`` at the end."""
    if not is_url(tmp):
        yield Path(tmp)
        return
    with tempfile.TemporaryDirectory(prefix="drmas-ckpt-") as d:
        yield Path(d)
        for f in sorted(Path(d).iterdir()):
            upload(f, child(tmp, f.name))


def save_rng(path: Path) -> None:
    torch.save({"torch": torch.get_rng_state()}, path)


def load_rng(path: Path) -> None:
    state = torch.load(path, weights_only=True)
    torch.set_rng_state(state["torch"])


def read_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / "trainer_state.json").read_text())
