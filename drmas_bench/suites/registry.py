"""The suites' own registry: what a suite is (``Suite``), the ``SUITES`` registry its folder fills
with ``register_suite``, and the lookups ``get_suite`` / ``suite_names``, which discover the suites
first (``suites.discovery``). A suite's folder declares its ``Suite`` (through the author module
``drmas_bench.suite``) before its benchmarks (``benchmarks.base.register``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from drmas_bench.registry import Registry
from drmas_bench.suites.discovery import discover
from drmas_bench.types import UserError


@dataclass(frozen=True)
class Suite:
    """A benchmark suite, declared in its folder (``drmas_bench/suites/<suite>/benchmarks.py``, or a
    package of your own: docs/architecture.md), before its benchmarks: what a run of its benchmarks
    uses unless a flag or a team file says otherwise."""

    name: str  # used on the command line (``--suite``)
    workflow: str  # the default workflow, a key of drmas_bench.workflows.WORKFLOWS
    max_new_tokens: int  # the default generation limit of each call
    family: str  # the grading family of its benchmarks (a key of grading.families.FAMILIES)
    # {agent: the name the reference gives it}: how a team context names the agent (``{{agent_name}}``)
    # and the agent id in a reference-trained (verl) checkpoint; a workflow of this suite whose
    # agents all have one is a team such a checkpoint may hold (needs.reference_roster)
    agent_names: dict[str, str] = field(default_factory=dict, hash=False)


SUITES: Registry[Suite] = Registry("suite", filled_by_suites=True)


def register_suite(s: Suite) -> Suite:
    """Register suite ``s`` (its ``benchmarks.py`` does, before its benchmarks)."""
    SUITES.register(s.name, s)
    return s


def suite_names() -> tuple[str, ...]:
    """The registered suites' names in name order (``--suite``'s choices); the suites are discovered
    first (drmas_bench/suites/<suite>/ and the outside ones: ``drmas_bench.suites.discovery``)."""
    discover()
    return tuple(sorted(SUITES))


def get_suite(name: str) -> Suite:
    """The suite ``name``; an unknown name is one UserError listing the known ones."""
    discover()
    if name not in SUITES:
        raise UserError(f"unknown suite {name!r}; known: {', '.join(suite_names())}")
    return SUITES.get(name)
