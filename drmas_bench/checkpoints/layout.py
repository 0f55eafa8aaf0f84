"""The checkpoint layout that the trainer writes and ``eval`` reads, and checkpoints under URLs.

This lives in the harness (DESIGN: the harness knows nothing of training) because both sides need it:
``drmas_trainer.checkpoint`` writes local roots and calls the URL functions here; ``eval`` reads a checkpoint
folder or URL through :func:`local_copy`, :func:`refuse_incomplete` and :func:`model_on_nodes`. One layout::

    ROOT/step_K/                a checkpoint: team.yaml, trainer_state.json, models/<wg>/,
                                optim/<wg>.pt, rng.pt
    ROOT/step_K/COMPLETE        (:data:`MARKER`) written last: a folder without it is never used
    ROOT/latest                 (:data:`LATEST`) a symlink (local) or a text file ``step_K`` (URL)
    ROOT/best                   (:data:`BEST`) the same, at the best validation's step (val.keep_best)

Checkpoints under an fsspec URL: ``ckpt_root: s3://bucket/run1`` (or ``gs://``, ``file:///shared/ck``,
``memory://ck``, any scheme fsspec knows). The trainer's checkpoint module dispatches here when the
root is a URL; the layout inside the root is the same, only the way a checkpoint becomes complete
differs, since object stores have neither an atomic rename nor symlinks::

    ROOT/.tmp-step_K-<id>/models/<wg>/  each worker group saves into a staging folder on its own
    ROOT/.tmp-step_K-<id>/optim/<wg>.pt node (the system temp dir) and uploads it (upload)
    ROOT/.tmp-step_K-<id>/team.yaml ... the driver checks every group's files through fsspec
                                        (missing_groups), then uploads its own files (team.yaml,
                                        trainer_state.json, rng.pt) from a local staging folder
    ROOT/step_K/                        commit: an old ROOT/step_K of the same step is removed (its
                                        marker first), the temp folder is moved there (a rename on
                                        file://, copy + delete on object stores), and then
    ROOT/step_K/COMPLETE                the marker is written last ("step K" and a random id)
    ROOT/latest                         a small text file holding "step_K", written after the marker

A ``step_K`` without ``COMPLETE`` is never used and is removed by :func:`clean_partial`, as locally;
``latest`` is a convenience for ``eval`` (resuming trusts only the markers).

Reading a checkpoint means downloading it (:func:`fetch`, marker checked before and after, into a
temp folder renamed into place, so only complete downloads are ever used):

- ``--resume``: the driver downloads the checkpoint into ``RUN/.ckpt-cache/step_K`` (in-process
  worker groups load from there); with Ray actors the driver downloads only its own files and each
  actor downloads its group's model and optimiser state on its own node (:func:`node_copy`);
- ``eval --model ROOT/step_K`` (or ``ROOT/latest``): ``plan()`` finds the step without downloading
  (:func:`plan_local_copy`), the run performs it: :func:`cached_checkpoint` downloads into
  ``<drmas cache dir>/checkpoints/<hash of the step's URL>/``, reused while the remote marker (its
  random id) is unchanged; one download at a time (a lock under ``<cache>/locks``), resumed if cut.

Credentials and options come from fsspec's own configuration (environment variables,
``~/.config/fsspec``, the backend's own files: AWS_* for s3fs, ...); nothing here handles keys.
A scheme fsspec does not know, or whose package is not installed (s3 without s3fs), is a one-line
UserError naming the package. Tested with ``file://`` and ``memory://`` only (tests/test_checkpoints_url.py).
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterable

from drmas_bench.checkpoints.adapter_names import ADAPTER_WEIGHTS, BASE_FILE
from drmas_bench.preparation import Bar, human_bytes
from drmas_bench.types import UserError

MARKER = "COMPLETE"
PARTIAL_SOURCE = ".source"  # in a partial download: the remote marker it is a copy of (resumed only while equal)
LATEST = "latest"
BEST = "best"  # ROOT/best: the step of the best validation (the trainer's val.keep_best)
STEP_NAME = re.compile(r"^step_(\d+)$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


Location = Path | str  # a local folder (a Path), or an fsspec URL (scheme://...)


def is_url(x: Any) -> bool:
    """``scheme://...`` (a str); a Path or a plain folder name is not."""
    return isinstance(x, str) and bool(_URL.match(x))


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *parts])


def child(loc: Location, *parts: str) -> Location:
    """``loc/parts...``, of the same kind as ``loc``: a Path under a folder, a URL under a URL."""
    return join(str(loc), *parts) if is_url(loc) else Path(loc).joinpath(*parts)


