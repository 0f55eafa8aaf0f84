"""The layout rules of docs/architecture.md, checked on the code itself:

- no import circle between files, lazy imports included, and the harness (``drmas_bench`` outside
  ``commands/``) never imports the trainer;
- no engine kind is compared by name outside ``drmas_bench/engines/``; ``metrics.py`` names no
  workflow, and the runner, plan and provenance name no suite or grading family (they ask the
  declarations);
- readers of stored trajectory records (metrics, reports, the viewer, exports, sweeps, the
  workflows' effects) read them through `drmas_bench.records`' typed views, never by a record key;
- Markdown is written only in ``drmas_bench/report/`` (two named exceptions below);
- no package file is over 600 lines, and a function is over 60 lines (its docstring not counted)
  only where docs/architecture.md names it (splitting it would hide the algorithm);
- adding a backend is one class plus one ``ENGINES`` entry: a backend defined in this file runs a
  toy evaluation end to end.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"drmas_bench": REPO / "drmas_bench", "drmas_trainer": REPO / "trainer", "drmas_retrieval": REPO / "retrieval"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            parts = [pkg, *f.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def _owner(mods: dict[str, Path], name: str) -> str | None:
    """The longest project module prefix of a dotted name."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(node: ast.AST, package: str) -> list[str] | None:
    """The dotted names an import statement names (None for any other node): ``from pkg import name``
    gives ``pkg`` and ``pkg.name``; a relative import is resolved against ``package``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            up = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(up + ([base] if base else []))
        return [base] + [f"{base}.{a.name}" for a in node.names]
    return None


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its file (top level, inside functions,
    under TYPE_CHECKING). ``from pkg import name`` counts as importing ``pkg`` (its ``__init__``) and,
    when ``name`` is a module, that module too."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, f in mods.items():
        package = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = _imported_names(node, package)
            for n in names or []:
                target = _owner(mods, n)
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    group = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        group.append(w)
                        if w == v:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found


MAX_FILE_LINES = 500
#: files over MAX_FILE_LINES being split elsewhere (their module -> why it may still be long); the
#: list only shrinks: an entry whose file is back under the limit fails the test until it is dropped
LONG_FILES: dict[str, str] = {}  # module -> why it may stay over the limit (none today)
MAX_FUNCTION_LINES = 60
#: (module, function) kept whole on purpose; docs/architecture.md says why for each
LONG_FUNCTIONS: set[tuple[str, str]] = set()  # none today; the mechanism stays


def _code_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines, its docstring left out (an option list documents itself, TRL style)."""
    n = fn.end_lineno - fn.lineno + 1  # type: ignore[operator]
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        n -= first.end_lineno - first.lineno + 1  # type: ignore[operator]
    return n


def _long_functions(path: Path, limit: int) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(n.name, _code_lines(n)) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(n) > limit]


def test_long_functions_counts_code_lines_without_the_docstring(tmp_path):
    f = tmp_path / "m.py"
    doc = '    """One line.\n\n    More words.\n    """\n'
    f.write_text("def short():\n" + doc + "    return 1\n\n\ndef long():\n" + doc + "    x = 1\n" * 61 + "    return x\n")
    assert _long_functions(f, MAX_FUNCTION_LINES) == [("long", 63)]
    assert _long_functions(f, 1) == [("short", 2), ("long", 63)]


