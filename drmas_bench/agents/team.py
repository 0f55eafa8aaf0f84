"""Teams: a workflow plus its logical agents, each served by a worker group (one model on one engine).

A team file (``--team FILE``)::

    workflow: search_route            # optional; the suite's default workflow otherwise
    sampling: {temperature: 0.6, top_p: 0.95, max_new_tokens: 800}   # optional, for every agent
    worker_groups:
      big:   {model: Qwen/Qwen2.5-7B-Instruct, engine: hf, price: qwen2.5-7b-instruct}
      small: {model: meta-llama/Llama-3.2-3B-Instruct, engine: openai, base_url: http://127.0.0.1:30000/v1}
    agents:
      verifier: big
      searcher: small
      answerer: {wg: small, sampling: {temperature: 0.3}}   # per-agent overrides
    prompts: prompts/search.yaml      # optional: role prompts (a file relative to this one, or inline);
                                      # replaces the packaged templates (docs/protocol.md)
    protocol: {max_prompt_tokens: 4096, truncate: left}   # optional: prompt-length limit and side

Shorthands: ``--model M`` puts every agent on one shared worker group; ``--model-for agent=M``
gives an agent its own model (agents naming the same model share one worker group); ``--model DIR``
where DIR holds a ``team.yaml`` (what the trainer writes) rebuilds the trained team, with model paths
relative to DIR; such a file also records the prompts (inline), protocol options and retriever
(kind and index identity) the team was trained with (a prompts path there must stay inside DIR).
Unknown keys and unknown agents are errors that name them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from drmas_bench.yamlfile import read_yaml

from drmas_bench.types import Sampling, UserError
from drmas_bench.workflows.protocol import ProtocolOptions

ENGINE_KINDS = ("hf", "openai", "sglang")
_WG_KEYS = {"model", "engine", "price", "base_url", "api_key_env", "options"}
_TEAM_KEYS = {"workflow", "sampling", "worker_groups", "agents", "workflow_options", "trained",
              "prompts", "protocol", "retriever"}
_SAMPLING_KEYS = {"temperature", "top_p", "max_new_tokens", "enable_thinking"}


@dataclass
class WorkerGroupSpec:
    name: str
    model: str  # alias, local path or hub id
    engine: str = "hf"
    price: str | None = None  # key in the price sheet (default: the model's name)
    base_url: str | None = None  # openai engine
    api_key_env: str | None = None  # openai engine: env var holding the key
    options: dict[str, Any] = field(default_factory=dict)  # engine options (max_batch, dtype, device, ...)

    @property
    def price_key(self) -> str:
        return self.price or Path(self.model.rstrip("/")).name


@dataclass
class TeamSpec:
    workflow: str
    agents: dict[str, str]  # logical agent -> worker group name
    worker_groups: dict[str, WorkerGroupSpec]
    sampling: dict[str, Any] = field(default_factory=dict)  # team-wide overrides
    agent_sampling: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-agent overrides
    workflow_options: dict[str, Any] = field(default_factory=dict)
    prompts: dict[str, Any] | None = None  # prompt templates (a prompts-file mapping) replacing the packaged ones
    prompts_source: str | None = None  # where `prompts` came from (file or team file), for messages
    protocol: dict[str, Any] = field(default_factory=dict)  # protocol options (max_prompt_tokens, truncate)
    retriever: dict[str, Any] | None = None  # a trained team's retriever record: {kind, identity}

    def sampling_for(self, agent: str, defaults: Sampling) -> Sampling:
        d = asdict(defaults)
        d.update(self.sampling)
        d.update(self.agent_sampling.get(agent, {}))
        return Sampling(**d)

    def to_dict(self) -> dict[str, Any]:
        return {
            "workflow": self.workflow,
            "agents": {a: ({"wg": wg, "sampling": self.agent_sampling[a]} if a in self.agent_sampling else wg)
                       for a, wg in self.agents.items()},
            "worker_groups": {n: {k: v for k, v in asdict(g).items() if k != "name" and v not in (None, {})}
                              for n, g in self.worker_groups.items()},
            "sampling": self.sampling,
            "workflow_options": self.workflow_options,
            **({"protocol": self.protocol} if self.protocol else {}),
        }


def _check_keys(d: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _sampling(d: Any, where: str) -> dict[str, Any]:
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise UserError(f"{where}: sampling must be a mapping")
    _check_keys(d, _SAMPLING_KEYS, where)
    if not isinstance(d.get("enable_thinking", False), bool):
        raise UserError(f"{where}: sampling enable_thinking must be true or false, got {d['enable_thinking']!r}")
    return dict(d)


def team_from_dict(d: dict[str, Any], agents_of_workflow: tuple[str, ...], default_workflow: str,
                   where: str = "team", base_dir: Path | None = None, inside: bool = False) -> TeamSpec:
    """Validate a team mapping against the workflow's agents."""
    if not isinstance(d, dict):
        raise UserError(f"{where}: a team file must be a mapping")
    _check_keys(d, _TEAM_KEYS, where)
    groups = {}
    for name, g in (d.get("worker_groups") or {}).items():
        if isinstance(g, str):
            g = {"model": g}
        if not isinstance(g, dict) or "model" not in g:
            raise UserError(f"{where}: worker group {name!r} needs a `model`")
        _check_keys(g, _WG_KEYS, f"{where}: worker group {name!r}")
        if g.get("engine", "hf") not in ENGINE_KINDS:
            raise UserError(f"{where}: worker group {name!r}: unknown engine {g['engine']!r}; known: {', '.join(ENGINE_KINDS)}")
        model = str(g["model"])
        if base_dir is not None and not Path(model).is_absolute() and (base_dir / model).exists():
            model = str(base_dir / model)
        groups[name] = WorkerGroupSpec(name=name, **{**g, "model": model})
    agents, agent_sampling = {}, {}
    for agent, v in (d.get("agents") or {}).items():
        if agent not in agents_of_workflow:
            raise UserError(f"{where}: unknown agent {agent!r} for this workflow; its agents: {', '.join(agents_of_workflow)}")
        if isinstance(v, dict):
            _check_keys(v, {"wg", "sampling"}, f"{where}: agent {agent!r}")
            wg = v.get("wg")
            agent_sampling[agent] = _sampling(v.get("sampling"), f"{where}: agent {agent!r}")
        else:
            wg = v
        if wg not in groups:
            raise UserError(f"{where}: agent {agent!r} uses unknown worker group {wg!r}; defined: {', '.join(groups) or 'none'}")
        agents[agent] = wg
    missing = [a for a in agents_of_workflow if a not in agents]
    if missing:
        raise UserError(f"{where}: no worker group for agent(s) {', '.join(missing)}")
    prompts, prompts_source = _prompts(d.get("prompts"), where, base_dir, inside)
    protocol = ProtocolOptions.from_dict(d.get("protocol"), where).to_dict()  # checked here, named by file
    retriever = d.get("retriever")
    if retriever is not None and not isinstance(retriever, dict):
        raise UserError(f"{where}: retriever: must be a mapping (kind, identity)")
    return TeamSpec(
        workflow=d.get("workflow") or default_workflow,
        agents=agents,
        worker_groups=groups,
        sampling=_sampling(d.get("sampling"), where),
        agent_sampling=agent_sampling,
        workflow_options=dict(d.get("workflow_options") or {}),
        prompts=prompts,
        prompts_source=prompts_source,
        protocol=protocol,
        retriever=dict(retriever) if retriever else None,
    )


