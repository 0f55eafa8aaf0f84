"""Checkpoints copied into this machine's cache: what ``eval --model`` of a checkpoint (a folder or an
fsspec URL, ``drmas_bench.checkpoints.layout`` has the layout) reads, and what a Ray actor downloads for its
own worker group. ``plan()`` finds a copy's source and destination without downloading
(:func:`plan_local_copy`, :func:`plan_model_copy`: :class:`drmas_bench.preparation.Step` s); the run
performs them: :func:`cached_checkpoint` downloads into ``<drmas cache dir>/checkpoints/<hash of the
step's URL>/``, reused while the remote marker is unchanged; one download at a time (a lock under
``<cache>/locks``), resumed if cut; :func:`node_copy` is a Ray actor's own part.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from drmas_bench.checkpoints import (
    layout as ck,  # the layout; its transfers called through the module (tests stub them there)
)
from drmas_bench.checkpoints.layout import MARKER, STEP_NAME, fetch, is_url, join, remote_size, resolve_latest
from drmas_bench.files import cache_dir
from drmas_bench.preparation import Step
from drmas_bench.types import UserError
from drmas_retrieval.locks import file_lock


def _cache_key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


# what eval reads of a checkpoint: not optim/ (8 bytes a parameter, four times the bf16 weights) nor rng.pt
EVAL_PARTS = ("team.yaml", "trainer_state.json", "models")
# what the driver of a Ray eval reads: the models are downloaded by the nodes that load them (cached_model)
TEAM_PARTS = ("team.yaml", "trainer_state.json")
_IN_CHECKPOINT = re.compile(r"^(?P<step>.+/step_\d+)/models/[^/]+/?$")


def _model_source(url: str) -> tuple[str, bytes]:
    """(url without its trailing slash, the marker its copy is kept for): inside a checkpoint the
    step's ``COMPLETE`` marker (a step without one is refused), any other folder URL a placeholder."""
    url = url.rstrip("/")
    m = _IN_CHECKPOINT.match(url)
    marker = ck.remote_marker(m.group("step")) if m else b"not in a checkpoint"
    if marker is None:  # only inside a checkpoint (m matched): outside one the marker is a placeholder
        raise UserError(f"{m.group('step') if m else url}: not a complete checkpoint (no {MARKER} marker)")
    return url, marker


def _model_dest(url: str) -> tuple[Path, Path]:
    """(the model folder's copy, its stamp beside it: a model folder holds only the model's files)."""
    dest = cache_dir() / "checkpoints" / "models" / _cache_key(url)
    return dest, dest.with_name(f"{dest.name}.source")


@dataclass(frozen=True)
class ModelCopy(Step):
    """A model folder under a URL copied into the cache (:func:`cached_model`)."""

    action: ClassVar[str] = "fetch model"

    def perform(self, show_progress: bool) -> Path:
        return cached_model(self.source, show_progress=show_progress)


def plan_model_copy(url: str) -> ModelCopy:
    """What :func:`cached_model` would do for ``url``, found without doing it (the step's marker and
    the folder's size are read; nothing is written)."""
    url, marker = _model_source(url)
    dest, stamp = _model_dest(url)
    done = dest.is_dir() and stamp.is_file() and stamp.read_bytes() == marker
    return ModelCopy(url, dest, None if done else remote_size(url), done)


