"""What an evaluation needs on this machine before it runs, found without fetching anything.

Two places a configuration names something that may not be here yet (``drmas_bench.preparation``
has the steps and what planning may read):

- ``--model``: a checkpoint URL (a copy in the cache, ``checkpoints.copies.plan_local_copy``) or a
  reference-trainer checkpoint (merged into a team folder in the cache, ``checkpoints.verl.plan_merge``;
  the suite inferred from its agents). :func:`locate` says where the folder the run reads will be
  and which steps fill it.
- each local worker group's model: an alias to build, or a model folder under a URL to copy
  (:func:`model_steps`). With a Ray pool the nodes fetch and build what they load, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from drmas_bench.checkpoints.copies import plan_local_copy, plan_model_copy
from drmas_bench.checkpoints.layout import is_url
from drmas_bench.checkpoints.verl import Roster, is_reference_checkpoint, plan_merge
from drmas_bench.engines import traits
from drmas_bench.models.names import ALIASES, plan_alias
from drmas_bench.preparation import Step, pending
from drmas_bench.suites.registry import get_suite, suite_names
from drmas_bench.workflows import get_workflow, workflow_names


@dataclass(frozen=True)
class Pending:
    """What ``plan()`` returns while the configuration needs something this machine does not hold
    yet: the configuration and the steps found so far. ``api.prepare`` performs them and plans again
    (then the plan is complete); ``drmas-bench models prepare`` does the same ahead of time."""

    cfg: Any  # the plan.EvalConfig as given (plan imports this module)
    steps: tuple[Step, ...]  # every step found so far, done or not (``todo``: the ones left)
    started: str  # when planning began (UTC), kept for the run's provenance
    t0: float  # time.monotonic() when planning began

    @property
    def todo(self) -> list[Step]:
        return pending(self.steps)

    def describe(self) -> str:
        """One line per step to do: what will be fetched, merged or built, from where, to where, how big."""
        return "\n".join(s.describe() for s in self.todo)


@dataclass(frozen=True)
class Located:
    """A configuration with ``model`` pointing at the local folder the run reads (existing or not yet)."""

    cfg: Any  # the plan.EvalConfig with model: the local folder; suite: inferred from a reference checkpoint's agents
    step_url: str | None  # a checkpoint URL's step (ROOT/latest read as ROOT/step_K); None: a local model
    steps: tuple[Step, ...]  # what fills the folder (each done or not)

    @property
    def ready(self) -> bool:
        """The folder is there: nothing is left to fetch or merge."""
        return not pending(self.steps)


def reference_roster() -> Roster:
    """What the suites say of the reference trainer's agent ids (``Suite.agent_names``), for reading
    its checkpoints as a team (``checkpoints.verl``): workflow -> {reference id: agent} for each
    registered workflow whose suite names all its agents, its suite (the one grading with the
    workflow's family), and the suites' default workflows."""
    suite_of: dict[str, str | None] = {}
    teams: dict[str, dict[str, str]] = {}
    for name in workflow_names():
        wf = get_workflow(name)
        suite = suite_of[name] = next((s for s in suite_names() if get_suite(s).family == wf.family), None)
        names = get_suite(suite).agent_names if suite else {}
        if names and all(a in names for a in wf.agents):
            teams[name] = {names[a]: a for a in wf.agents}
    return Roster(teams, suite_of, frozenset(get_suite(s).workflow for s in suite_names()))


def locate(cfg: Any) -> Located:
    """Where ``cfg.model``'s checkpoint will be read from, and the steps that put it there."""
    steps: list[Step] = []
    model, step_url, copy = plan_local_copy(cfg.model, on_nodes=cfg.pool == "ray") if cfg.model else (None, None, None)
    if copy is not None:
        steps.append(copy)
    suite = cfg.suite
    if model and not steps and Path(model).is_dir() and is_reference_checkpoint(model):
        merge, ref = plan_merge(model, reference_roster(), workflow=cfg.workflow, suite=cfg.suite)
        steps.append(merge)
        model = str(merge.dest)
        suite = cfg.suite or (None if cfg.benchmarks else ref.suite)
    return Located(replace(cfg, model=model, suite=suite), step_url, tuple(steps))


def model_steps(team: Any, on_nodes: bool) -> list[Step]:
    """The steps that put each local worker group's model here: an alias not built yet, a model
    folder under a URL. Remote groups are their server's; with a Ray pool (``on_nodes``) the nodes
    build and fetch what they load."""
    steps: list[Step] = []
    if on_nodes:
        return steps
    for g in team.worker_groups.values():
        model = str(g.model)
        if traits(g.engine).remote:
            continue
        if is_url(model):
            steps.append(plan_model_copy(model))
        elif model in ALIASES:
            steps.append(plan_alias(model))
    return steps
