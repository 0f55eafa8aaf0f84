"""Multi-agent workflows as plain async code, one module each; see base.py for the `Episode` API."""

from drmas_bench.workflows import math, math_4agent, math_single, search, search_single, toy, toy_4agent, toy_fixer  # noqa: F401  (registers the built-ins)
from drmas_bench.workflows.base import WORKFLOWS, Episode, WorkflowSpec, get_workflow, workflow  # noqa: F401
