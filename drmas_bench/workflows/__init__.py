"""Multi-agent workflows as plain async code; see base.py for the `Episode` API and rules.py for the
format rules. The workflows themselves live in the suites (``drmas_bench/suites/<suite>/``), found
when a registry is first read (`registered_workflows`, `get_workflow`: `drmas_bench.suites.discovery`)."""

from drmas_bench.workflows.base import (  # noqa: F401
    WORKFLOWS,
    Episode,
    WorkflowSpec,
    find_workflow,
    get_workflow,
    registered_workflows,
    workflow,
    workflow_names,
)
from drmas_bench.workflows.rules import RULES, FormatRule, format_rule, registered_rules  # noqa: F401
