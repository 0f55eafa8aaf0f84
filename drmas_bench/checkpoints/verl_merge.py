"""One worker group of a reference (verl FSDP) checkpoint merged into a Hugging Face folder.

The reference trainer saves each worker group as ``actor/<wg>/model_world_size_W_rank_R.pt``: one
``torch.save`` pickle per rank holding that rank's state dict, whose values are DTensor shards
(FSDP2 ``fully_shard``, or FSDP1's sharded state dict over a device mesh) with ``Shard``/``Replicate``
placements over an ``(fsdp)`` or ``(ddp, fsdp)`` mesh, or plain tensors. Beside them: the model's
config and tokenizer, either in the folder itself or in ``huggingface/``.

:func:`merge_group` turns that into ``model.safetensors`` plus the config and tokenizer files:

- the shards are read with ``torch.load(weights_only=True, mmap=True)`` under an allowlist of
  exactly the DTensor, placement and device-mesh classes such a pickle names
  (:func:`allowed_classes`); any other class is refused in one line naming it and the file, so
  nothing from the folder is run;
- each full tensor is assembled from its shards in mesh order (``Replicate`` dims read from the
  first replica, ``Shard(d)`` dims concatenated along ``d``, nested in mesh-dimension order) and
  checked against the DTensor's global shape; plain tensors of more than one rank are joined along
  dim 0, as the reference's own merger does; dtype and bytes are kept exactly;
- the safetensors file is written one tensor at a time (header first, from the global shapes), so
  memory holds one tensor's shards and its merged copy, never the whole model twice.

A missing rank, shards of mixed world sizes, a placement other than ``Shard``/``Replicate``, no
config, and a truncated or damaged shard are one-line :class:`UserError`\\ s. Writing goes to the
folder the caller gives (a temp folder it renames into place: ``checkpoints.verl``).
"""

from __future__ import annotations

import importlib
import json
import logging
import pickle
import re
import shutil
import struct
from pathlib import Path
from typing import Any, Callable

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

from drmas_bench.types import UserError

SHARD = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
HF_SUBDIR = "huggingface"
WEIGHTS = "model.safetensors"
# files of a config/tokenizer folder that are not weights (everything else there is left behind)
_WEIGHT_SUFFIXES = (".pt", ".safetensors", ".bin", ".pth", ".ckpt", ".pkl")
_RUNTIME_FILES = ("fsdp_config.json",)  # newer verl: the FSDP version and world size of the save


def allowed_classes() -> list[type]:
    """The classes a verl model shard may name beyond torch's own tensor types: DTensor, its spec,
    the placements and the device mesh (with the helper classes this torch pickles a mesh with)."""


    out: list[type] = [DTensor, DTensorSpec, TensorMeta, DeviceMesh, Shard, Replicate, Partial]
    # placements and mesh helpers that exist in some torch versions only
    for mod, name in (("torch.distributed.tensor.placement_types", "_StridedShard"),
                      ("torch.distributed.tensor._dtensor_spec", "ShardOrderEntry"),
                      ("torch.distributed._mesh_layout", "_MeshLayout"),
                      ("torch.distributed._mesh_layout", "_FlatLayout")):
        try:
            out.append(getattr(importlib.import_module(mod), name))
        except (ImportError, AttributeError):
            pass
    return out


def shard_files(folder: Path) -> list[Path]:
    """The model shards of a worker-group folder, by rank; refuses no shards, mixed world sizes
    and missing ranks (one line each)."""
    by_ws: dict[int, dict[int, Path]] = {}
    for f in folder.iterdir():
        m = SHARD.match(f.name)
        if m and f.is_file():
            by_ws.setdefault(int(m.group(1)), {})[int(m.group(2))] = f
    if not by_ws:
        raise UserError(f"{folder}: no model shards (model_world_size_W_rank_R.pt)")
    if len(by_ws) > 1:
        raise UserError(f"{folder}: model shards of mixed world sizes ({', '.join(map(str, sorted(by_ws)))}); "
                        f"keep the shards of one save only")
    ws, ranks = next(iter(by_ws.items()))
    missing = sorted(set(range(ws)) - set(ranks))
    if missing:
        raise UserError(f"{folder}: world size {ws} but the shard of rank {', '.join(map(str, missing))} is missing")
    extra = sorted(r for r in ranks if r >= ws)
    if extra:
        raise UserError(f"{folder}: shard of rank {extra[0]} in a world of size {ws}")
    return [ranks[r] for r in range(ws)]


