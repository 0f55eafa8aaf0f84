"""Finding the suites: every package in ``drmas_bench/suites/`` and every module named in
``$DRMAS_SUITES`` (comma-separated importable names: a suite kept outside this repository), each
with every module of its folder (name order), so a new workflow or rule is found by its file.

A suite's modules register what they hold when they are imported: its ``Suite`` and benchmarks
(``tasks.base``), its workflows (``workflows.base.workflow``), its format rules
(``workflows.rules.format_rule``) and its grading family (``grading.families.register_family``).
The registries call :func:`discover` before they are read, so a suite is found by being there; no
list names it. Imports go by name (``importlib``): the registries sit below the suites.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from pathlib import Path

from drmas_bench.types import UserError

SUITES_ENV = "DRMAS_SUITES"
SUITES_DIR = Path(__file__).parent / "suites"
_found: list[str] = []  # the suite modules imported, in order (filled once per process)


def suite_modules() -> list[str]:
    """The modules :func:`discover` imports: the packages under ``drmas_bench/suites/`` in name
    order, then those ``$DRMAS_SUITES`` names."""
    here = [f"drmas_bench.suites.{m.name}" for m in sorted(pkgutil.iter_modules([str(SUITES_DIR)]), key=lambda m: m.name)
            if m.ispkg]
    extra = [n.strip() for n in os.environ.get(SUITES_ENV, "").split(",") if n.strip()]
    return here + [n for n in extra if n not in here]


def discover() -> list[str]:
    """Import every suite once (a second call, or one made while the suites import, does nothing);
    returns the suite modules. A module named in ``$DRMAS_SUITES`` that cannot be imported is one
    UserError naming it."""
    if _found:
        return list(_found)
    names = suite_modules()
    _found.extend(names)  # first: a suite importing a registry that calls discover() must not recurse
    for name in names:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and name.startswith(e.name) and not name.startswith("drmas_bench."):
                _found.remove(name)
                raise UserError(f"{SUITES_ENV}: cannot import the suite module {name!r} ({e})") from None
            raise
        for sub in sorted(pkgutil.iter_modules(getattr(module, "__path__", [])), key=lambda m: m.name):
            importlib.import_module(f"{name}.{sub.name}")
    return list(_found)
