"""The one registry type (`drmas_bench.registry.Registry`) and how outside suites are found
(`drmas_bench.suites.discovery`: a module name or a folder path in ``$DRMAS_SUITES``, or an installed
distribution's ``drmas_bench.suites`` entry point)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from drmas_bench.registry import Registry, RegistryError, resolve
from drmas_bench.types import UserError

REPO = Path(__file__).resolve().parents[1]


def test_a_name_is_registered_once_and_read_back():
    reg: Registry[int] = Registry("widget")
    assert reg.register("a", 1) == 1
    reg.register("a", 1)  # the same entry again (a module imported under two names) is no error

    @reg.register("b", aliases=("bee",))
    def b() -> int:
        return 2

    assert reg.get("b") is b and reg["bee"] is b and reg.find("nope") is None and reg.find(None) is None
    assert list(reg) == ["a", "b", "bee"] and reg.names() == ["a", "b", "bee"] and len(reg) == 3 and "a" in reg
    with pytest.raises(RegistryError, match="^widget 'a' registered twice$"):
        reg.register("a", 3)
    with pytest.raises(ValueError):  # a RegistryError is a ValueError too (the trainer's registries' callers)
        reg.register("bee", 3)
    with pytest.raises(KeyError):
        reg["nope"]


def test_an_alias_that_clashes_with_a_name_is_refused_in_either_order():
    """An alias is a second name for one entry: it may not take a name already registered (nor be
    taken by a later name), even when the entries are the same object, nor revive a renamed name."""
    def f() -> int:
        return 1

    def g() -> int:
        return 2

    name_first: Registry[object] = Registry("widget")
    name_first.register("a", f)
    with pytest.raises(RegistryError, match=r"^widget alias 'a' of 'b' is already a name$"):
        name_first.register("b", g, aliases=("a",))
    with pytest.raises(RegistryError, match=r"^widget alias 'a' of 'b' is already a name$"):
        name_first.register("b", f, aliases=("a",))  # the same object: still two names for one key
    assert name_first.names() == ["a"] and name_first.get("a") is f  # nothing half-registered

    alias_first: Registry[object] = Registry("widget")
    alias_first.register("b", g, aliases=("a",))
    for entry in (f, g):
        with pytest.raises(RegistryError, match=r"^widget 'a' is already an alias of 'b'$"):
            alias_first.register("a", entry)
    with pytest.raises(RegistryError, match=r"^widget alias 'a' of 'c' is already an alias of 'b'$"):
        alias_first.register("c", g, aliases=("a",))
    alias_first.register("b", g, aliases=("a",))  # the same registration again (a module imported twice)
    assert alias_first.names() == ["b", "a"] and alias_first.get("a") is g

    with pytest.raises(RegistryError, match=r"^widget 'd': alias 'd' given twice \(or equal to the name\)$"):
        alias_first.register("d", f, aliases=("d",))
    renamed: Registry[object] = Registry("widget", hints={"old": "now called `b`"})
    for args in (("old", f, ()), ("x", f, ("old",))):
        with pytest.raises(RegistryError, match=r"^widget 'old' is a renamed name \(now called `b`\); pick another$"):
            renamed.register(args[0], args[1], aliases=args[2])
    assert len(renamed) == 0


def test_an_unknown_name_is_one_line_listing_the_known_ones_with_a_hint_for_a_renamed_one():
    reg: Registry[int] = Registry("widget", hints={"old": "now called `a`"})
    reg.register("a", 1)
    reg.register("b", 2)
    with pytest.raises(UserError, match=r"^unknown widget 'c'; known: a, b$"):
        reg.get("c")
    with pytest.raises(UserError, match=r"^unknown widget 'old' \(now called `a`\); known: a, b$"):
        reg.get("old")
    strict: Registry[int] = Registry("kind", error=ValueError)
    with pytest.raises(ValueError, match="^unknown kind 'x'; known: none$"):
        strict.get("x")


def test_a_lazy_entry_is_imported_when_first_asked_for():
    reg: Registry[object] = Registry("thing")
    reg.register("dec", "decimal:Decimal")
    reg.register("dec2", "decimal:Decimal")
    assert reg.entry("dec") == "decimal:Decimal"  # not imported yet: the reference as written
    import decimal

    assert reg.get("dec") is decimal.Decimal and reg.entry("dec") is decimal.Decimal
    assert reg.entry("dec2") is decimal.Decimal  # one import serves every name of the same reference
    assert resolve("os.path:join") is os.path.join
    reg.register("x", "no_such_module_here:X")  # registering a reference imports nothing
    with pytest.raises(ModuleNotFoundError):
        reg.get("x")


def test_unregistering_a_name_removes_its_aliases_and_an_override_keeps_them():
    reg: Registry[int] = Registry("widget")
    reg.register("a", 1, aliases=("aa", "a1"))
    reg["a"] = 5  # an override (monkeypatch.setitem): the aliases answer with the new entry
    assert (reg.get("a"), reg.get("aa"), reg.get("a1")) == (5, 5, 5)
    reg.unregister("aa")  # an alias removes only itself
    assert "aa" not in reg.names() and reg.get("a1") == 5
    reg.unregister("a")
    assert reg.names() == []
    reg.register("a1", 2)  # free again: before, the stale alias refused it
    assert reg.get("a1") == 2

def test_a_frozen_registry_refuses_registration_outside_unfrozen():
    reg: Registry[int] = Registry("widget")
    reg.register("a", 1)
    reg.freeze()
    with pytest.raises(RegistryError, match="frozen"):
        reg.register("b", 2)
    with pytest.raises(RegistryError, match="frozen"):
        reg.unregister("a")
    with reg.unfrozen():
        reg["b"] = 2  # an override (monkeypatch.setitem) is a replacement
        reg["b"] = 3
        del reg["a"]
    assert reg.frozen and reg.items() == [("b", 3)]


def test_the_suite_registries_are_frozen_after_discovery():
    from drmas_bench.suites.registry import SUITES, suite_names
    from drmas_bench.workflows import RULES, WORKFLOWS

    suite_names()
    assert SUITES.frozen and WORKFLOWS.frozen and RULES.frozen


SUITE_INIT = '''
from drmas_bench.suites.registry import Suite, register_suite
register_suite(Suite({name!r}, workflow="toy", max_new_tokens=8, family="toy"))
'''


def _suite(folder: Path, name: str) -> Path:
    pkg = folder / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(SUITE_INIT.format(name=name)))
    return pkg


def test_outside_suites_arrive_by_folder_path_module_name_and_entry_point(tmp_path):
    """One child process: a suite named by its folder path, one by its module name (on PYTHONPATH),
    one installed (a distribution's metadata declaring the ``drmas_bench.suites`` entry point)."""
    by_path = _suite(tmp_path / "anywhere", "suite_by_path")
    _suite(tmp_path / "site", "suite_by_name")
    _suite(tmp_path / "site", "suite_installed")
    dist = tmp_path / "site" / "suite_installed-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: suite-installed\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[drmas_bench.suites]\nmine = suite_installed\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
           "DRMAS_SUITES": f"{by_path},suite_by_name"}
    code = "from drmas_bench.suites.registry import suite_names; print(' '.join(suite_names()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["math", "search", "suite_by_name", "suite_by_path", "suite_installed", "toy"]


def test_a_missing_suite_folder_or_module_is_one_line(tmp_path):
    from drmas_bench.suites.discovery import _import_suite

    with pytest.raises(UserError, match=r"^DRMAS_SUITES: .*nowhere is not a suite package"):
        _import_suite(str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match=r"^DRMAS_SUITES: cannot import the suite module 'no_such_suite_pkg'"):
        _import_suite("no_such_suite_pkg")
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("")
    with pytest.raises(UserError, match=r"a module named 'json' is already imported"):
        _import_suite(str(tmp_path / "json"))
