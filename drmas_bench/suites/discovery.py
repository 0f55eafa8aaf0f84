"""Finding the suites: every package in ``drmas_bench/suites/``, every package an installed
distribution declares in the ``drmas_bench.suites`` entry-point group (so ``pip install my-suite``
is all it takes), and every entry of ``$DRMAS_SUITES`` (comma-separated: an importable module name,
or a folder path holding a suite package: one with a ``/``), each with every module of its folder
(name order), so a new workflow or rule is found by its file.

A suite's modules register what they hold when they are imported: its ``Suite`` and benchmarks
(``suites.registry``, ``benchmarks.base``), its workflows (``workflows.base.workflow``), its format rules
(``workflows.rules.format_rule``) and its grading family (``grading.families.register_family``).
The registries call :func:`discover` before they are read, so a suite is found by being there; no
list names it. Once every suite is in, the registries they fill are frozen
(``registry.freeze_suite_registries``). Imports go by name (``importlib``): the registries sit
below the suites.

An outside package declares itself in its ``pyproject.toml``::

    [project.entry-points."drmas_bench.suites"]
    mcq = "my_suite"
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
import traceback
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable

from drmas_bench.registry import Registry, freeze_suite_registries
from drmas_bench.types import UserError

SUITES_ENV = "DRMAS_SUITES"
ENTRY_POINT_GROUP = "drmas_bench.suites"
SUITES_DIR = Path(__file__).parent  # drmas_bench/suites/: each package here is a suite
_found: list[str] = []  # the suite modules imported, in order (filled once per process)
_done: list[bool] = []  # [True] once every suite is imported and its declarations checked

# What is checked once every suite is in, before any command runs: each a function raising a
# one-line UserError that names the suite, the file and the field (``where``); lazy entries, so this
# leaf imports none of the modules that declare them.
CHECKS: Registry[Callable[[], None]] = Registry("declaration check")
CHECKS.register("rule names", "drmas_bench.workflows.base:resolve_rule_names")
CHECKS.register("prompts files", "drmas_bench.workflows.protocol:check_packaged_prompts")


def is_path(entry: str) -> bool:
    """Whether a ``$DRMAS_SUITES`` entry is a folder path (it has a path separator) rather than a module name."""
    return "/" in entry or os.sep in entry


def _entry_point_modules() -> list[str]:
    """The modules the installed distributions declare in the ``drmas_bench.suites`` group."""
    return [ep.value.partition(":")[0].strip() for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)]


def suite_modules() -> list[str]:
    """What :func:`discover` imports: the packages under ``drmas_bench/suites/`` in name order, then
    the entry-point group's modules, then the ``$DRMAS_SUITES`` entries (names or folder paths)."""
    here = [f"drmas_bench.suites.{m.name}" for m in sorted(pkgutil.iter_modules([str(SUITES_DIR)]), key=lambda m: m.name)
            if m.ispkg]
    extra = _entry_point_modules() + [n.strip() for n in os.environ.get(SUITES_ENV, "").split(",") if n.strip()]
    return here + [n for n in dict.fromkeys(extra) if n not in here]


def _import_folder(entry: str) -> str:
    """Import the suite package in folder ``entry`` under its folder's name; returns that name."""
    folder = Path(entry).expanduser().resolve()
    init = folder / "__init__.py"
    if not init.is_file():
        raise UserError(f"{SUITES_ENV}: {entry} is not a suite package (no folder with an __init__.py there)")
    name = folder.name
    if not name.isidentifier():
        raise UserError(f"{SUITES_ENV}: {entry}: the folder's name {name!r} is not a Python module name")
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == init:
            return name
        raise UserError(f"{SUITES_ENV}: {entry}: a module named {name!r} is already imported "
                        f"({getattr(loaded, '__file__', None) or 'built in'}); rename the folder")
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return name


def suite_of(module: str) -> str:
    """The suite (its module's name, as discovered) that module ``module`` belongs to; else ``module``."""
    return next((s for s in _found if module == s or module.startswith(s + ".")), module)


