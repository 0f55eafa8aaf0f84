"""The model cache's leaf: where models live and the few constants the builders share.

Kept apart from ``registry`` (aliases, resolving) so that the builders (``tiny``, ``smollm2``)
and the checkpoint store can use the cache without importing the registry that imports them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from drmas_bench.files import cache_dir

logger = logging.getLogger(__name__)

MARKER = "drmas_model.json"  # written last into a finished model directory


# Plain ChatML, no default system prompt (the tiny model's template).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


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
