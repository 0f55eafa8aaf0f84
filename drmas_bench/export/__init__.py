"""A finished run directory exported to the formats other tools read (`drmas-bench export`).

``FORMATS`` is the registry: a format's name -> its writer (``module:function``, imported when used,
so the CLI's parser stays light), its default output path inside the run directory and what it writes. Each writer writes into a scratch path beside the output, which is
moved into place only once complete, so a failed export leaves nothing half-written and an existing
output is replaced only with ``force``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas_bench.export.source import load_finished
from drmas_bench.registry import Registry, resolve
from drmas_bench.types import UserError


@dataclass(frozen=True)
class Format:
    write: str  # "module:function" taking (FinishedRun, output path) -> the files written
    default_out: str  # relative to the run directory
    is_dir: bool  # the output is a folder (else one file)
    what: str
    check: str | None = None  # "module:function" raising a UserError when the format's extra is missing


FORMATS: Registry[Format] = Registry("export format")
FORMATS.register("inspect", Format("drmas_bench.export.inspect_log:write_inspect", "export/inspect.eval", False,
                      "an Inspect AI log (.eval): one sample per trajectory, every agent's turns, scores, usage",
                      "drmas_bench.export:require_inspect"))
FORMATS.register("hub", Format("drmas_bench.export.hub:write_hub", "export/hub", True,
                  "a Hugging Face model card (README.md with model-index eval results) + samples.parquet"))


def require_inspect() -> None:
    """A one-line UserError naming the extra when inspect_ai is not installed (asked before the
    writer's module, which imports inspect_ai at its top, is loaded)."""
    try:
        import inspect_ai.log  # noqa: F401
    except ImportError:
        raise UserError("--format inspect needs inspect_ai: pip install 'drmas-bench[inspect]'") from None


def _resolve(ref: str) -> Any:
    return resolve(ref)


def export_run(run_dir: str | os.PathLike, fmt: str, out: str | os.PathLike | None = None,
               force: bool = False) -> list[Path]:
    """Export ``run_dir`` as ``fmt`` to ``out`` (default: the format's path inside the run dir);
    returns the files written. An existing ``out`` is refused unless ``force``."""
    f = FORMATS.get(fmt)
    if f.check:
        _resolve(f.check)()
    dest = Path(out) if out is not None else Path(run_dir) / f.default_out
    if dest.exists() and not force:
        raise UserError(f"{dest} exists; pass --force to replace it or --out to write elsewhere")
    if dest.exists() and f.is_dir != dest.is_dir():
        raise UserError(f"{dest} exists and is a {'file' if dest.is_file() else 'folder'}; "
                        f"--format {fmt} writes a {'folder' if f.is_dir else 'file'}")
    run = load_finished(run_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        tmp = scratch / dest.name
        written = _resolve(f.write)(run, tmp)
        if dest.exists():
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return [dest / p.relative_to(tmp) if p != tmp else dest for p in written]
