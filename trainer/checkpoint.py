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
driver and every Ray node share, e.g. an NFS mount, or an fsspec URL such as ``s3://bucket/run1``,
handled by :mod:`drmas_bench.checkpoints`: same layout, a ``latest`` text file instead of the
symlink, the marker written after a copy instead of a rename; docs/scaling.md). The functions below
take a root or folder as a ``Path`` (local) or a URL ``str`` and dispatch on it. Worker groups write their
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
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from drmas_bench import checkpoints as store
from drmas_bench.checkpoints import (  # one layout for local and URL roots (the harness's)
    LATEST,
    MARKER,
    STEP_NAME,
    is_url,
)
from drmas_bench.files import inside, safe_name
from drmas_bench.models.adapter_names import ADAPTER_WEIGHTS, BASE_FILE

Location = Path | str  # a local folder, or an fsspec URL (scheme://...)


def step_dir(ckpt_root: Location, step: int) -> Location:
    if is_url(ckpt_root):
        return store.join(ckpt_root, f"step_{step}")
    return Path(ckpt_root) / f"step_{step}"


def latest_pointer(ckpt_root: Location) -> Location:
    """``ROOT/latest``: a symlink in a local root, a text file ``step_K`` under a URL."""
    return store.join(ckpt_root, LATEST) if is_url(ckpt_root) else Path(ckpt_root) / LATEST


def is_complete(path: Location) -> bool:
    if is_url(path):
        return store.is_complete(path)
    return (Path(path) / MARKER).is_file()


def complete_checkpoints(ckpt_root: Location) -> list[tuple[int, Location]]:
    """``(step, folder)`` of every complete checkpoint, oldest first."""
    if is_url(ckpt_root):
        return store.complete_checkpoints(ckpt_root)
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = STEP_NAME.match(p.name)
        if m and p.is_dir() and not p.is_symlink() and is_complete(p):
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_checkpoint(ckpt_root: Location) -> tuple[int, Location] | None:
    """The newest complete checkpoint, or None. The ``latest`` pointer is a convenience for
    humans and ``eval``; resuming trusts only the ``COMPLETE`` markers."""
    found = complete_checkpoints(ckpt_root)
    return found[-1] if found else None


def clean_partial(ckpt_root: Location) -> list[Location]:
    """Remove temporary folders and step folders without a marker; returns what was removed."""
    if is_url(ckpt_root):
        return store.clean_partial(ckpt_root)
    root = Path(ckpt_root)
    removed = []
    if not root.is_dir():
        return removed
    for p in root.iterdir():
        if p.name.startswith(".tmp-") or (STEP_NAME.match(p.name) and p.is_dir() and not is_complete(p)):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def resolve_root(run: Path, ckpt_root: str | os.PathLike | None) -> Location:
    """The checkpoint root: ``ckpt_root`` (a folder: absolute; a relative one is taken from the
    driver's working directory, where the user typed it; an fsspec URL: as given, its filesystem
    checked now, so a missing backend package is a one-line error before training) or ``RUN/ckpt``."""
    if ckpt_root is None or str(ckpt_root) == "":
        return Path(run) / "ckpt"
    text = os.fspath(ckpt_root)
    if is_url(text):
        store.filesystem(text)
        return text.rstrip("/")
    return Path(text).expanduser().absolute()


def clear(ckpt_root: Location) -> None:
    """``--fresh`` for a named root: remove the checkpoints (``step_K``, ``latest``, temp folders),
    nothing else that may live there."""
    if is_url(ckpt_root):
        return store.clear(ckpt_root)
    root = Path(ckpt_root)
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(".tmp-") or p.name == LATEST or STEP_NAME.match(p.name):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def group_files_present(folder: Location, name: str) -> bool:
    """Worker group ``name``'s part of checkpoint ``folder``: its model folder (config.json and a
    safetensors file; a LoRA group: base.json and its adapters' safetensors) and its optimiser state
    (for a URL: as fsspec lists them)."""
    if is_url(folder):
        return store.group_files_present(folder, name)

    model = Path(folder) / "models" / name
    full = (model / "config.json").is_file() and any(model.glob("*.safetensors"))
    lora = (model / BASE_FILE).is_file() and any(model.glob(f"*/{ADAPTER_WEIGHTS}"))
    return (full or lora) and (Path(folder) / "optim" / f"{name}.pt").is_file()


