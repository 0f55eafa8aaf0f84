"""Planning an assignment sweep (``drmas-bench sweep``, docs/sweep.md), pure: nothing is read or
loaded but an ``--assignments`` file. The candidates and listed assignments parsed and checked
against the workflow's agents, the three designs (every combination, a listed set, a
budget-bounded design), the run directory names and labels. ``sweep.py`` runs what is planned here.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from drmas_bench.agents.assign import assignment_name, short_model_name
from drmas_bench.types import UserError
from drmas_bench.yamlfile import read_yaml

DESIGNS = ("combinations", "listed", "budget")

@dataclass(frozen=True)
class Design:
    """The assignments of one sweep, planned before anything runs.

    ``assignments`` are complete (every agent of the workflow named), in the order they run; the
    baseline is among them (the first unless the user chose another that the design already held)."""

    workflow: str
    agents: tuple[str, ...]
    default_model: str | None  # the eval's --model: every agent a candidate or listed entry leaves out
    candidates: dict[str, list[str]]  # agent -> models, as given (or gathered from the listed set)
    kind: str  # one of DESIGNS
    assignments: list[dict[str, str]]
    baseline: dict[str, str]
    possible: int  # assignments the candidates allow (len(assignments) for a listed set)


def parse_candidates(items: Sequence[str]) -> dict[str, list[str]]:
    """``["solver=M1,M2", "verifier=M3"]`` -> ``{"solver": ["M1", "M2"], "verifier": ["M3"]}``; an
    agent given twice, a model listed twice for one agent or an empty list is one UserError."""
    out: dict[str, list[str]] = {}
    for item in items:
        agent, sep, models = str(item).partition("=")
        agent = agent.strip()
        names = [m.strip() for m in models.split(",") if m.strip()]
        if not sep or not agent or not names:
            raise UserError(f"--candidates expects AGENT=MODEL[,MODEL...], got {item!r}")
        if agent in out:
            raise UserError(f"--candidates: agent {agent!r} given twice (list all its models in one --candidates)")
        dup = sorted({m for m in names if names.count(m) > 1})
        if dup:
            raise UserError(f"--candidates {agent}: model(s) listed twice: {', '.join(dup)}")
        out[agent] = names
    return out


def parse_assignment(text: str, what: str = "--baseline") -> dict[str, str]:
    """``"verifier=M1,searcher=M2"`` -> ``{"verifier": "M1", "searcher": "M2"}`` (one model per agent)."""
    out: dict[str, str] = {}
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        agent, sep, model = item.partition("=")
        if not sep or not agent.strip() or not model.strip():
            raise UserError(f"{what} expects AGENT=MODEL[,AGENT=MODEL...], got {text!r}")
        if agent.strip() in out:
            raise UserError(f"{what}: agent {agent.strip()!r} given twice")
        out[agent.strip()] = model.strip()
    if not out:
        raise UserError(f"{what} expects AGENT=MODEL[,AGENT=MODEL...], got {text!r}")
    return out


def read_assignments(path: str | Path) -> list[dict[str, str]]:
    """``--assignments FILE``: a YAML or JSON list of mappings agent -> model (one line per mistake)."""

    data = read_yaml(path, "assignments file")
    if not isinstance(data, list) or not data:
        raise UserError(f"{path}: an assignments file is a non-empty list of {{agent: model}} mappings")
    out = []
    for i, entry in enumerate(data, 1):
        if not isinstance(entry, dict) or not entry:
            raise UserError(f"{path}: entry {i} is not a mapping of agent -> model")
        for a, m in entry.items():
            if not isinstance(a, str) or not isinstance(m, str) or not m.strip():
                raise UserError(f"{path}: entry {i}: {a!r}: the model must be a non-empty string")
        out.append({a: m.strip() for a, m in entry.items()})
    return out


def check_agents(names: Sequence[str], agents: Sequence[str], where: str, workflow: str) -> None:
    """Every name must be one of the workflow's agents."""
    for a in names:
        if a not in agents:
            raise UserError(f"{where}: unknown agent {a!r}; the {workflow} workflow's agents: {', '.join(agents)}")


def complete(partial: dict[str, str], agents: Sequence[str], default_model: str | None, where: str) -> dict[str, str]:
    """An assignment with every agent named, in the workflow's order: agents left out get
    ``default_model`` (the eval's --model); without one, a left-out agent is an error."""
    missing = [a for a in agents if a not in partial]
    if missing and not default_model:
        raise UserError(f"{where}: no model for agent(s) {', '.join(missing)}: name them, or pass --model M for "
                        "the agents a sweep does not vary")
    return {a: partial.get(a, default_model) for a in agents}  # type: ignore[misc]


