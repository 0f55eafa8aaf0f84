"""Heterogeneous teams: every assignment of models to a workflow's agents
(`enumerate_assignments`) and one team file per assignment (`write_assignment_teams`, the `--team`
format of drmas_bench.agents.team), as `drmas-bench cost --assign` writes them.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import yaml

from drmas_bench.engines import DEFAULT_ENGINE
from drmas_bench.types import UserError
from drmas_bench.workflows import registered_workflows


def short_model_name(model: str) -> str:
    """A model's display name: the last part of a path or hub id (``Qwen/Qwen3-8B`` -> ``Qwen3-8B``)."""
    return Path(str(model).rstrip("/")).name or str(model)


def enumerate_assignments(agents: Sequence[str], models: Sequence[str]) -> list[dict[str, str]]:
    """Every assignment of `models` to `agents` (len(models) ** len(agents) of them), as dicts
    agent -> model in the agents' order; the first gives every agent models[0]."""
    agents, models = list(agents), list(models)
    if not agents or not models:
        raise UserError("enumerate_assignments needs at least one agent and one model")
    for what, xs in (("agent", agents), ("model", models)):
        dup = [x for x, k in Counter(xs).items() if k > 1]
        if dup:
            raise UserError(f"{what} named twice: {', '.join(dup)}")
    return [dict(zip(agents, combo)) for combo in itertools.product(models, repeat=len(agents))]


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", short_model_name(s)).strip("-") or "model"


def assignment_team(assignment: dict[str, str], workflow: str | None = None, engine: str = DEFAULT_ENGINE,
                    base_url: str | None = None) -> dict[str, Any]:
    """A team mapping (the `--team` file format) for one assignment: one worker group per distinct
    model, agents on the same model share it."""
    groups: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    for model in dict.fromkeys(assignment.values()):
        name = _slug(model)
        while name in groups:
            name += "_"
        g: dict[str, Any] = {"model": model, "engine": engine}
        if base_url:
            g["base_url"] = base_url
        groups[name] = g
        names[model] = name
    team: dict[str, Any] = {}
    if workflow:
        team["workflow"] = workflow
    team["worker_groups"] = groups
    team["agents"] = {a: names[m] for a, m in assignment.items()}
    return team


def assignment_name(assignment: dict[str, str]) -> str:
    """A file-name-safe label, e.g. `verifier=qwen2.5-7b_searcher=llama-3.2-3b`."""
    return "_".join(f"{a}={_slug(m)}" for a, m in assignment.items())


def workflow_for_agents(agents: Sequence[str]) -> str | None:
    """The registered workflow whose agents are exactly `agents` (any order), or None."""

    for name, spec in registered_workflows().items():
        if set(spec.agents) == set(agents):
            return name
    return None


def write_assignment_teams(agents: Sequence[str], models: Sequence[str], out_dir: str | Path,
                           workflow: str | None = None, engine: str = DEFAULT_ENGINE, base_url: str | None = None) -> list[Path]:
    """Write one team YAML per assignment into `out_dir`; returns the files in enumeration order."""

    if workflow is not None:
        workflows = registered_workflows()
        if workflow not in workflows:
            raise UserError(f"unknown workflow {workflow!r}; known: {', '.join(sorted(workflows))}")
        want = set(workflows[workflow].agents)
        if set(agents) != want:
            raise UserError(f"--assign names {', '.join(agents)} but workflow {workflow} has agents "
                            f"{', '.join(workflows[workflow].agents)}")
    else:
        workflow = workflow_for_agents(agents)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for asg in enumerate_assignments(agents, models):
        team = assignment_team(asg, workflow, engine, base_url)
        f = out / f"{assignment_name(asg)}.yaml"
        header = "# written by `drmas-bench cost --assign`: " + ", ".join(f"{a} -> {m}" for a, m in asg.items()) + "\n"
        f.write_text(header + yaml.safe_dump(team, sort_keys=False), encoding="utf-8")
        files.append(f)
    return files
