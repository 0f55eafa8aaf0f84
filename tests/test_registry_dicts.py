"""Every registry is a `drmas_bench.registry.Registry` (docs/architecture.md, "One home per
concept"): no module of the project keeps a module-level dict of name -> implementation (functions,
classes) of its own, with its own duplicate check and its own unknown-name message. Found on the
source, without importing it:

- a module-level dict annotated with ``Callable`` or ``type[...]`` values (the shape of a registry
  filled later by a decorator), or
- a module-level dict literal with string keys whose values include a lambda, or a function or
  class the module defines or imports (by its name's case: ``snake_case`` or ``CamelCase``, not a
  ``CONSTANT``).

A plain data table (names -> numbers, strings, tuples, dataclass instances of figures) is not a
registry; ``DATA_TABLES`` names the few that the search flags and says why each stays a dict.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"drmas_bench": REPO / "drmas_bench", "drmas_trainer": REPO / "trainer", "drmas_retrieval": REPO / "retrieval"}

# (file relative to the repo, name) -> why it is a plain table and not a registry
DATA_TABLES: dict[tuple[str, str], str] = {
    ("drmas_bench/engines/carried.py", "CARRIED"):
        "the closed list of engine options a checkpoint folder (data) may set, each with its value check: "
        "a trust boundary, so nothing may register into it",
    ("drmas_bench/suites/math/refine_loop.py", "ROLES"):
        "the looped math team's four agents, each with its format rule and projection: a fixed table of "
        "one workflow, read in order, never added to",
    ("drmas_bench/report/runs.py", "COMPARED"):
        "the fixed columns a run comparison shows, each with its formatter: an ordered table of one page, "
        "not an extension point",
}


def _bound_callables(tree: ast.Module) -> set[str]:
    """Names the module binds to a function or class: its own defs and classes, and imported names
    that are not CONSTANTS (an imported ``CamelCase`` or ``snake_case`` name is a class or function)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            out |= {a.asname or a.name for a in node.names if not (a.asname or a.name).isupper()}
    return out


def _implementation(value: ast.expr | None, callables: set[str]) -> bool:
    if isinstance(value, ast.Lambda):
        return True
    if isinstance(value, ast.Name):
        return value.id in callables
    return False


def _callable_annotation(ann: ast.expr) -> bool:
    text = ast.unparse(ann)
    return text.startswith(("dict[", "Dict[", "Mapping[")) and ("Callable" in text or "type[" in text)


def name_to_implementation_dicts(path: Path) -> list[str]:
    """The module-level dicts of ``path`` that map names to implementations (module docstring)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    callables = _bound_callables(tree)
    found = []
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets, value = [node.target], node.value
            if _callable_annotation(node.annotation):
                found.append(node.target.id)
                continue
        elif isinstance(node, ast.Assign):
            targets, value = [t for t in node.targets if isinstance(t, ast.Name)], node.value
        else:
            continue
        if (isinstance(value, ast.Dict) and value.keys
                and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in value.keys)
                and any(_implementation(v, callables) for v in value.values)):
            found += [t.id for t in targets]
    return found


def test_the_finder_finds_both_shapes_of_a_registry_and_passes_a_data_table(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "from collections.abc import Callable\n"
        "from x import helper, Thing, LIMIT\n"
        "def f(): ...\n"
        "FILLED: dict[str, Callable[[int], int]] = {}\n"          # filled by a decorator later
        "LITERAL = {'a': f, 'b': lambda: 1}\n"
        "IMPORTED = {'t': Thing, 'h': helper}\n"
        "TABLE = {'a': 1, 'b': (2, 3), 'c': LIMIT}\n"            # data, not implementations
        "TYPED_TABLE: dict[str, float] = {'h100': 1.0}\n"
    )
    assert name_to_implementation_dicts(src) == ["FILLED", "LITERAL", "IMPORTED"]


def test_no_module_keeps_a_dict_of_name_to_implementation_outside_the_registry_type():
    found = {(f.relative_to(REPO).as_posix(), name)
             for folder in PACKAGES.values() for f in sorted(folder.rglob("*.py"))
             if f.name != "registry.py" for name in name_to_implementation_dicts(f)}
    assert sorted(found - set(DATA_TABLES)) == [], "make it a drmas_bench.registry.Registry (or name it in DATA_TABLES with why)"
    assert sorted(set(DATA_TABLES) - found) == [], "DATA_TABLES entries that are no longer found: drop them"