def combinations(candidates: dict[str, list[str]], agents: Sequence[str], default_model: str | None) -> list[dict[str, str]]:
    """Every combination of the candidates (the product over the candidate agents in the
    workflow's order, the first candidate of each agent varying slowest); other agents keep
    ``default_model``. The first is each agent's first candidate."""
    varied = [a for a in agents if a in candidates]
    out = []
    for combo in itertools.product(*(candidates[a] for a in varied)):
        out.append(complete(dict(zip(varied, combo)), agents, default_model, "--candidates"))
    return out


def budget_order(candidates: dict[str, list[str]], agents: Sequence[str], default_model: str | None,
                 baseline: dict[str, str]) -> list[dict[str, str]]:
    """The order a budget keeps assignments in: the baseline, then every single-agent swap from it
    (the workflow's agent order, each agent's candidates in their order), then the remaining
    combinations in :func:`combinations`' order. The first K of it are what ``--max-assignments K``
    runs: the baseline is the reference of every difference, and a single swap is the cheapest
    question a sweep answers ("what does giving this one agent that model do?")."""
    singles = [{**baseline, a: m} for a in agents if a in candidates for m in candidates[a] if m != baseline[a]]
    return dedupe([baseline, *singles, *combinations(candidates, agents, default_model)])


def dedupe(assignments: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """The assignments in order, each once."""
    seen, out = set(), []
    for a in assignments:
        key = tuple(sorted(a.items()))
        if key not in seen:
            seen.add(key)
            out.append(a)
    return out


def design(workflow: str, agents: Sequence[str], default_model: str | None, *,
           candidates: dict[str, list[str]] | None = None, listed: list[dict[str, str]] | None = None,
           max_assignments: int | None = None, baseline: dict[str, str] | None = None,
           listed_from: str = "--assignments") -> Design:
    """The sweep's assignments (see :class:`Design`); every check is here, before anything loads.

    Exactly one of ``candidates`` (every combination, or with ``max_assignments`` the first K of
    :func:`budget_order`) and ``listed`` (the listed set, in its order). ``baseline`` (partial:
    completed with ``default_model``) defaults to the first assignment; one the design lacks is
    run first."""
    agents = tuple(agents)
    if (candidates is None) == (listed is None):
        raise UserError("a sweep needs --candidates AGENT=M1,M2 (repeatable) or --assignments FILE, not both")
    if max_assignments is not None and max_assignments < 1:
        raise UserError(f"--max-assignments must be at least 1, got {max_assignments}")
    if candidates is not None:
        if not candidates:
            raise UserError("--candidates: no agent given")
        check_agents(list(candidates), agents, "--candidates", workflow)
        full = combinations(candidates, agents, default_model)
        base = complete(baseline, agents, default_model, "--baseline") if baseline else full[0]
        if baseline:
            check_agents(list(baseline), agents, "--baseline", workflow)
        if max_assignments is not None:
            kind, chosen = "budget", budget_order(candidates, agents, default_model, base)[:max_assignments]
        else:
            kind, chosen = "combinations", full
        possible = len(full)
    else:
        assert listed is not None
        if max_assignments is not None:
            raise UserError("--max-assignments bounds the combinations of --candidates; an --assignments file is "
                            "the design itself (list fewer entries)")
        chosen = []
        for i, entry in enumerate(listed, 1):
            where = f"{listed_from} entry {i}"
            check_agents(list(entry), agents, where, workflow)
            chosen.append(complete(entry, agents, default_model, where))
        repeated = len(chosen) - len(dedupe(chosen))
        if repeated:
            raise UserError(f"{listed_from}: {repeated} entr{'y repeats' if repeated == 1 else 'ies repeat'} an "
                            "earlier one (once each)")
        if baseline:
            check_agents(list(baseline), agents, "--baseline", workflow)
        base = complete(baseline, agents, default_model, "--baseline") if baseline else chosen[0]
        kind, possible = "listed", len(chosen)
        named = {a for entry in listed for a in entry}  # the agents the file varies: their models, in order
        candidates = {a: list(dict.fromkeys(x[a] for x in chosen)) for a in agents if a in named}
    if base not in chosen:
        chosen = [base, *chosen]
    return Design(workflow, agents, default_model, dict(candidates), kind, chosen, base, possible)


def run_names(assignments: Sequence[dict[str, str]]) -> list[str]:
    """One run directory name per assignment (``agents.assign.assignment_name``, e.g.
    ``solver=tiny-random_verifier=tiny-b``), stable across invocations; names that collide (two
    models with the same folder name) get a short hash of the assignment."""

    base = [assignment_name(a) for a in assignments]
    counts = Counter(base)
    out = []
    for name, a in zip(base, assignments):
        if counts[name] > 1:
            name += "-" + hashlib.sha256(json.dumps(a, sort_keys=True).encode()).hexdigest()[:8]
        out.append(name)
    return out


def label(assignment: dict[str, str]) -> str:
    """A short readable label: ``solver=tiny-random, verifier=tiny-b``."""

    return ", ".join(f"{a}={short_model_name(m)}" for a, m in assignment.items())