def cached_model(url: str, show_progress: bool = False) -> Path:
    """A model folder given by URL, as a local folder on this node: ``<drmas cache dir>/checkpoints/
    models/<hash of url>``. This is how a Ray actor resolves ``ROOT/step_K/models/<wg>`` when a
    checkpoint URL is evaluated with ``--pool ray`` (each node downloads only the groups it loads).
    Inside a checkpoint the copy is reused while the step's marker is unchanged (a step without one is
    refused); any other folder URL is downloaded once. One download at a time per URL, resumed if cut."""

    url, marker = _model_source(url)
    m = _IN_CHECKPOINT.match(url)
    dest, stamp = _model_dest(url)
    with file_lock(cache_dir() / "locks" / f"model-{dest.name}.lock"):
        if dest.is_dir() and stamp.is_file() and stamp.read_bytes() == marker:
            return dest
        tmp = dest.parent / f".part-{dest.name}"
        tmp_stamp = dest.parent / f".part-{dest.name}.source"
        if not (tmp_stamp.is_file() and tmp_stamp.read_bytes() == marker):
            shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp_stamp.write_bytes(marker)
        ck.download(url, tmp, resume=True, show_progress=show_progress)
        if m and ck.remote_marker(m.group("step")) != marker:
            shutil.rmtree(tmp, ignore_errors=True)
            raise UserError(f"{m.group('step')} changed while it was downloaded (pruned or rewritten); try again")
        stamp.unlink(missing_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp, dest)
        tmp_stamp.unlink()
        stamp.write_bytes(marker)
    return dest


def checkpoint_dest(step_url: str, parts: tuple[str, ...] = EVAL_PARTS) -> Path:
    """Where :func:`cached_checkpoint` keeps its copy of ``step_url`` (``parts`` of it)."""
    return cache_dir() / "checkpoints" / _cache_key(step_url if parts == EVAL_PARTS else f"{step_url} {' '.join(parts)}")


@dataclass(frozen=True)
class CheckpointCopy(Step):
    """A checkpoint under a URL copied into the cache (:func:`cached_checkpoint`)."""

    action: ClassVar[str] = "fetch checkpoint"
    parts: tuple[str, ...] = EVAL_PARTS

    def perform(self, show_progress: bool) -> Path:
        return cached_checkpoint(self.source, self.parts, show_progress=show_progress)


def plan_checkpoint_copy(url: str, parts: tuple[str, ...] = EVAL_PARTS) -> CheckpointCopy:
    """What :func:`cached_checkpoint` would do for ``url`` (``ROOT/latest`` read as the step it
    names), found without doing it: the ``latest`` pointer, the remote marker and the sizes are
    read; nothing is written and no lock is taken."""
    step_url = resolve_latest(url)
    remote = ck.remote_marker(step_url)
    if remote is None:
        raise UserError(f"{step_url}: not a complete checkpoint (no {MARKER} marker)")
    dest = checkpoint_dest(step_url, parts)
    done = (dest / MARKER).is_file() and (dest / MARKER).read_bytes() == remote
    return CheckpointCopy(step_url, dest, None if done else remote_size(*(join(step_url, p) for p in parts)), done, parts)


def cached_checkpoint(url: str, parts: tuple[str, ...] = EVAL_PARTS, show_progress: bool = False) -> Path:
    """A local copy of checkpoint ``url`` (``ROOT/step_K`` or ``ROOT/latest``) for ``eval``:
    ``<drmas cache dir>/checkpoints/<hash of ROOT/step_K>``, downloaded again when the remote marker
    differs from the copy's. Only complete downloads are kept (:func:`fetch`, resumed if cut), and only
    ``parts``: by default what eval reads (:data:`EVAL_PARTS`: the team file, the state and the models;
    no optimiser state); :data:`TEAM_PARTS` for a Ray eval, whose nodes fetch the models themselves."""

    step_url = resolve_latest(url)
    dest = checkpoint_dest(step_url, parts)
    remote = ck.remote_marker(step_url)
    if remote is None:
        raise UserError(f"{step_url}: not a complete checkpoint (no {MARKER} marker)")
    # one download at a time per checkpoint: a second eval of the same URL waits, then finds the copy
    # (without the lock it could replace the folder the first eval is reading)
    with file_lock(cache_dir() / "locks" / f"checkpoint-{dest.name}.lock"):
        if (dest / MARKER).is_file() and (dest / MARKER).read_bytes() == remote:
            return dest
        return fetch(step_url, dest, parts=parts, resume=True, show_progress=show_progress)