def load_shard(path: Path) -> dict[str, Any]:
    """One rank's state dict, read as data (module docstring); every failure is one line."""


    # torch warns that a mesh unpickled without process groups cannot be used by torch.compile:
    # true and harmless here (the mesh is only read), so that logger is quiet while a shard loads
    mesh_log = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)
    try:
        with torch.serialization.safe_globals(allowed_classes()):
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        m = re.search(r"GLOBAL ([\w.]+) ", str(e)) or re.search(r"global:? ([\w.]+)", str(e))
        what = f"the class {m.group(1)}" if m else "an object"
        raise UserError(f"{path}: refused: the shard names {what}, not a tensor, DTensor, placement or device-mesh "
                        f"class (nothing from it was run)") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: truncated or damaged shard ({first})") from None
    finally:
        mesh_log.setLevel(level)
    if not isinstance(sd, dict) or not all(isinstance(k, str) for k in sd):
        raise UserError(f"{path}: not a state dict (a mapping of names to tensors)")
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise UserError(f"{path}: {k}: a {type(v).__name__}, not a tensor")
    return sd


def _is_dtensor(v: Any) -> bool:
    return isinstance(v, DTensor)


def _layout(key: str, pieces: list, files: list[Path]) -> tuple[Any, list, list[int], Any]:
    """(placements, mesh of ranks as nested lists, global shape, dtype) of one key's shards, checked."""
    first = pieces[0]
    if not _is_dtensor(first):
        if any(_is_dtensor(p) for p in pieces):
            raise UserError(f"{files[0].parent}: {key}: a DTensor on some ranks and a plain tensor on others")
        if len(pieces) > 1 and first.dim() == 0:
            raise UserError(f"{files[0]}: {key}: a plain 0-d tensor on {len(pieces)} ranks cannot be merged")
        if any(p.dtype != first.dtype or p.shape[1:] != first.shape[1:] for p in pieces):
            raise UserError(f"{files[0].parent}: {key}: plain shards of different dtypes or trailing shapes")
        shape = list(first.shape)
        if shape:
            shape[0] = sum(int(p.shape[0]) for p in pieces)
        return None, [], shape, first.dtype
    placements = tuple(first.placements)
    mesh = first.device_mesh.mesh.tolist()
    for p in placements:
        if type(p) not in (Shard, Replicate):  # _StridedShard (FSDP + TP), Partial: not a plain split
            raise UserError(f"{files[0]}: {key}: placement {p} cannot be merged (only Shard and Replicate)")
    for f, p in zip(files, pieces):
        if not _is_dtensor(p) or tuple(p.placements) != placements or p.device_mesh.mesh.tolist() != mesh \
                or p.shape != first.shape or p.dtype != first.dtype:
            raise UserError(f"{f}: {key}: its placements, mesh, shape or dtype differ from rank 0's")
    flat = sorted(_flatten(mesh))
    if flat != list(range(len(files))):
        raise UserError(f"{files[0]}: {key}: the device mesh holds ranks {flat}, the folder {len(files)} shards")
    return placements, mesh, list(first.shape), first.dtype


def _flatten(x) -> list[int]:
    return [int(x)] if not isinstance(x, list) else [r for y in x for r in _flatten(y)]


def _assemble(mesh, placements, locals_by_rank: list, depth: int = 0):
    """The full tensor from the mesh (nested lists of ranks) and the placements, one mesh dim per level."""
    if not isinstance(mesh, list):
        return locals_by_rank[int(mesh)]
    p = placements[depth]
    if isinstance(p, Replicate):
        return _assemble(mesh[0], placements, locals_by_rank, depth + 1)
    return torch.cat([_assemble(m, placements, locals_by_rank, depth + 1) for m in mesh], dim=p.dim)


