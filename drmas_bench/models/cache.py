"""The model cache's leaf: where models live and the few constants the builders share.

Kept apart from ``registry`` (aliases, resolving) so that the builders (``tiny``, ``smollm2``)
and the checkpoint store can use the cache without importing the registry that imports them.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger("drmas_bench.models")

MARKER = "drmas_model.json"  # written last into a finished model directory


# Plain ChatML, no default system prompt (the tiny model's template).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def cache_dir() -> Path:
    """The user cache: ``$DRMAS_CACHE_DIR``, else ``$XDG_CACHE_HOME/drmas-bench``, else
    ``~/.cache/drmas-bench`` (read at every call, so tests can point it elsewhere)."""
    env = os.environ.get("DRMAS_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "drmas-bench"


def models_dir() -> Path:
    """Where aliases are built: ``<cache_dir>/models``."""
    return cache_dir() / "models"


def read_marker(path: Path) -> dict[str, Any] | None:
    """The marker of a finished model directory, or None when absent or unreadable."""
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def progress(msg: str) -> None:
    """The default ``log`` of the builders: an INFO message (shown unless ``-q``)."""
    logger.info(msg)