def test_no_package_file_is_over_500_lines():
    big = {m: n for m, f in _modules().items() if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    unnamed = {m: n for m, n in big.items() if m not in LONG_FILES}
    assert not unnamed, f"files over {MAX_FILE_LINES} lines (split them into modules with one job each): {unnamed}"
    assert sorted(set(LONG_FILES) - set(big)) == [], "LONG_FILES entries now under the limit: drop them"


# ------------------------------------------------------------------------------ layers (docs/architecture.md)

LAYERS_HEADING = "## The layers and what each may import"


def declared_layers(doc: str) -> list[tuple[str, list[str]]]:
    """The layer table of docs/architecture.md, bottom first: (layer, its module patterns as import
    names: relative to drmas_bench unless they start with ``drmas_``; ``x.*`` = x and all in it)."""
    section = doc.split(LAYERS_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ")]
    out = []
    for cells in rows[1:]:  # the header row first
        if set(cells[1].strip()) <= {"-"}:
            continue  # the separator row
        names = re.findall(r"`([^`]+)`", cells[2])
        out.append((cells[1].strip(), [n if n.startswith("drmas_") else f"drmas_bench.{n}" for n in names]))
    return out


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The index of ``module``'s layer: an exact name first, else the longest ``x.*`` covering it."""
    exact = [i for i, (_, pats) in enumerate(layers) if module in pats]
    if exact:
        return exact[0]
    best: tuple[int, int] | None = None
    for i, (_, pats) in enumerate(layers):
        for p in pats:
            if p.endswith(".*") and (module == p[:-2] or module.startswith(p[:-1])):
                if best is None or len(p) > best[0]:
                    best = (len(p), i)
    return None if best is None else best[1]


def arrows_back_up(graph: dict[str, set[str]], layers: list[tuple[str, list[str]]]) -> list[tuple[str, str]]:
    """Imports from a module to one of a higher layer (every import, lazy ones included)."""
    return sorted((m, t) for m, ts in graph.items() for t in ts
                  if (lm := layer_of(m, layers)) is not None and (lt := layer_of(t, layers)) is not None and lt > lm)


def test_the_layer_table_places_modules_and_finds_an_arrow_back_up():
    layers = [("low", ["drmas_bench.a", "drmas_bench.p.*"]), ("high", ["drmas_bench.p.top", "drmas_bench.b"])]
    assert [layer_of(m, layers) for m in ("drmas_bench.a", "drmas_bench.p", "drmas_bench.p.x", "drmas_bench.p.top",
                                          "drmas_bench.b", "drmas_bench.c")] == [0, 0, 0, 1, 1, None]
    graph = {"drmas_bench.a": {"drmas_bench.p.x"}, "drmas_bench.p.x": {"drmas_bench.p.top"}, "drmas_bench.b": {"drmas_bench.a"}}
    assert arrows_back_up(graph, layers) == [("drmas_bench.p.x", "drmas_bench.p.top")]
    doc = f"{LAYERS_HEADING}\n\n| layer | modules | holds |\n| --- | --- | --- |\n| low | `a`, `p.*` | `x` |\n" \
          f"| top | `drmas_trainer.*` | |\n\n## next\n| no | `z` | |\n"
    assert declared_layers(doc) == [("low", ["drmas_bench.a", "drmas_bench.p.*"]), ("top", ["drmas_trainer.*"])]


def test_every_module_has_one_declared_layer_and_no_import_climbs_back_up():
    """docs/architecture.md's layer table is the rule: every module of the three packages is placed
    by it, every pattern in it places a module, and no import goes from a layer to one above it."""
    layers = declared_layers((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    mods = _modules()
    unplaced = sorted(m for m in mods if layer_of(m, layers) is None)
    assert unplaced == [], f"modules in no layer of docs/architecture.md's table: {unplaced}"
    unused = sorted(p for _, pats in layers for p in pats
                    if not any(m == p or (p.endswith(".*") and (m == p[:-2] or m.startswith(p[:-1]))) for m in mods))
    assert unused == [], f"the layer table names modules that do not exist: {unused}"
    up = arrows_back_up(import_graph(), layers)
    assert up == [], f"{len(up)} arrow(s) back up (an import of a higher layer): {up}"


def test_a_function_is_over_60_lines_only_where_the_architecture_says_why():
    found = {(m, name): n for m, f in _modules().items() for name, n in _long_functions(f, MAX_FUNCTION_LINES)}
    unnamed = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS}
    assert not unnamed, f"functions over {MAX_FUNCTION_LINES} lines not named in docs/architecture.md: {unnamed}"
    stale = sorted(k for k in LONG_FUNCTIONS if k not in found)
    assert not stale, f"LONG_FUNCTIONS names functions that are no longer long (drop them here and in the doc): {stale}"
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    unexplained = [(module, name) for module, name in sorted(LONG_FUNCTIONS)
                   if f"`{name}`" not in doc and f"{module.rsplit('.', 1)[-1]}.{name}`" not in doc]
    assert unexplained == [], f"LONG_FUNCTIONS entries docs/architecture.md does not name: {unexplained}"


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_between_files():
    assert circles(import_graph()) == []


def test_the_harness_does_not_import_the_trainer():
    graph = import_graph()
    bad = sorted((m, t) for m, ts in graph.items() for t in ts
                 if m.startswith("drmas_bench") and not m.startswith("drmas_bench.commands")
                 and t.startswith("drmas_trainer"))
    assert bad == []


# the run directory: the store, its samples.jsonl reader and selection, the samples' run stamps
STORE = ("drmas_bench.run_dir", "drmas_bench.run_samples", "drmas_bench.run_stamps")
# the modules that may import the run directory (`STORE`): the run layer, the entry
# layer, the CLI, and the trainer's loop (it opens and locks its own run directory)
STORE_USERS = ("drmas_bench.runner", "drmas_bench.api", "drmas_bench.plan", "drmas_bench.sweep", "drmas_bench.metrics",
               "drmas_bench.call_cache", "drmas_bench.report", "drmas_bench.export", "drmas_bench.commands",
               "drmas_bench.cli", "drmas_trainer.trainer")


def test_nothing_below_the_run_layer_imports_the_store():
    """File names, atomic writes and identity by content live in the leaf `drmas_bench.files`; the
    store (the run directory) is imported only by the run layer and above."""
    bad = sorted((m, t) for m, ts in import_graph().items() for t in ts
                 if t in STORE and m not in STORE and not m.startswith(STORE_USERS))
    assert bad == []


def test_workflows_import_nothing_of_the_run_layer():
    """A workflow's effects and rules read records through `records` and its suite's own rules, not
    metrics: the workflows and the suites sit below the run layer (docs/architecture.md). Not yet
    checked: `retrievers`, which the search warm start (`suites/search/search_sft.py`) opens its index with."""
    run_layer = {"drmas_bench.runner", "drmas_bench.run_dir", "drmas_bench.metrics", "drmas_bench.call_cache"}
    bad = sorted((m, t) for m, ts in import_graph().items() for t in ts
                 if m.startswith(("drmas_bench.workflows", "drmas_bench.suites")) and t in run_layer)
    assert bad == []


def test_a_suite_imports_no_other_suite_and_nothing_imports_a_suite():
    """A suite folder is found by `drmas_bench.suites.discovery` and imports only the layers below it,
    never another suite; what the suites share sits beside them as a module of `drmas_bench/suites/`
    (`registry`, `discovery`, `arithmetic`: not a suite, since a suite is a package) or below them
    (`workflows.protocol`). Outside the suites nothing imports a suite's module (tests and scripts
    may): the trainer's ``data.source: toy`` reaches the toy suite's generator through the
    benchmark registry."""
    def suite_of(m: str) -> str | None:
        parts = m.split(".")
        if len(parts) > 2 and parts[:2] == ["drmas_bench", "suites"]:
            return parts[2] if (PACKAGES["drmas_bench"] / "suites" / parts[2]).is_dir() else None
        return None

    graph = import_graph()
    across = sorted((m, t) for m, ts in graph.items() for t in ts
                    if suite_of(m) and suite_of(t) and suite_of(m) != suite_of(t))
    into = sorted((m, t) for m, ts in graph.items() for t in ts
                  if suite_of(t) and not suite_of(m))
    assert across == [] and into == []


def test_no_format_rule_is_compared_by_name_outside_its_suite():
    """metrics, the viewer and the labels ask a rule (`workflows.rules.FormatRule`) for its reasons,
    parse and figures; none of them names one."""
    from drmas_bench.workflows import registered_rules

    RULES = registered_rules()
    for f in ("metrics.py", "report/view.py", "report/labels.py", "report/sections.py", "report/markdown.py"):
        assert sorted(code_strings(REPO / "drmas_bench" / f) & set(RULES)) == [], f


def code_strings(path: Path) -> set[str]:
    """The string constants of a file's code (docstrings left out: prose may name anything)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs}


def test_code_strings_finds_a_name_but_not_a_docstring(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""about search_route"""\ndef g():\n    """toy"""\n    return g == "math_refine"\n')
    assert code_strings(f) == {"math_refine"}


def test_metrics_names_no_workflow():
    """metrics.py keeps the numbers and one generic compliance loop; what a workflow knows (its
    rules, effects, env) it declares on its WorkflowSpec."""
    from drmas_bench.workflows import workflow_names

    assert sorted(code_strings(REPO / "drmas_bench" / "metrics.py") & set(workflow_names())) == []


# the keys of a stored trajectory record (``Trajectory.to_dict``) and of its turns that only
# `drmas_bench.records` reads
RECORD_KEYS = {"task", "sample_idx", "turns", "final_answer", "reward", "correct", "extra", "wall_s", "cost_usd",
               "completion", "request"}
# the modules that read stored records (the call cache's own rows and the store's shape check are
# not records read for their content, so cache.py and store.py are not listed)
RECORD_READERS = ("metrics.py", "api.py", "sweep.py", "report/*.py", "export/*.py", "workflows/*.py")


def record_key_reads(path: Path) -> list[str]:
    """Where a file reads a record key: ``x["turns"]``, ``x.get("extra")`` (a dict literal's keys
    are writes and do not count)."""
    hits = []
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        key = None
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
            key = n.slice.value
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args
              and isinstance(n.args[0], ast.Constant)):
            key = n.args[0].value
        if key in RECORD_KEYS:
            where = path.relative_to(REPO) if REPO in path.parents else path.name
            hits.append(f"{where}:{n.lineno}: {ast.unparse(n)}")
    return hits


def test_record_key_reads_finds_a_subscript_and_a_get(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('def g(r):\n    return r["turns"], r.get("extra"), {"turns": 1}, r.turns\n')
    assert [h.split(": ", 1)[1] for h in record_key_reads(f)] == ["r['turns']", "r.get('extra')"]


def test_records_are_read_through_typed_views():
    """metrics, reports, the viewer, exports, sweeps and the workflows' effects read a stored record
    as `records.RecordView` (`records.view`), the one place that knows its keys and older shapes."""
    hits = [h for pattern in RECORD_READERS for f in sorted((REPO / "drmas_bench").glob(pattern))
            for h in record_key_reads(f)]
    assert hits == []


# Markdown outside report/: schema.py renders the config tables docs/ embeds (a docs generator),
# export/hub.py writes the Hub model card, whose README.md is the export format itself
MARKDOWN_ELSEWHERE = {"schema.py", "export/hub.py"}


def test_markdown_is_written_only_in_report():
    """A function that returns Markdown (``*_markdown``) or a string that draws a Markdown table rule
    (``|---``) lives in ``drmas_bench/report/``."""
    hits = []
    for f in sorted((REPO / "drmas_bench").rglob("*.py")):
        rel = f.relative_to(REPO / "drmas_bench").as_posix()
        if rel.startswith("report/") or rel in MARKDOWN_ELSEWHERE:
            continue
        tree = ast.parse(f.read_text(encoding="utf-8"))
        hits += [f"{rel}:{n.lineno}: def {n.name}" for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.endswith("_markdown")]
        hits += [f"{rel}: {s!r}" for s in code_strings(f) if "|---" in s or s.startswith("---|")]
    assert hits == []


def test_a_plan_is_built_from_small_frozen_typed_parts():
    """`plan.Plan` holds frozen parts (Resolved, Inputs, RunRecord, Prompts, Costs), each field typed
    by what it holds (nothing open: the retriever and the call cache are named, ``api.run`` opens them)."""
    import dataclasses

    from drmas_bench import plan

    parts = [plan.Plan] + [f.type for f in dataclasses.fields(plan.Plan) if f.type not in ("EvalConfig", "float")]
    parts = [getattr(plan, p) if isinstance(p, str) else p for p in parts]
    assert [p.__name__ for p in parts] == ["Plan", "Resolved", "Inputs", "RunRecord", "Prompts", "Costs"]
    untyped = []
    for part in parts:
        assert part.__dataclass_params__.frozen, part.__name__
        untyped += [f"{part.__name__}.{f.name}" for f in dataclasses.fields(part) if f.type in ("Any", "list", "dict")]
    assert untyped == []


def test_each_module_logs_under_its_own_name():
    """A module's logger is ``logging.getLogger(__name__)`` (the CLI's handler sits on the package
    loggers, so every child's lines show the same); another name is only a third-party logger a
    module quiets (not assigned to a module-level name)."""
    hits = []
    for folder in (REPO / "drmas_bench", REPO / "trainer", REPO / "retrieval"):
        for f in sorted(folder.rglob("*.py")):
            for n in ast.parse(f.read_text(encoding="utf-8")).body:
                if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                        and ast.unparse(n.value.func) == "logging.getLogger"
                        and ast.unparse(n.value) != "logging.getLogger(__name__)"):
                    hits.append(f"{f.relative_to(REPO)}:{n.lineno}: {ast.unparse(n)}")
    assert hits == []


# what a function may import when it runs rather than at the top of its module: these load a heavy or
# optional dependency (a project module that imports one at its top counts too; the CLI's commands/
# defer the whole harness so that `drmas-bench --help` stays light)
LIGHT_ALWAYS = {"yaml", "numpy", "pydantic"}  # installed with the package and loaded by every command


def function_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import that sits inside a function of ``path``."""
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import):
                out.extend((child.lineno, a.name) for a in child.names)
            elif in_function and isinstance(child, ast.ImportFrom):
                out.append((child.lineno, "." * child.level + (child.module or "")))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return out


def test_function_imports_finds_an_import_in_a_function(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\ndef g():\n    import json\n    def h():\n        from . import x\n    return h\n")
    assert function_imports(f) == [(3, "json"), (5, ".")]


PROJECT = tuple(PACKAGES)
MODULES = set(_modules())


def deferred_imports(path: Path, module: str | None = None) -> dict[str, int]:
    """In how many functions of ``path`` (the file of ``module``, by default found from its place in
    the project) each dependency is imported, a nested function counting with the one it sits in: a
    third-party dependency by its top package (``torch.distributed`` counts as ``torch``), a project
    one by its full module name (a relative import made absolute)."""
    module = module or _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def key(mod: str) -> str:
        level = len(mod) - len(mod.lstrip("."))
        if level:
            up = package.split(".")[: len(package.split(".")) - level + 1]
            mod = ".".join(up + ([mod[level:]] if mod[level:] else []))
        return mod if mod.split(".")[0] in PROJECT else mod.split(".")[0]

    counts: dict[str, int] = {}

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                found = set()
                for n in ast.walk(child):
                    if isinstance(n, ast.Import):
                        found.update(key(a.name) for a in n.names)
                    elif isinstance(n, ast.ImportFrom):  # `from pkg import mod` imports the module mod
                        base = key("." * n.level + (n.module or ""))
                        found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in n.names)
                for k in found:
                    counts[k] = counts.get(k, 0) + 1
            else:
                visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return counts


def _module_name(path: Path) -> str:
    for pkg, folder in PACKAGES.items():
        if folder in path.parents:
            parts = [pkg, *path.relative_to(folder).with_suffix("").parts]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return path.stem


def test_deferred_imports_counts_functions_by_top_package_and_resolves_relative_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import torch\ndef g():\n    import torch\n    from torch.distributed import tensor\n"
                 "    from . import source\n    from .source import load\n    import drmas_bench.types\n"
                 "class C:\n    def h(self):\n        def inner():\n            import torch\n        import ray\n")
    assert deferred_imports(f, "drmas_bench.export.m") == {
        "torch": 2, "ray": 1, "drmas_bench.export.source": 1, "drmas_bench.types": 1}
    assert _module_name(REPO / "drmas_bench" / "export" / "__init__.py") == "drmas_bench.export"
    assert _module_name(REPO / "trainer" / "lora.py") == "drmas_trainer.lora"


def test_no_standard_library_module_is_imported_inside_a_function():
    """Nothing light is deferred: a module's standard-library, yaml, numpy and pydantic imports sit
    at its top, where a reader sees what it depends on."""
    light = set(sys.stdlib_module_names) | LIGHT_ALWAYS
    hits = [f"{f.relative_to(REPO)}:{line}: {mod}" for folder in (REPO / "drmas_bench", REPO / "trainer")
            for f in sorted(folder.rglob("*.py")) for line, mod in function_imports(f)
            if mod.split(".")[0] in light]
    assert hits == []


# (module, dependency) imported inside more than one function, each with why it stays deferred
DEFERRED_MORE_THAN_ONCE = {
    # imported at the top of models/__init__ and plan (every evaluation's path): loading a model
    # needs them, checking a folder's tokenizer or resolving a name does not
    ("drmas_bench.models.loading", "torch"): "on the light path of models/ and plan",
    ("drmas_bench.models.loading", "transformers"): "on the light path of models/ and plan",
    ("drmas_bench.models.smollm2", "torch"): "the model registry imports it to list its aliases",
    ("drmas_bench.models.smollm2", "transformers"): "the model registry imports it to list its aliases",
    ("drmas_bench.engines.hosting", "torch"): "plan and the explicit team import it to place engines",
    # the optional sglang extra, checked where used (GPU-only backend: not reworked without a GPU)
    ("drmas_bench.engines.sglang", "sglang"): "optional extra, GPU-only backend",
    ("drmas_bench.engines.sglang", "torch"): "GPU-only backend",
}


def third_party(name: str) -> bool:
    top = name.split(".")[0]
    return top not in PROJECT and top not in sys.stdlib_module_names and top != "__future__"


def test_a_dependency_is_deferred_in_one_function_per_module():
    """A heavy or optional dependency a module needs only sometimes is imported inside one function
    of it (an accessor, or the one place that uses it); a module whose whole job needs it imports it
    at its top and is itself imported lazily by whoever only sometimes needs it."""
    found = {(_module_name(f), dep): n for folder in (REPO / "drmas_bench", REPO / "trainer")
             for f in sorted(folder.rglob("*.py")) for dep, n in deferred_imports(f).items() if third_party(dep)}
    repeated = sorted(f"{m}: {dep} in {n} functions" for (m, dep), n in found.items()
                      if n > 1 and (m, dep) not in DEFERRED_MORE_THAN_ONCE)
    assert repeated == []
    stale = sorted(k for k in DEFERRED_MORE_THAN_ONCE if found.get(k, 0) < 2)
    assert stale == [], "allowed repeats that no longer repeat: drop them from DEFERRED_MORE_THAN_ONCE"


def top_imports() -> dict[str, set[str]]:
    """module -> what it imports when it is imported (its top level, ``try``/``if`` blocks included,
    ``TYPE_CHECKING`` blocks left out): project modules by full name, others by top package."""
    mods = _modules()
    out: dict[str, set[str]] = {m: set() for m in mods}
    for mod, f in mods.items():
        package = mod if f.name == "__init__.py" else mod.rpartition(".")[0]

        def walk(body: list[ast.stmt], mod: str = mod, package: str = package) -> None:
            for node in body:
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    continue
                if isinstance(node, (ast.If, ast.Try)):
                    walk(node.body)
                    walk(node.orelse)
                    for h in getattr(node, "handlers", []):
                        walk(h.body)
                    continue
                names = _imported_names(node, package)
                for n in names or []:
                    target = _owner(mods, n)
                    while target:  # importing a.b.c runs a and a.b first
                        if target != mod:
                            out[mod].add(target)
                        target = _owner(mods, target.rpartition(".")[0]) if "." in target else None
                    if n.split(".")[0] not in PROJECT:
                        out[mod].add(n.split(".")[0])

        walk(ast.parse(f.read_text(encoding="utf-8")).body)
    return out


def loads_heavy(module: str, tops: dict[str, set[str]]) -> set[str]:
    """The third-party packages beyond the light ones (yaml, numpy, pydantic) that importing
    ``module`` loads, through the project modules it imports at its top."""
    seen, stack, heavy = set(), [module], set()
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        for t in tops.get(m, ()):
            if t in tops:
                stack.append(t)
            elif third_party(t) and t not in LIGHT_ALWAYS:
                heavy.add(t)
    return heavy


# the modules that import the harness inside functions for a reason other than a heavy dependency
DEFER_PROJECT_MODULES = {
    "drmas_bench.commands": "the CLI's commands import the harness when they run, so --help stays light",
    "drmas_bench.cli": "the CLI's commands import the harness when they run, so --help stays light",
    "drmas_bench": "`import drmas_bench` exports evaluate, EvalConfig and Summary on first use",
}
# (module, project module) deferred for another reason, each with it
DEFERRED_PROJECT_IMPORTS = {
    # the CLI imports limits at its top (LimitReached, the exit code); records and pricing load numpy,
    # pydantic and the schemas, which `drmas-bench --help` does not need
    ("drmas_bench.limits", "drmas_bench.records"): "keeps the CLI's import light",
    ("drmas_bench.limits", "drmas_bench.pricing"): "keeps the CLI's import light",
}

# all of the project that `import drmas_bench.cli` (every `drmas-bench` command, --help included)
# loads before a command runs
CLI_IMPORTS = {  # drmas_bench.suites: the folder package, a docstring
               "drmas_bench", "drmas_bench.cli", "drmas_bench.suites", "drmas_bench.suites.discovery", "drmas_bench.limits", "drmas_bench.log",
               "drmas_bench.registry", "drmas_bench.signals",
               "drmas_bench.types"}


def test_the_cli_imports_only_its_light_core():
    """The commands import the harness when they run; the CLI module itself loads a handful of
    project modules and none of the heavy dependencies."""
    code = ("import sys, drmas_bench.cli; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('drmas_bench', 'drmas_trainer', 'drmas_retrieval', 'torch', 'transformers', 'ray', 'sglang', "
            "'inspect_ai', 'pyarrow', 'matplotlib', 'sympy', 'peft'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert set(out.split()) == CLI_IMPORTS


def test_a_project_module_is_imported_inside_a_function_only_to_defer_a_heavy_dependency():
    """A function imports a project module only when that module loads a heavy or optional
    dependency (torch, sympy, inspect_ai, ...) that its caller needs only sometimes; the CLI's
    commands defer the whole harness. Anything else is imported at the module's top, where a reader
    sees it."""
    tops = top_imports()
    hits, used = [], set()
    for folder in (REPO / "drmas_bench", REPO / "trainer"):
        for f in sorted(folder.rglob("*.py")):
            mod = _module_name(f)
            if mod in DEFER_PROJECT_MODULES or mod.startswith("drmas_bench.commands."):
                continue
            for dep in deferred_imports(f):
                if dep.startswith(PROJECT) and not loads_heavy(dep, tops):
                    if (mod, dep) in DEFERRED_PROJECT_IMPORTS:
                        used.add((mod, dep))
                    else:
                        hits.append(f"{mod}: {dep}")
    assert sorted(hits) == []
    assert sorted(set(DEFERRED_PROJECT_IMPORTS) - used) == [], "stale DEFERRED_PROJECT_IMPORTS entries"


def test_loads_heavy_follows_top_imports_only():
    tops = {"a": {"b", "yaml"}, "b": {"torch"}, "c": {"numpy"}}
    assert loads_heavy("a", tops) == {"torch"} and loads_heavy("c", tops) == set()


def test_no_suite_or_family_is_compared_by_name_in_the_run_layer():
    """runner, plan and provenance ask the Suite and the grading family (`Family.takes_grader`) rather
    than naming one."""
    from drmas_bench.grading.families import FAMILIES
    from drmas_bench.suites.registry import suite_names

    names = set(FAMILIES) | set(suite_names())
    for f in ("runner.py", "plan.py", "provenance.py"):
        assert sorted(code_strings(REPO / "drmas_bench" / f) & names) == [], f


# the layers that know no suite: their files may name no suite, workflow or agent (a suite's knowledge
# is declared in its folder and read through its declaration)
SUITE_FREE = ("report", "workflows", "models", "split", "runner.py", "run_dir.py", "run_samples.py", "run_stamps.py",
              "metrics.py", "retrievers.py", "call_cache.py", "limits.py", "calls.py", "pricing.py")
# the named exceptions: file -> the names it may hold, and why
SUITE_NAME_EXCEPTIONS = {
    # the trainer's ``data.source: toy`` (the toy suite's generator) and the toy workflow it defaults to
    "trainer/config/train.py": {"toy"}, "trainer/config/rollout.py": {"toy"}, "trainer/prepare.py": {"toy"},
    "trainer/forecast/hours.py": {"toy"},
    # "search" there is an env step's kind (``WorkflowSpec.env_step_kinds``: search | empty | answer | end)
    "drmas_bench/report/view_scan.py": {"search"},
}
SUITE_NAMES_PENDING: dict[str, set[str]] = {}  # none: the report draws every declared block by its declaration


def test_no_suite_workflow_or_agent_is_named_outside_the_suites():
    """Suite, workflow and agent names stay in their suites' folders: the report, the workflows'
    shared layer, the models, the run layer and the trainer read a suite's declaration (its ``Suite``,
    its workflows' ``WorkflowSpec`` and rules) instead, as engine names stay in engines/. An agent
    named like a field of a turn (``agent``: search_single's one agent) is a field name there."""
    from drmas_bench.suites.registry import suite_names
    from drmas_bench.types import Turn
    from drmas_bench.workflows import get_workflow, workflow_names

    agents = {a for w in workflow_names() for a in get_workflow(w).agents} - {f.name for f in fields(Turn)}
    names = set(suite_names()) | set(workflow_names()) | agents
    files = [f for part in SUITE_FREE for f in ([REPO / "drmas_bench" / part] if part.endswith(".py")
                                                 else sorted((REPO / "drmas_bench" / part).rglob("*.py")))]
    files += sorted((REPO / "trainer").rglob("*.py"))
    hits = {}
    for f in files:
        rel = f.relative_to(REPO).as_posix()
        named = code_strings(f) & names
        named -= SUITE_NAME_EXCEPTIONS.get(rel, set()) | SUITE_NAMES_PENDING.get(rel, set())
        if named:
            hits[rel] = sorted(named)
    assert hits == {}


def test_no_engine_kind_is_compared_by_name_outside_engines():
    from drmas_bench.engines import ENGINES

    kinds = "|".join(map(re.escape, ENGINES))
    pattern = re.compile(rf"""(==|!=)\s*["']({kinds})["']|["']({kinds})["']\s*(==|!=)|\bin\s*[(\[{{]\s*["']({kinds})["']""")
    hits = []
    for folder in (REPO / "drmas_bench", REPO / "trainer"):
        for f in folder.rglob("*.py"):
            if (REPO / "drmas_bench" / "engines") in f.parents:
                continue
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line.split("#")[0]):
                    hits.append(f"{f.relative_to(REPO)}:{i}: {line.strip()}")
    assert hits == []


# ------------------------------------------------------------------ a backend defined in a test


@dataclass
class EchoOptions:
    max_batch: int = 8  # a generic option: the eval's default micro-batch reaches it (fit_options)


class EchoEngine:
    """Answers "What is a + b?" correctly and approves every proposal: a complete backend in a few
    lines, with the default traits (in-process, not process-wide)."""

    name = "echo"
    Options = EchoOptions
    created: list[dict] = []

    def __init__(self, model: str, **options):
        self.model = model
        self.options = EchoOptions(**options)
        self._awake = True
        EchoEngine.created.append({"model": model, **options})

    async def generate(self, requests):
        from drmas_bench.types import Completion

        out = []
        for r in requests:
            text = r.messages[-1]["content"]
            if "Proposed answer" in text:
                reply = "<verdict>approve</verdict>"
            else:
                a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", text).groups())
                reply = f"<answer>{a + b}</answer>"
            out.append(Completion(reply, prompt_tokens=len(text.split()), completion_tokens=1))
        return out

    async def sleep(self):
        self._awake = False

    async def wake(self):
        self._awake = True

    @property
    def is_awake(self):
        return self._awake

    def footprint_bytes(self):
        return 0

    async def close(self):
        self._awake = False


def test_a_backend_is_one_class_and_one_engines_entry(tmp_path, monkeypatch):
    """Registered in ENGINES (nothing else edited), the backend is a valid --engine choice, gets
    the options it declares, serves every agent of the toy workflow, and its answers are graded."""
    from drmas_bench.api import EvalConfig, evaluate
    from drmas_bench.engines import ENGINES, traits
    from drmas_bench.types import UserError

    monkeypatch.setitem(ENGINES, "echo", f"{__name__}:EchoEngine")
    monkeypatch.setitem(sys.modules, __name__, sys.modules[__name__])
    EchoEngine.created.clear()
    assert traits("echo").remote is False and traits("echo").process_wide is False
    s = evaluate(EvalConfig(model="tiny-random", suite="toy", engine="echo", n=2, limit=3, out=str(tmp_path / "run"),
                            progress=False))
    assert EchoEngine.created == [{"model": "tiny-random", "max_batch": 32}]
    assert s["micro"]["avg@n"] == 1.0 and s["benchmarks"]["toy"]["questions"] == 3
    assert s["run"]["team"]["solver"]["worker_group"] == s["run"]["team"]["checker"]["worker_group"]
    with pytest.raises(UserError, match="dtype: not an option of the echo engine; options: max_batch"):
        evaluate(EvalConfig(model="tiny-random", suite="toy", engine="echo", engine_args={"dtype": "float32"},
                            n=1, limit=1, out=str(tmp_path / "run2"), progress=False))


# Run in one fresh interpreter by test_every_module_imports_alone_in_a_fresh_interpreter: a scout
# child imports every project module and reports the third-party modules that came with them; this
# process imports those (and no project module), then forks one child per project module, so each
# child starts with no project module loaded, as a fresh interpreter does, without paying for torch,
# transformers or inspect_ai again (about 180 fresh interpreters cost over a minute of CPU).
_FORK_IMPORTER = """
import importlib, os, sys
PROJECT = ("drmas_bench", "drmas_trainer", "drmas_retrieval")
names = sys.argv[1:]

def in_child(fn):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            msg = fn()
        except BaseException as e:
            msg = "FAILED " + type(e).__name__ + ": " + str(e).splitlines()[0][:300] if str(e) else "FAILED " + type(e).__name__
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    out = b""
    while chunk := os.read(r, 1 << 16):
        out += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return out.decode() if status == 0 else "FAILED exit status %d" % status

def scout():
    for n in names:
        try:
            importlib.import_module(n)
        except BaseException:
            pass
    return "\\n".join(m for m in sys.modules if m.split(".")[0] not in PROJECT)

for m in in_child(scout).split("\\n"):
    if m and m not in sys.modules:
        try:
            importlib.import_module(m)
        except BaseException:
            pass
loaded = sorted(m for m in sys.modules if m.split(".")[0] in PROJECT)
assert not loaded, loaded
print("preloaded", len(sys.modules))
for n in names:
    print(n, "->", in_child(lambda: (importlib.import_module(n), "ok")[1]))
"""


@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter():
    """The circle finder reads the files' import statements and so misses a circle closed by a
    package's ``__init__`` (``retrievers`` -> ``workflows.protocol`` ran ``workflows/__init__``, whose
    ``search_sft`` imported ``retrievers`` half-built). Importing each module first, alone, finds it:
    each in its own process forked from one that holds the third-party packages but no project
    module (_FORK_IMPORTER)."""
    names = sorted(m for m in _modules() if not m.endswith(".__main__"))
    r = subprocess.run([sys.executable, "-c", _FORK_IMPORTER, *names], capture_output=True, text=True, timeout=600,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    got = dict(line.split(" -> ", 1) for line in r.stdout.splitlines() if " -> " in line)
    assert sorted(got) == names, r.stdout[-3000:]
    failed = [f"{n}: {v}" for n, v in got.items() if v != "ok"]
    assert failed == []


def test_every_package_folder_is_listed_for_setuptools():
    """pyproject's explicit package list installs exactly the folders with an ``__init__.py``: a
    sub-package left off is missing from a non-editable install (``drmas_bench.split`` once was)."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {".".join((pkg, *init.parent.relative_to(folder).parts))
             for pkg, folder in PACKAGES.items() for init in folder.rglob("__init__.py")}
    assert sorted(found - listed) == [] and sorted(listed - found) == []
