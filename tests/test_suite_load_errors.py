"""A broken suite is refused when the suites are discovered, before any command runs (``--help``
included, before a model loads or a run folder exists): one line naming the suite, the file and the
field, exit 2. Each broken variant is a throwaway suite in a temporary folder named by its path in
``$DRMAS_SUITES``; the pure checks (a rule's fields, a workflow's signature, the prompt parts a
workflow uses) are also tested directly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from drmas_bench.registry import DeclarationError
from drmas_bench.types import UserError
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.base import Episode, get_workflow, workflow
from drmas_bench.workflows.rules import FormatRule, check_rule

PLACEHOLDERS = {"a": ({"question", "team_context"}, {"question"})}
WITH_TEMPLATES = '''
from drmas_bench.suite import Episode, ProtocolOptions, Templates, workflow
@workflow("bad_wf", agents=("a",), family="toy", placeholders={"a": ({"question", "team_context"}, {"question"})})
async def bad_wf(ep: Episode, prompts: Templates | None = None, protocol: ProtocolOptions | None = None) -> None:
    ep.final_answer = "1"
'''
# variant -> (its __init__.py, its prompts file or None, what the one line must say)
VARIANTS = {
    "malformed_rule": ('''
        from drmas_bench.suite import FormatRule, format_rule
        R = format_rule(FormatRule("bad_rule", ("not", "a function")))
        ''', None, r"suite bad: bad/__init__\.py:2: FormatRule 'bad_rule': reasons: expected a function"),
    "unknown_rule_name": ('''
        from drmas_bench.suite import Episode, workflow
        @workflow("bad_wf", agents=("a",), family="toy", rules={"a": "no_such_rule"})
        async def bad_wf(ep: Episode) -> None:
            ep.final_answer = "1"
        ''', None, r"suite bad: bad/__init__\.py:2: workflow 'bad_wf': rules\.a: unknown format rule 'no_such_rule'; known: "),
    "placeholders_without_prompts_option": ('''
        from drmas_bench.suite import Episode, workflow
        @workflow("bad_wf", agents=("a",), family="toy", placeholders={"a": ({"question"}, {"question"})})
        async def bad_wf(ep: Episode, rounds: int = 1) -> None:
            ep.final_answer = "1"
        ''', None, r"suite bad: bad/__init__\.py:2: workflow 'bad_wf': placeholders= .* needs the option\(s\) "
                   r"prompts=None, protocol=None"),
    "prompts_file_missing": (WITH_TEMPLATES, None, r"suite bad: bad/bad_wf\.prompts\.yaml: missing: workflow 'bad_wf'"),
    "prompts_file_lacks_a_used_part": (WITH_TEMPLATES, 'system: s\nroles:\n  a: "{{question}}"\n',
                                       r"suite bad: bad/bad_wf\.prompts\.yaml: parts\.context_entry: no template"),
    "does_not_import": ("import no_such_helper_package_here\n", None,
                        r"suite bad: bad/__init__\.py:1: ModuleNotFoundError: No module named 'no_such_helper_package_here'"),
}


def _suite(tmp_path: Path, init: str, prompts: str | None) -> Path:
    pkg = tmp_path / "bad"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(init).lstrip(), encoding="utf-8")
    if prompts is not None:
        (pkg / "bad_wf.prompts.yaml").write_text(prompts, encoding="utf-8")
    return pkg


def _cli(suites: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "drmas_bench", *args], env={**os.environ, "DRMAS_SUITES": suites},
                          cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_broken_suite_is_one_line_for_help_before_anything_loads(variant, tmp_path):
    """Every variant in the fast tier: each is one fresh interpreter that stops at discovery (about
    0.3-0.5 s on an idle machine), and a late unknown-rule error is what a default run must catch."""
    init, prompts, says = VARIANTS[variant]
    pkg = _suite(tmp_path, init, prompts)
    p = _cli(str(pkg), tmp_path, "eval", "--help")
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    assert re.search("^drmas-bench: error: " + says, p.stderr), p.stderr


@pytest.mark.slow
def test_a_broken_suite_stops_an_eval_before_a_run_folder_exists(tmp_path):
    pkg = _suite(tmp_path, VARIANTS["malformed_rule"][0], None)
    p = _cli(str(pkg), tmp_path, "eval", "--model", "tiny-random", "--suite", "toy", "--out", "run")
    assert p.returncode == 2 and "FormatRule 'bad_rule'" in p.stderr and not (tmp_path / "run").exists()


def test_the_same_suite_with_only_the_parts_it_uses_is_accepted(tmp_path):
    """Prompt parts a workflow does not use are optional (docs/protocol.md: "some or all of")."""
    prompts = ('system: s\nroles:\n  a: "{{question}} {{team_context}}"\n'
               'parts:\n  context_entry: "{{agent}}: {{text}}"\n  context_sep: ""\n  context_empty: ""\n')
    pkg = _suite(tmp_path, WITH_TEMPLATES, prompts)
    p = _cli(str(pkg), tmp_path, "data", "list")
    assert p.returncode == 0, p.stderr


# ------------------------------------------------------------------ the checks themselves


def test_a_rules_fields_are_checked_where_it_is_declared():
    ok = FormatRule("fine", lambda t: [])
    assert check_rule(ok) is ok
    for kw, field in [({"reasons": ("a",)}, "reasons"), ({"parse": "x"}, "parse"), ({"agent_figures": 3}, "agent_figures"),
                      ({"reason_names": "no_tag"}, "reason_names"), ({"labels": {"a": 1}}, "labels")]:
        rule = FormatRule("r", **{"reasons": lambda t: [], **kw})
        with pytest.raises(DeclarationError, match=rf"^FormatRule 'r': {field}: expected "):
            check_rule(rule)
    assert isinstance(DeclarationError("x"), UserError) and isinstance(DeclarationError("x"), ValueError)


def test_a_workflow_with_templates_must_take_them_and_its_rules_must_be_its_agents():
    async def no_options(ep: Episode, rounds: int = 1) -> None: ...

    async def takes_any(ep: Episode, **options) -> None: ...

    with pytest.raises(DeclarationError, match="needs the option.s. prompts=None, protocol=None"):
        workflow("t_no_templates", agents=("a",), family="toy", placeholders=PLACEHOLDERS)(no_options)
    with pytest.raises(DeclarationError, match=r"rules\.b: not one of its agents \(a\)"):
        workflow("t_rules", agents=("a",), family="toy", rules={"b": lambda t: []})(no_options)
    from drmas_bench.workflows import WORKFLOWS

    get_workflow("toy")  # discovered: the registry is frozen, so a test's own entry goes in unfrozen
    with WORKFLOWS.unfrozen():
        try:
            workflow("t_any", agents=("a",), family="toy", placeholders=PLACEHOLDERS)(takes_any)  # **options take them
        finally:
            WORKFLOWS.unregister("t_any")


def test_a_workflows_prompts_need_only_the_parts_its_roles_can_use():
    assert proto.needed_parts("math_single") == []  # {{question}} only
    assert proto.needed_parts("math_refine") == ["context_entry", "context_sep", "context_empty"]
    assert proto.needed_parts("search_route") == ["context_entry", "context_sep", "context_empty",
                                                  "history_entry", "history_sep", "history_empty"]
    roles = {"solver": "{{question}}"}
    tpl = proto._merge(proto.Templates("math_single", "", {}, {}), {"roles": roles}, where="f.yaml", source="f",
                       complete=True)
    assert tpl.parts == {}
    with pytest.raises(UserError, match=r"^f\.yaml: parts\.context_entry: no template \(workflow math_refine uses it\)$"):
        proto._merge(proto.Templates("math_refine", "", {}, {}),
                     {"roles": {"solver": "{{question}}{{team_context}}", "verifier": "{{question}}{{team_context}}"}},
                     where="f.yaml", source="f", complete=True)