def merged_tensor(key: str, pieces: list, files: list[Path], layout=None):
    """One key's full tensor from its per-rank pieces (module docstring), shape and dtype checked."""
    placements, mesh, shape, dtype = layout or _layout(key, pieces, files)
    if placements is None:
        full = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)
    else:
        full = _assemble(mesh, placements, [p._local_tensor for p in pieces])
    if list(full.shape) != shape or full.dtype != dtype:
        raise UserError(f"{files[0].parent}: {key}: the shards assemble to {list(full.shape)} {full.dtype}, "
                        f"not the recorded {shape} {dtype} (a placement the merger cannot read)")
    return full.contiguous()


def _st_dtype(dtype) -> str:
    names = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
             torch.bool: "BOOL"}
    for attr, name in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
        if hasattr(torch, attr):
            names[getattr(torch, attr)] = name
    if dtype not in names:
        raise UserError(f"tensor dtype {dtype} has no safetensors name")
    return names[dtype]


def config_source(folder: Path) -> Path:
    """Where the group's config and tokenizer are: ``huggingface/`` (newer verl) or the folder itself."""
    for d in (folder / HF_SUBDIR, folder):
        if (d / "config.json").is_file():
            return d
    raise UserError(f"{folder}: no {HF_SUBDIR}/config.json (nor config.json beside the shards): the model's config "
                    f"and tokenizer are needed to use the weights")


def copy_config(src: Path, dest: Path) -> list[str]:
    """Copy the config, generation config and tokenizer files (plain files, no weights, no links)."""
    copied = []
    for f in sorted(src.iterdir()):
        if f.is_symlink() or not f.is_file() or f.name.endswith(_WEIGHT_SUFFIXES) or SHARD.match(f.name):
            continue
        if f.name.startswith(("optim_world_size_", "extra_state_world_size_")) or f.name.endswith(".index.json") \
                or f.name in _RUNTIME_FILES:
            continue
        shutil.copyfile(f, dest / f.name)
        copied.append(f.name)
    return copied


def merge_group(folder: Path, dest: Path, rename: Callable[[str], str | None] | None = None,
                progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Merge worker-group folder ``folder`` into ``dest`` (created): ``model.safetensors`` plus the
    config and tokenizer. ``rename(key)`` maps a shard key to the saved name (None: leave it out);
    ``progress(done, total)`` is called after each tensor. Returns ``{"world_size", "tensors", "bytes"}``."""
    files = shard_files(folder)
    src = config_source(folder)
    shards = [load_shard(f) for f in files]
    keys = list(shards[0])
    for f, sd in zip(files[1:], shards[1:]):
        if set(sd) != set(keys):
            diff = sorted(set(keys) ^ set(sd))
            raise UserError(f"{f}: its tensors differ from rank 0's (e.g. {diff[0]})")
    names = {k: (rename(k) if rename else k) for k in keys}
    kept = sorted((names[k], k) for k in keys if names[k] is not None)
    if len({n for n, _ in kept}) != len(kept):
        raise UserError(f"{folder}: two tensors map to one name")
    layouts = {k: _layout(k, [sd[k] for sd in shards], files) for _, k in kept}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, k in kept:
        _, _, shape, dtype = layouts[k]
        n = torch.empty((), dtype=dtype).element_size()
        for s in shape:
            n *= s
        header[name] = {"dtype": _st_dtype(dtype), "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / WEIGHTS, "wb") as out:
        out.write(struct.pack("<Q", len(blob)))
        out.write(blob)
        for i, (name, k) in enumerate(kept):
            full = merged_tensor(k, [sd[k] for sd in shards], files, layouts[k])
            data = full.reshape(-1).view(torch.uint8).numpy()
            if data.nbytes != header[name]["data_offsets"][1] - header[name]["data_offsets"][0]:
                raise UserError(f"{folder}: {k}: merged size differs from its header")
            out.write(memoryview(data))
            del full, data
            for sd in shards:  # drop this key's shards (their mapped pages) before the next
                sd.pop(k, None)
            if progress:
                progress(i + 1, len(kept))
    copy_config(src, dest)
    return {"world_size": len(files), "tensors": len(kept), "bytes": offset}
