"""Shared fixtures. Benchmark files come from $DRMAS_DATA_DIR or ../shared/data beside the checkout;
tests that need them skip with a reason where neither exists (CI has them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def find_data_dir() -> Path | None:
    env = os.environ.get("DRMAS_DATA_DIR")
    if env and Path(env).is_dir():
        return Path(env)
    sibling = REPO.parent / "shared" / "data"
    return sibling if sibling.is_dir() else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = find_data_dir()
    if d is None:
        pytest.skip("benchmark data not found: set DRMAS_DATA_DIR or place shared/data beside the repo")
    return d


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _cli_logging():
    """Messages reach stderr as under the CLI (INFO, bare text), also for tests that call a command
    function directly; the handler writes to the sys.stderr of the moment, so capsys sees them."""
    from drmas_bench import log

    log.setup()