def filesystem(url: str | os.PathLike, what: str = "ckpt_root") -> tuple[Any, str]:
    """``(fs, path)`` for ``url``, a URL or a local folder (fsspec's local filesystem): every layout
    function below works through it, whatever the root. An unknown scheme or a backend whose package
    is missing is one UserError that names the package to install."""
    url = os.fspath(url)
    try:
        import fsspec
    except ImportError:
        raise UserError(f"{what} {url!r}: URLs need fsspec: pip install fsspec") from None
    from fsspec.registry import known_implementations

    scheme = url.split("://", 1)[0].lower()
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError:
        package = known_implementations.get(scheme, {}).get("class", scheme).split(".")[0]
        raise UserError(f"{what} {url!r}: the {scheme}:// filesystem needs the {package} package "
                        f"(pip install {package}); credentials come from its usual environment/config") from None
    except ValueError as e:
        if "Protocol not known" not in str(e):
            raise UserError(f"{what} {url!r}: {' '.join(str(e).split())}") from None
        raise UserError(f"{what} {url!r}: fsspec knows no {scheme}:// filesystem (e.g. s3://, gs://, file://, "
                        f"memory://), or its package is not installed") from None


def _entries(loc: Location) -> list[tuple[str, bool]]:
    """``(name, is_dir)`` of the entries directly under ``loc`` (none if it does not exist); a
    symbolic link (a local root's ``latest``) is never a folder here."""
    fs, path = filesystem(loc)
    try:
        listing = fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    out = []
    for e in listing:
        name = posixpath.basename(str(e["name"]).rstrip("/"))
        if name and str(e["name"]).rstrip("/") != path.rstrip("/"):
            out.append((name, e.get("type") == "directory" and not e.get("islink")))
    return out


def _rm(loc: Location) -> None:
    """Remove a file, a link (never what it points to) or a folder with its files; nothing if absent."""
    fs, path = filesystem(loc)
    try:
        if getattr(fs, "islink", lambda _: False)(path) or fs.isfile(path):
            fs.rm_file(path)
        elif fs.exists(path):
            fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass


def step_dir(root: Location, step: int) -> Location:
    return child(root, f"step_{step}")


def latest_pointer(root: Location) -> Location:
    """``ROOT/latest``: a symlink in a local root, a text file ``step_K`` under a URL."""
    return child(root, LATEST)


def is_complete(loc: Location) -> bool:
    fs, path = filesystem(loc)
    return fs.isfile(join(path, MARKER))


def complete_checkpoints(root: Location) -> list[tuple[int, Location]]:
    """``(step, folder)`` of every complete checkpoint under ``root``, oldest first."""
    out = []
    for name, is_dir in _entries(root):
        m = STEP_NAME.match(name)
        if m and is_dir and is_complete(child(root, name)):
            out.append((int(m.group(1)), child(root, name)))
    return sorted(out)


def latest_checkpoint(root: Location) -> tuple[int, Location] | None:
    """The newest complete checkpoint, or None. The ``latest`` pointer is a convenience for
    humans and ``eval``; resuming trusts only the ``COMPLETE`` markers."""
    found = complete_checkpoints(root)
    return found[-1] if found else None


def clean_partial(root: Location) -> list[Location]:
    """Remove temp folders and step folders without a marker; returns what was removed."""
    removed = []
    for name, is_dir in _entries(root):
        loc = child(root, name)
        if name.startswith(".tmp-") or (STEP_NAME.match(name) and is_dir and not is_complete(loc)):
            _rm(loc)
            removed.append(loc)
    return removed


def clear(root: Location) -> None:
    """``--fresh`` for a named root: remove ``step_*``, ``latest``, ``best`` and temp entries, nothing else."""
    for name, _ in _entries(root):
        if name.startswith(".tmp-") or name in (LATEST, BEST) or STEP_NAME.match(name):
            _rm(child(root, name))


def group_files_present(folder: Location, name: str) -> bool:
    """Worker group ``name``'s part of checkpoint ``folder`` as this process sees it: its model
    folder (config.json and a safetensors file; a LoRA group: base.json and its adapters'
    safetensors) and its optimiser state ``optim/<name>.pt``."""
    fs, path = filesystem(folder)
    model = join(path, "models", name)
    full = fs.isfile(join(model, "config.json")) and bool(fs.glob(join(model, "*.safetensors")))
    lora = fs.isfile(join(model, BASE_FILE)) and bool(fs.glob(join(model, "*", ADAPTER_WEIGHTS)))
    return (full or lora) and fs.isfile(join(path, "optim", f"{name}.pt"))