def node_copy(url: str, owner: str = "") -> Path:
    """A local copy, on this node, of one part of a checkpoint (a worker group's model folder or
    optimiser file): ``<drmas cache dir>/checkpoints/parts/<hash of url[#owner]>``, downloaded afresh;
    ``owner`` (a sharded group's rank) gives each reader of one node a copy no other replaces."""

    base = cache_dir() / "checkpoints" / "parts" / _cache_key(f"{url}#{owner}" if owner else url)
    dest = base / posixpath.basename(url.rstrip("/"))
    tmp = base.parent / f".tmp-{base.name}-{os.getpid()}"
    with file_lock(cache_dir() / "locks" / f"part-{base.name}.lock"):  # two actors of a node never swap it under each other
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            ck.download(url, tmp / dest.name)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(base, ignore_errors=True)
        os.rename(tmp, base)
    return dest


# ------------------------------------------------------------------------------ what eval reads


def refuse_incomplete(folder: str | os.PathLike) -> None:
    """A trainer checkpoint (``step_K`` holding trainer_state.json) without its ``COMPLETE`` marker is
    a save that did not finish (weights may be missing or half written): refused with one line naming
    the newest complete step beside it. Also checked for a worker group's model inside one
    (``step_K/models/<wg>``)."""
    p = Path(folder)
    for ckpt in (p, p.parent.parent):
        if not (ckpt / "trainer_state.json").is_file() or (ckpt / MARKER).is_file():
            continue
        steps = sorted((int(m.group(1)), d.name) for d in ckpt.parent.iterdir()
                       if (m := STEP_NAME.match(d.name)) and (d / MARKER).is_file())
        hint = f"; the newest complete one beside it is {ckpt.parent / steps[-1][1]}" if steps else ""
        raise UserError(f"{ckpt}: an incomplete checkpoint (no {MARKER} marker: its save did not finish), "
                        f"not evaluated{hint}")


def plan_local_copy(model: str, on_nodes: bool = False) -> tuple[str, str | None, CheckpointCopy | None]:
    """``model`` given as a checkpoint URL (``ROOT/step_K`` or ``ROOT/latest`` under an fsspec
    ckpt_root, e.g. ``s3://bucket/run1/latest``) -> ``(local folder, step URL, the step that fills
    the folder)``, found without downloading (:func:`plan_checkpoint_copy`): the local copy is
    ``<cache dir>/checkpoints/<hash of ROOT/step_K>``, then evaluated as a checkpoint folder (its
    team.yaml is untrusted data). ``on_nodes`` (a Ray eval): the copy holds only the team file and the
    nodes fetch the models (:func:`model_on_nodes`). Anything else: ``(model, None, None)``."""
    if not is_url(model):
        return model, None, None
    step = plan_checkpoint_copy(model, parts=TEAM_PARTS if on_nodes else EVAL_PARTS)
    return str(step.dest), step.source, step


def local_copy(model: str, on_nodes: bool = False, show_progress: bool = False) -> tuple[str, str | None]:
    """:func:`plan_local_copy`'s folder, downloaded now: ``(local folder, step URL)``."""
    folder, step_url, step = plan_local_copy(model, on_nodes)
    if step is not None:
        step.perform(show_progress)
    return folder, step_url


def model_on_nodes(model: str, step_url: str) -> str:
    """A Ray eval of checkpoint ``step_url``: a worker group's model recorded relative to the
    checkpoint (``models/<wg>``) -> its URL (``ROOT/step_K/models/<wg>``), which the actor resolves on
    its own node (models.resolve_model downloads it into that node's cache). A path that would leave
    the checkpoint (``..``, absolute) is returned as it is, and resolves (or fails) locally."""
    parts = Path(model).parts
    if Path(model).is_absolute() or not parts or any(p in ("..", ".") for p in parts):
        return model
    return "/".join([step_url.rstrip("/"), *parts])
