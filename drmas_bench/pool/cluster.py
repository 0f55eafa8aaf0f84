"""Running on a Ray cluster that spans several machines: attaching, shipping the code, naming nodes.

    address = ray_address(cfg.ray_address)                  # the flag, else $RAY_ADDRESS, else None
    init_ray(address, ship_code=None, num_cpus=2)           # attach (code shipped) or start one here
    name = driver_model_name("runs/x/ckpt/step_2/models/a") # driver-relative folders made absolute
    ...                                                     # inside an actor:
    raise on_node(err)                                      # "... (on Ray node 10.0.0.7, id 3f2a9c1e)"

What this module decides (docs/scaling.md):

- **attach**: ``--ray-address ADDR`` (``"auto"``, ``host:port`` or ``ray://host:port``), else the
  ``RAY_ADDRESS`` environment variable; neither: a local Ray is started.
- **shipping** (``ship_code``): the three packages (``drmas_bench``, ``drmas_trainer``,
  ``drmas_retrieval``) are copied, under their import names, into a staging folder and sent with
  the job's ``runtime_env`` as ``py_modules``; every worker imports this checkout's code, whatever
  (if anything) the node has installed. ``None`` (default): on when attaching to an address, off for
  a local Ray we start (same machine, same code). Third-party dependencies (torch, transformers,
  ray itself) are *not* shipped: each node needs them installed, at the same versions.
- **environment**: the variables in ``SHIPPED_ENV`` (cache and data folders, offline switches,
  thread counts) are copied from the driver into the workers' ``env_vars``.
- **models**: names are resolved on the node that loads them (aliases are prepared there, local
  folders must exist there); the driver only makes a folder that exists under its own working
  directory absolute, so that a relative path means the same on every node that shares it.
"""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from drmas_bench.signals import reclaim
from drmas_bench.types import UserError

SHIPPED_ENV = ("DRMAS_CACHE_DIR", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
               "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "DRMAS_DATA_DIR")

# import name -> the package object whose folder is shipped (the trainer and the retrieval
# packages live in folders named trainer/ and retrieval/ in a checkout: shipped under their import names)
PACKAGES = ("drmas_bench", "drmas_trainer", "drmas_retrieval")


def import_ray() -> Any:
    """``ray``, or a UserError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise UserError("Ray is not installed (the Ray pool and trainer need it): pip install drmas-bench[ray]") from None
    return ray


def ray_address(flag: str | None = None) -> str | None:
    """The cluster to attach to: ``flag`` (``--ray-address``), else ``$RAY_ADDRESS``, else None
    (start a local Ray). An empty string counts as not set."""
    return flag or os.environ.get("RAY_ADDRESS") or None


def package_dirs() -> dict[str, Path]:
    """Import name -> the folder this process imports it from (only the packages that import)."""

    out = {}
    for name in PACKAGES:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # drmas_retrieval / drmas_trainer are optional for eval
            continue
        out[name] = Path(mod.__file__).resolve().parent
    return out


def stage_packages(dest: Path | None = None) -> Path:
    """Copy the packages under their import names into ``dest`` (a fresh temp folder by default),
    without caches; returns the folder. Its subfolders are what ``py_modules`` ships."""
    dest = Path(dest or tempfile.mkdtemp(prefix="drmas-ship-"))
    for name, src in package_dirs().items():
        target = dest / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    return dest


def runtime_env(staged: Path | None = None, env_vars: dict[str, str] | None = None) -> dict[str, Any]:
    """The job's ``runtime_env``: the driver's ``SHIPPED_ENV`` variables (plus ``env_vars``) and,
    given a ``staged`` folder (:func:`stage_packages`), its packages as ``py_modules``."""
    env = {k: os.environ[k] for k in SHIPPED_ENV if k in os.environ}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(env_vars or {})
    out: dict[str, Any] = {"env_vars": env}
    if staged is not None:
        out["py_modules"] = [str(Path(staged) / n) for n in sorted(os.listdir(staged))]
    return out


def should_ship(address: str | None, ship_code: bool | None) -> bool:
    """``ship_code`` as asked; ``None``: ship when attaching to an address, not for a local Ray."""
    return bool(address) if ship_code is None else bool(ship_code)


def init_kwargs(address: str | None, staged: Path | None = None, **local: Any) -> dict[str, Any]:
    """Keyword arguments for ``ray.init``: attach to ``address`` (then ``local`` options such as
    ``num_cpus`` are not allowed by Ray and are dropped), or start a local Ray with ``local``;
    ``staged``: the packages to ship (:func:`stage_packages`). A local Ray is asked for with
    ``address="local"``: without an address, ``ray.init`` attaches to the latest cluster that
    ``ray start`` left on this machine (/tmp/ray/ray_current_cluster) and then refuses ``num_cpus``."""
    kw: dict[str, Any] = {"runtime_env": runtime_env(staged), "log_to_driver": True}
    if address:
        kw["address"] = address
    else:
        kw["address"] = "local"
        kw["include_dashboard"] = False
        kw.update({k: v for k, v in local.items() if v is not None})
    return kw


def check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """For a ``HOST:PORT`` address: a one-line UserError when nothing accepts a TCP connection
    there within ``timeout_s`` (``ray.init`` would otherwise retry for minutes). ``auto`` and
    ``ray://`` addresses are left to Ray."""

    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise UserError(f"cannot reach the Ray cluster at {address} ({e.strerror or type(e).__name__}); "
                        f"is `ray start --head` running there, and is the port open?") from None


def init_ray(address: str | None, ship_code: bool | None = None, **local: Any) -> bool:
    """Start or attach Ray unless it is up; True when this call did (the caller shuts it down).
    The staged packages are uploaded by ``ray.init`` and removed here afterwards. A cluster that
    cannot be reached is a one-line error naming the address."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address:
        check_reachable(address)
    staged = stage_packages() if should_ship(address, ship_code) else None
    try:
        ray.init(**init_kwargs(address, staged, **local))
    except ConnectionError as e:
        raise UserError(f"cannot attach to the Ray cluster at {address!r}: {' '.join(str(e).split())[:200]}; "
                        f"is `ray start --head` running there?") from None
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)

    reclaim()  # ray.init made SIGTERM sys.exit(15): stop like Ctrl-C instead (finished work flushed)
    return True


def node_label() -> str:
    """This process's Ray node: ``IP, id <first 8 hex digits>`` (``this machine`` outside Ray)."""
    try:
        ray = import_ray()
        if not ray.is_initialized():
            return "this machine"
        ctx = ray.get_runtime_context()
        return f"{ray.util.get_node_ip_address()}, id {ctx.get_node_id()[:8]}"
    except Exception:  # pragma: no cover - never hide the real error behind this one
        return "unknown node"


def on_node(err: UserError) -> UserError:
    """``err`` with the node it happened on: a model folder or alias missing *there*."""
    msg = str(err.args[0]) if err.args else type(err).__name__
    return UserError(f"{msg} (on Ray node {node_label()}: models are resolved on the node that loads them; "
                     f"prepare aliases / copy folders there or put them on shared storage)")


def driver_model_name(name: str) -> str:
    """What the driver sends to an actor for model ``name``: a folder that exists relative to the
    driver's working directory becomes absolute (a relative path would otherwise resolve against
    each actor's own working directory); aliases, hub ids and absolute paths travel as written and
    are resolved on the node that loads them."""
    p = Path(os.fspath(name)).expanduser()
    if not p.is_absolute() and p.is_dir():
        return str(p.resolve())
    return os.fspath(name)