def missing_groups(folder: Location, names: Any) -> list[str]:
    """The worker groups whose files are not (yet) in ``folder`` as this process sees it."""
    return [n for n in names if not group_files_present(folder, n)]


def begin(root: Location, step: int) -> Location:
    """A fresh temp folder for checkpoint ``step`` (an id unique across nodes and attempts), with
    its ``models/`` and ``optim/`` folders where the filesystem has folders."""
    fs, path = filesystem(root)
    fs.makedirs(path, exist_ok=True)
    tmp = child(root, f".tmp-step_{step}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    _rm(tmp)
    for sub in ("models", "optim"):
        fs.makedirs(join(filesystem(tmp)[1], sub), exist_ok=True)
    return tmp


def upload(local: str | os.PathLike, url: Location) -> None:
    """Copy a local file, or a folder's files (recursively), to ``url`` (replacing what is there)."""
    fs, path = filesystem(url)
    local = Path(local)
    _rm(url)
    if local.is_file():
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.put_file(str(local), path)
        return
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        dest = join(path, *f.relative_to(local).parts)
        fs.makedirs(posixpath.dirname(dest), exist_ok=True)
        fs.put_file(str(f), dest)


def _remote_files(url: str) -> list[tuple[str, list[str], int | None]]:
    """The files at ``url`` (a file, or a folder's files recursively): (remote path, the parts of
    its name relative to ``url``, its size where the filesystem says)."""
    fs, path = filesystem(url)
    if fs.isfile(path):
        return [(path, [], fs.size(path))]
    found = fs.find(path, detail=True)
    if not found:
        raise UserError(f"{url}: nothing there to download")
    base = path.rstrip("/") + "/"
    out = []
    for f, info in sorted(found.items()):
        rel = str(f)[len(base):] if str(f).startswith(base) else posixpath.basename(str(f))
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):  # an object key may say anything: stay inside dest
            raise UserError(f"{url}: refusing to download {rel!r}: not a plain relative name")
        size = info.get("size") if isinstance(info, dict) else None
        out.append((str(f), parts, int(size) if isinstance(size, int) else None))
    return out


def remote_size(*urls: str) -> int | None:
    """The bytes a download of ``urls`` (files or folders) reads; None when the filesystem cannot tell."""
    try:
        sizes = [size for url in urls for _, _, size in _remote_files(url)]
    except (UserError, OSError):
        return None
    return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)


def download(url: str, dest: Path, resume: bool = False, show_progress: bool = False) -> None:
    """Copy the file or folder (recursively) at ``url`` to ``dest``, each file through ``NAME.part``
    renamed when whole; ``resume``: a file already there with the remote size is kept."""
    fs, _ = filesystem(url)
    files = _remote_files(url)
    total, done = sum(size or 0 for _, _, size in files), 0
    bar = Bar(posixpath.basename(url.rstrip("/")), show_progress, human_bytes)
    for f, parts, size in files:
        target = dest.joinpath(*parts) if parts else dest
        if resume and size is not None and target.is_file() and target.stat().st_size == size:
            done += size
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        try:
            fs.get_file(f, str(part))
        except OSError as e:
            raise UserError(f"{url}: downloading {'/'.join(parts) or posixpath.basename(f)} failed "
                            f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); run again to resume") from None
        os.replace(part, target)
        done += size or 0
        bar(done, total)


def remote_marker(url: str) -> bytes | None:
    fs, path = filesystem(url)
    try:
        return fs.cat_file(join(path, MARKER))
    except FileNotFoundError:
        return None


def _fsync(path: Path) -> None:
    """fsync a local file or folder (a folder: its entries), best effort."""
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