def missing_groups(folder: Location, names: Any) -> list[str]:
    """The worker groups whose files are not (yet) in ``folder`` as this process sees it."""
    return [n for n in names if not group_files_present(folder, n)]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def member(folder: Location, *parts: str) -> Location:
    """``folder/parts...`` resolved, refused (UserError) if a part is not a safe name or the path
    leaves ``folder``: worker-group names become ``models/<wg>`` and ``optim/<wg>.pt``."""

    for p in parts:
        safe_name(p.removesuffix(".pt"), "checkpoint entry")
    if is_url(folder):  # safe names cannot leave the folder
        return store.join(folder, *parts)
    return inside(folder, Path(folder).joinpath(*parts))


def begin(ckpt_root: Location, step: int) -> Location:
    """A fresh temporary folder to write checkpoint ``step`` into."""
    if is_url(ckpt_root):
        return store.begin(ckpt_root, step)
    root = Path(ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-step_{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "models").mkdir(parents=True)
    (tmp / "optim").mkdir()
    return tmp


def write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def driver_files(tmp: Location) -> Iterator[Path]:
    """The local folder the driver writes its files of checkpoint ``tmp`` into: ``tmp`` itself, or
    for a URL a local staging folder whose files are uploaded into ``tmp`` at the end."""
    if not is_url(tmp):
        yield Path(tmp)
        return
    with tempfile.TemporaryDirectory(prefix="drmas-ckpt-") as d:
        yield Path(d)
        for f in sorted(Path(d).iterdir()):
            store.upload(f, store.join(tmp, f.name))


def commit(tmp: Location, ckpt_root: Location, step: int) -> Location:
    """Mark ``tmp`` complete, rename it to ``step_K`` and point ``latest`` at it (in that order).
    A URL root: checkpoints.commit (move, then marker, then the ``latest`` file)."""
    if is_url(ckpt_root):
        return store.commit(tmp, ckpt_root, step)
    root = Path(ckpt_root)
    with open(tmp / MARKER, "w") as f:
        f.write(f"step {step}\n")
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    final = step_dir(root, step)
    if final.exists():  # a checkpoint of the same step from an earlier (killed) attempt
        trash = root / f".tmp-trash-{final.name}-{os.getpid()}"
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp, final)
    _fsync_dir(root)
    link_tmp = root / f".tmp-latest-{os.getpid()}"
    if link_tmp.is_symlink() or link_tmp.exists():
        link_tmp.unlink()
    os.symlink(final.name, link_tmp)
    os.replace(link_tmp, root / LATEST)
    _fsync_dir(root)
    return final


def prune(ckpt_root: Location, keep_last: int, keep: tuple[int, ...] = (0,)) -> list[Location]:
    """Delete all but the newest ``keep_last`` complete checkpoints (never those in ``keep``)."""
    if is_url(ckpt_root):
        return store.prune(ckpt_root, keep_last, keep)
    if keep_last <= 0:
        return []
    found = [(s, p) for s, p in complete_checkpoints(ckpt_root) if s not in keep]
    old = found[:-keep_last]
    for _, p in old:
        shutil.rmtree(p, ignore_errors=True)
    return [p for _, p in old]


def save_rng(path: Path) -> None:
    torch.save({"torch": torch.get_rng_state()}, path)


def load_rng(path: Path) -> None:
    state = torch.load(path, weights_only=True)
    torch.set_rng_state(state["torch"])


def read_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / "trainer_state.json").read_text())