def where(module: str, file: str | os.PathLike | None, line: int | None = None) -> str:
    """How an error names a declaration's place: ``suite S: FILE[:LINE]`` (FILE from the suite's folder)."""
    suite = suite_of(module)
    top = sys.modules.get(suite)
    return _place(suite, Path(getattr(top, "__file__", "") or ".").parent, file, line)


def _place(suite: str, folder: Path | None, file: str | os.PathLike | None, line: int | None) -> str:
    path = str(file or "?")
    if folder is not None:
        try:
            path = Path(path).resolve().relative_to(folder.resolve().parent).as_posix()
        except ValueError:
            pass
    return f"suite {suite}: {path}" + (f":{line}" if line else "")


def _failed(entry: str, folder: Path | None, e: BaseException) -> UserError:
    """The one line of a suite module that failed to import: the suite, the innermost line of its own
    folder the error passed through, and the error (a UserError's own words, else its type and message)."""
    frames = traceback.extract_tb(e.__traceback__)
    if isinstance(e, SyntaxError) and e.filename:
        frames.append(traceback.FrameSummary(e.filename, e.lineno or 0, ""))
    mine = [f for f in frames if folder is not None and Path(f.filename).resolve().is_relative_to(folder)]
    label = Path(entry).name if is_path(entry) else entry
    place = _place(label, folder, mine[-1].filename, mine[-1].lineno) if mine else f"suite {label}"
    what = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
    return UserError(f"{place}: {what}")


def _import_suite(entry: str) -> str:
    """Import one suite (a module name or a folder path) and every module of its folder; returns its
    module name. A suite that cannot be imported (missing, or an error while its modules run, a
    refused declaration among them) is one UserError naming the suite, its file and line."""
    outside = not entry.startswith("drmas_bench.")
    try:
        name = _import_folder(entry) if is_path(entry) else importlib.import_module(entry).__name__
    except ModuleNotFoundError as e:
        if outside and e.name is not None and entry.startswith(e.name):
            raise UserError(f"{SUITES_ENV}: cannot import the suite module {entry!r} ({e})") from None
        raise _failed(entry, _folder_of(entry), e) from e
    except UserError as e:
        if str(e).startswith(SUITES_ENV):
            raise
        raise _failed(entry, _folder_of(entry), e) from e
    except Exception as e:
        raise _failed(entry, _folder_of(entry), e) from e
    module = sys.modules[name]
    folder = Path(module.__file__ or ".").parent.resolve()
    for sub in sorted(pkgutil.iter_modules(getattr(module, "__path__", [])), key=lambda m: m.name):
        try:
            importlib.import_module(f"{name}.{sub.name}")
        except Exception as e:
            raise _failed(name, folder, e) from e
    return name


def _folder_of(entry: str) -> Path | None:
    """The folder of suite ``entry`` (a path, or where its module would be found), None if unknown."""
    if is_path(entry):
        return Path(entry).expanduser().resolve()
    try:
        spec = importlib.util.find_spec(entry)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent.resolve() if spec is not None and spec.origin else None


def discover() -> list[str]:
    """Import every suite once (a second call, or one made while the suites import, does nothing),
    check what they declare (`CHECKS`), then freeze the registries they fill; returns the suite
    modules' names. A broken suite is one UserError naming the suite, the file and the field."""
    if _found:
        return list(_found)
    entries = suite_modules()
    _found.extend(entries)  # first: a suite importing a registry that calls discover() must not recurse
    try:
        _found[:] = [_import_suite(entry) for entry in entries]
        for name in CHECKS:
            CHECKS.get(name)()
    except BaseException:
        _found.clear()
        raise
    _done.append(True)
    freeze_suite_registries()
    return list(_found)


def discovered() -> bool:
    """Whether every suite is imported and checked (a declaration made later is checked at once)."""
    return bool(_done)