def commit(tmp: Location, root: Location, step: int) -> Location:
    """Make ``tmp`` the complete checkpoint ``ROOT/step_K`` and point ``ROOT/latest`` at it. An old
    ``step_K`` of the same step loses its marker first. A local root: the marker is written (and
    fsynced) inside ``tmp``, which one rename publishes, and ``latest`` is a relative symlink renamed
    over the old one; a URL root (no atomic rename, no symlinks): the folder is moved (a copy and a
    delete on object stores), then the marker is written, then the ``latest`` text file."""
    fs, _ = filesystem(root)
    final = step_dir(root, step)
    local = not is_url(root)
    stamp = f"step {step}\nid {uuid.uuid4().hex}\n".encode()
    if local:
        (Path(tmp) / MARKER).write_bytes(stamp)
        _fsync(Path(tmp) / MARKER)
        _fsync(Path(tmp))
    _rm(child(final, MARKER))  # an earlier attempt of the same step: never complete while it is replaced
    _rm(final)
    fs.mv(filesystem(tmp)[1], filesystem(final)[1], recursive=True)
    if local:
        _fsync(Path(root))
        link = Path(root) / f".tmp-latest-{os.getpid()}"
        _rm(link)
        os.symlink(Path(final).name, link)
        os.replace(link, Path(root) / LATEST)
        _fsync(Path(root))
        return final
    _rm(tmp)  # what a copy + delete left behind, if anything
    fs.pipe_file(filesystem(child(final, MARKER))[1], stamp)
    fs.pipe_file(filesystem(latest_pointer(root))[1], f"step_{step}\n".encode())
    return final


def point(root: Location, name: str, step: int) -> None:
    """Point ``ROOT/<name>`` (``latest``, ``best``) at the complete checkpoint ``step_K``: a relative
    symlink renamed over the old one (local root), a text file ``step_K`` (URL root)."""
    if is_url(root):
        fs, _ = filesystem(root)
        fs.pipe_file(filesystem(child(root, name))[1], f"step_{step}\n".encode())
        return
    link = Path(root) / f".tmp-{name}-{os.getpid()}"
    _rm(link)
    os.symlink(Path(step_dir(root, step)).name, link)
    os.replace(link, Path(root) / name)
    _fsync(Path(root))


def prune(root: Location, keep_last: int, keep: tuple[int, ...] = (0,)) -> list[Location]:
    """Delete all but the newest ``keep_last`` complete checkpoints (never those in ``keep``); each
    loses its marker first."""
    if keep_last <= 0:
        return []
    found = [(s, loc) for s, loc in complete_checkpoints(root) if s not in keep]
    old = found[:-keep_last]
    for _, loc in old:
        _rm(child(loc, MARKER))
        _rm(loc)
    return [loc for _, loc in old]


def resolve_latest(url: str) -> str:
    """``ROOT/latest`` (or ``ROOT/best``) -> ``ROOT/step_K`` (read from that file); other URLs as given."""
    if posixpath.basename(url.rstrip("/")) not in (LATEST, BEST):
        return url.rstrip("/")
    fs, path = filesystem(url, "checkpoint")
    try:
        name = fs.cat_file(path).decode("utf-8", "replace").strip()
    except FileNotFoundError:
        raise UserError(f"{url}: no such file; the root holds no finished checkpoint yet") from None
    if not STEP_NAME.match(name):
        raise UserError(f"{url}: expected a line 'step_K', got {name[:40]!r}")
    return join(posixpath.dirname(url.rstrip("/")), name)


def fetch(ckpt: str, dest: str | os.PathLike, parts: Iterable[str] | None = None, resume: bool = False,
          show_progress: bool = False) -> Path:
    """Download complete checkpoint ``ckpt`` (or only ``parts`` of it, relative names) into ``dest``
    (replaced): into a temp folder beside it, marker checked before and after, then renamed.
    ``resume`` (the caller holds a lock on ``dest``): the temp folder ``.part-<name>`` is kept when cut
    and reused by the next attempt while the remote marker is the same."""
    dest = Path(dest)
    before = remote_marker(ckpt)
    if before is None:
        raise UserError(f"{ckpt}: not a complete checkpoint (no {MARKER} marker)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / (f".part-{dest.name}" if resume else f".tmp-{dest.name}-{os.getpid()}")
    source = tmp / PARTIAL_SOURCE
    if not (resume and source.is_file() and source.read_bytes() == before):
        shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, exist_ok=True)
    source.write_bytes(before)
    try:
        for part in (parts if parts is not None else [""]):
            download(join(ckpt, part) if part else ckpt, tmp / part if part else tmp, resume=resume,
                      show_progress=show_progress)
        if remote_marker(ckpt) != before:
            shutil.rmtree(tmp, ignore_errors=True)  # nothing of it is worth resuming
            raise UserError(f"{ckpt} changed while it was downloaded (pruned or rewritten); try again")
    except BaseException:
        if not resume:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    source.unlink()
    (tmp / MARKER).write_bytes(before)
    if dest.exists():
        shutil.rmtree(dest)
    os.rename(tmp, dest)
    return dest
