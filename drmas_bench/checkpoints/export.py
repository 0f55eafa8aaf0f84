"""``drmas-bench models export CKPT --out DIR``: a checkpoint's agents as plain folders for the Hub
or other tools.

``CKPT`` is a reference-trainer checkpoint (``ROOT`` or ``ROOT/global_step_N``, merged first:
``checkpoints.verl``) or one of this project's (``ROOT/step_K``, ``ROOT/latest``, or such a URL). ``DIR``
gets::

    DIR/team.yaml          the workflow, each worker group's folder, each agent's group
    DIR/models/<wg>/       a Hugging Face folder (config, tokenizer, safetensors weights), or a LoRA
                           adapter folder (peft's format)
    DIR/models/<wg>.base/  a reference LoRA group's merged base; its adapter names this folder
                           by absolute path (a Hub upload names its base instead)

Optimiser and RNG state are left out. ``DIR`` is written as a temp folder beside it and renamed,
and an existing non-empty ``DIR`` is refused, so nothing is overwritten or half written.
``drmas-bench eval --model DIR`` evaluates the export as it evaluates the checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import yaml

from drmas_bench.checkpoints.adapter_names import ADAPTER_CONFIG
from drmas_bench.checkpoints.copies import local_copy, refuse_incomplete
from drmas_bench.checkpoints.verl import Roster, is_reference_checkpoint, team_folder
from drmas_bench.types import UserError
from drmas_bench.yamlfile import read_yaml


def export(ckpt: str, out: str | os.PathLike, roster: Roster, log: Callable[[str], None] = lambda s: None) -> Path:
    """Write checkpoint ``ckpt``'s team to ``out`` (module docstring); returns ``out``. ``roster``:
    the suites' reference agent ids, to read a reference checkpoint (``needs.reference_roster()``)."""

    dest = Path(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserError(f"--out {dest}: exists and is not empty; choose a new folder")
    src, _ = local_copy(ckpt)
    src_path = Path(src)
    if not src_path.is_dir():
        raise UserError(f"{ckpt}: not a checkpoint folder")
    if is_reference_checkpoint(src_path):
        src_path, _ = team_folder(src_path, roster)
    elif src_path.name == "latest" and src_path.is_symlink():
        src_path = src_path.resolve()
    refuse_incomplete(src_path)
    if not (src_path / "team.yaml").is_file():
        raise UserError(f"{ckpt}: neither a reference checkpoint (actor/<wg>/ shards) nor a trained team "
                        f"(team.yaml with models/)")
    doc = read_yaml(src_path / "team.yaml", "team file")
    groups = doc.get("worker_groups") if isinstance(doc, dict) else None
    if not isinstance(groups, dict) or not groups:
        raise UserError(f"{src_path / 'team.yaml'}: no worker_groups")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "models").mkdir(parents=True)
        for name, g in groups.items():
            model = g["model"] if isinstance(g, dict) else g
            folder = (src_path / model).resolve()
            inside = src_path.resolve() in folder.parents
            if not inside or not folder.is_dir():
                continue  # a model outside the checkpoint (an alias, a hub id): the team file names it as it is
            rel = folder.relative_to(src_path.resolve())
            log(f"[export] {name}: {rel}")
            shutil.copytree(folder, tmp / rel, symlinks=False)
            base = folder.parent / f"{folder.name}.base"
            if base.is_dir() and (folder / ADAPTER_CONFIG).is_file():
                shutil.copytree(base, tmp / rel.parent / base.name, symlinks=False)
                cfg = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
                cfg["base_model_name_or_path"] = str((dest / rel.parent / base.name).resolve())
                (tmp / rel / ADAPTER_CONFIG).write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        (tmp / "team.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        if dest.exists():
            dest.rmdir()  # empty (checked above)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