def _prompts(v: Any, where: str, base_dir: Path | None, inside: bool) -> tuple[dict[str, Any] | None, str | None]:
    """A team file's ``prompts:``: an inline mapping, or a YAML file relative to the team file (which
    must stay inside the folder when `inside`, i.e. for a checkpoint's team.yaml)."""
    if v is None:
        return None, None
    if isinstance(v, dict):
        return v, where
    if not isinstance(v, str):
        raise UserError(f"{where}: prompts: must be a file name or a mapping")
    p = Path(v) if base_dir is None or Path(v).is_absolute() else base_dir / v
    if inside and base_dir is not None and not p.resolve().is_relative_to(base_dir.resolve()):
        raise UserError(f"{where}: prompts: {v!r} is outside the checkpoint folder")
    data = read_yaml(p, "prompts file")
    if not isinstance(data, dict):
        raise UserError(f"{p}: a prompts file must be a mapping with `roles:`")
    return data, str(p)


def _wg_name(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(model.rstrip("/")).name) or "model"


def build_team(workflow: str, agents: tuple[str, ...], *, model: str | None = None, team_file: str | None = None,
               model_for: list[str] | None = None, engine: str = "hf", base_url: str | None = None,
               engine_options: dict[str, Any] | None = None) -> TeamSpec:
    """Resolve the CLI's team flags into a TeamSpec (see the module docstring)."""
    engine_options = engine_options or {}
    from_checkpoint = False
    if not team_file and model and Path(model, "team.yaml").is_file():
        team_file = str(Path(model, "team.yaml"))  # a trained team's checkpoint folder
        from_checkpoint = True
    if team_file:
        p = Path(team_file)
        return team_from_dict(read_yaml(p, "team file"), agents, workflow, where=str(p), base_dir=p.parent,
                              inside=from_checkpoint)
    per_agent: dict[str, str] = {}
    for item in model_for or []:
        if "=" not in item:
            raise UserError(f"--model-for expects AGENT=MODEL, got {item!r}")
        a, m = item.split("=", 1)
        if a not in agents:
            raise UserError(f"--model-for: unknown agent {a!r}; this workflow's agents: {', '.join(agents)}")
        per_agent[a] = m
    if not model and len(per_agent) < len(agents):
        missing = [a for a in agents if a not in per_agent]
        raise UserError(f"no model for agent(s) {', '.join(missing)}: pass --model M (all agents) or --model-for AGENT=M")
    groups: dict[str, WorkerGroupSpec] = {}
    assignment = {}
    for a in agents:
        m = per_agent.get(a, model)
        name = "shared" if not per_agent else _wg_name(m)
        groups.setdefault(name, WorkerGroupSpec(name=name, model=m, engine=engine, base_url=base_url,
                                                options=dict(engine_options)))
        assignment[a] = name
    return TeamSpec(workflow=workflow, agents=assignment, worker_groups=groups)
