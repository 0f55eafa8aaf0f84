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
    limits: {max_usd: 5}              # optional: stop the run cleanly at $5 (needs --prices; flags win;
                                      # per agent: agents.NAME.limits; drmas_bench/limits.py)

Shorthands: ``--model M`` puts every agent on one shared worker group; ``--model-for agent=M``
gives an agent its own model (agents naming the same model share one worker group); ``--model DIR``
where DIR holds a ``team.yaml`` (what the trainer writes) rebuilds the trained team, with model paths
relative to DIR; such a file also records the prompts (inline), protocol options and retriever
(kind and index identity) the team was trained with (a prompts path there must stay inside DIR).
The file is parsed by :class:`TeamFileSchema` (pydantic, drmas_bench/schema.py; ``drmas-bench
config-schema team`` lists every key): unknown keys, wrong types and values out of range are one line
naming the file and the key path; unknown agents and worker groups are checked against the workflow
after that.

Trust (docs/security.md): a team file the user passes with ``--team`` is trusted like a flag. A
``team.yaml`` found inside a ``--model`` folder is data: it may not set anything that runs code or
sends a key somewhere (``TRUSTED_ONLY``: ``base_url``, ``api_key_env``, and the engine options
``trust_remote_code``, ``engine_args``, ``attn_implementation``, ``api_key``, ``base_url``); such a
file is refused with one line naming the flag that allows it. Its worker groups' ``options`` may be
only the engine options a checkpoint carries (``drmas_bench.engines.carried``: dtype, batch
invariance, ...), each with a valid value; eval uses them under the user's flags and says so in one
line (``engine options from the checkpoint: dtype=bfloat16``). ``api_key_env: NAME`` sends the key in
``$NAME`` (instead of ``$OPENAI_API_KEY``) to that group's ``base_url``.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from drmas_bench.agents.explicit import Explicit, apply_explicit
from drmas_bench.engines import DEFAULT_ENGINE, ENGINES, engine_class, traits
from drmas_bench.engines.carried import CARRIED, check_carried, describe
from drmas_bench.files import safe_name
from drmas_bench.schema import LimitsSchema, ModelOnEngine, SamplingSchema, Schema, parse, sampling_overrides
from drmas_bench.types import Sampling, UserError
from drmas_bench.workflows.protocol import ProtocolSchema
from drmas_bench.yamlfile import read_yaml

logger = logging.getLogger(__name__)

ENGINE_KINDS = tuple(ENGINES)  # the engine registry is the one list of backends
# what only the user's own flags or an explicit --team file may set -> the flag that allows it
TRUSTED_ONLY = {
    "base_url": "--team (or --base-url)",
    "api_key_env": "--team",
}
TRUSTED_ONLY_OPTIONS = {
    "trust_remote_code": "--trust-remote-code",
    "engine_args": "--team",
    "attn_implementation": "--team",
    "api_key": "--team",
    "base_url": "--team (or --base-url)",
}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class WorkerGroupSchema(ModelOnEngine):
    """One entry under a team file's ``worker_groups:`` (a bare string is the model)."""

    price: Optional[str] = Field(None, min_length=1, description="key in the price sheet (default: the model's name)")
    base_url: Optional[str] = Field(None, min_length=1, description="engine openai: the server's URL (http:// or https://)")
    api_key_env: Optional[str] = Field(
        None, min_length=1, description="engine openai: environment variable whose key is sent to this base_url")
    options: Optional[dict[str, Any]] = Field(
        None, description="engine options (max_batch, dtype, device, ...; each engine's own list: docs/engines.md)")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"model": v} if isinstance(v, str) else v

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {v!r}")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v and not _ENV_NAME.fullmatch(v):
            raise ValueError(f"must name an environment variable, got {v!r}")
        return v

    @model_validator(mode="after")
    def _openai_only(self) -> "WorkerGroupSchema":
        if (self.base_url or self.api_key_env) and not traits(self.engine).remote:
            raise ValueError(f"base_url and api_key_env are for engine: openai, not {self.engine}")
        return self


class AgentSchema(Schema):
    """One entry under a team file's ``agents:`` (a bare string is the worker group)."""

    wg: str = Field(min_length=1, description="the worker group serving this agent")
    sampling: Optional[SamplingSchema] = Field(None, description="this agent's sampling overrides")
    limits: Optional[LimitsSchema] = Field(None, description="a spending limit on this agent's own calls; not part of "
                                           "the run's identity (docs/eval.md)")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"wg": v} if isinstance(v, str) else v


class TeamFileSchema(Schema):
    """A team file (``--team FILE``, or the team.yaml the trainer writes into a checkpoint)."""

    workflow: Optional[str] = Field(None, min_length=1, description="workflow (default: the suite's)")
    sampling: Optional[SamplingSchema] = Field(None, description="sampling overrides for every agent")
    worker_groups: Optional[dict[str, WorkerGroupSchema]] = Field(
        None, description="name -> worker group: one model on one engine (a string: just the model)")
    agents: Optional[dict[str, AgentSchema]] = Field(
        None, description="each workflow agent -> its worker group name, or {wg, sampling}")
    workflow_options: Optional[dict[str, Any]] = Field(None, description="the workflow's options, e.g. {rounds: 2}")
    prompts: Any = Field(None, description="role prompts: a prompts file relative to this one, or inline (docs/protocol.md)")
    protocol: Optional[ProtocolSchema] = Field(None, description="prompt-length limit and truncation side")
    retriever: Optional[dict[str, Any]] = Field(None, description="written by the trainer: the retriever trained with {kind, identity}")
    trained: Optional[dict[str, Any]] = Field(None, description="written by the trainer: provenance of the checkpoint")
    cache: Optional[str] = Field(None, min_length=1, description="call cache directory, relative to this file (like --cache; "
                                 "docs/sweep.md); not part of the run's identity")
    limits: Optional[LimitsSchema] = Field(None, description="spending limits of the whole run (--max-usd / --max-tokens "
                                           "win); not part of the run's identity (docs/eval.md)")

    @field_validator("prompts")
    @classmethod
    def _prompts_kind(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, (str, dict)):
            raise ValueError("must be a file name or a mapping")
        return v


@dataclass
class WorkerGroupSpec:
    name: str
    model: str  # alias, local path or hub id
    engine: str = DEFAULT_ENGINE
    price: str | None = None  # key in the price sheet (default: the model's name)
    base_url: str | None = None  # openai engine
    api_key_env: str | None = None  # openai engine: env var holding the key
    options: dict[str, Any] = field(default_factory=dict)  # engine options (max_batch, dtype, device, ...)

    @property
    def price_key(self) -> str:
        return self.price or Path(self.model.rstrip("/")).name

    def engine_options(self) -> dict[str, Any]:
        """The keyword options this group's engine is made with: ``options`` plus ``base_url`` and,
        with ``api_key_env``, the key read from that variable (sent only to this ``base_url``)."""
        opts = dict(self.options)
        if self.base_url:
            opts["base_url"] = self.base_url
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise UserError(f"worker group {self.name!r}: api_key_env {self.api_key_env} is not set in the environment")
            opts["api_key"] = key
        return opts


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
    # the user's explicit sampling flags / EvalConfig values: win over the team file's (not in to_dict)
    flag_sampling: dict[str, Any] = field(default_factory=dict)
    cache: str | None = None  # the team file's call cache directory (not in to_dict: not part of the identity)
    # the team file's spending limits, run-wide and per agent (drmas_bench.limits; not in to_dict: not
    # part of the identity, so a re-run with another limit resumes the same run)
    limits: dict[str, Any] = field(default_factory=dict)
    agent_limits: dict[str, dict[str, Any]] = field(default_factory=dict)

    def sampling_for(self, agent: str, defaults: Sampling) -> Sampling:
        """An agent's sampling: ``defaults`` < team ``sampling:`` < the agent's ``sampling:`` < ``flag_sampling``."""
        d = asdict(defaults)
        d.update(self.sampling)
        d.update(self.agent_sampling.get(agent, {}))
        d.update(self.flag_sampling)
        return Sampling(**d)

    def to_dict(self) -> dict[str, Any]:
        return {
            "workflow": self.workflow,
            "agents": {a: ({"wg": wg, "sampling": self.agent_sampling[a]} if a in self.agent_sampling else wg)
                       for a, wg in self.agents.items()},
            "worker_groups": {n: _redacted({k: v for k, v in asdict(g).items() if k != "name" and v not in (None, {})})
                              for n, g in self.worker_groups.items()},
            "sampling": self.sampling,
            "workflow_options": self.workflow_options,
            **({"protocol": self.protocol} if self.protocol else {}),
        }


def _redacted(g: dict[str, Any]) -> dict[str, Any]:
    """A worker group for config.yaml: a literal ``options.api_key`` is never written to disk."""
    if "api_key" in (g.get("options") or {}):
        g = {**g, "options": {**g["options"], "api_key": "<redacted>"}}
    return g


def validate_sampling(d: dict[str, Any], where: str) -> dict[str, Any]:
    """Check sampling values (flags and EvalConfig) with the team files' :class:`SamplingSchema`.
    Returns ``d``; a bad value is one UserError naming ``where`` and the key."""
    sampling_overrides(d, where)
    return d


def check_untrusted(team: "TeamSpec", where: str, trust_remote_code: bool = False) -> None:
    """Refuse a team read from inside a model/checkpoint folder that asks for a trusted-only key
    (see ``TRUSTED_ONLY`` / ``TRUSTED_ONLY_OPTIONS``); one line naming the flag that allows it."""
    if team.cache:  # a folder of someone else's choosing written to: the user names it
        raise UserError(f"{where}: sets cache, which a team.yaml inside a model folder may not set; pass --cache DIR "
                        "yourself, or that team file with --team if you trust it")
    for name, g in team.worker_groups.items():
        if "://" in str(g.model):  # an fsspec URL would be fetched with the user's credentials from wherever it says
            raise UserError(f"{where}: worker group {name!r} names its model by URL ({g.model}), which a team.yaml "
                            "inside a model folder may not do; pass that team file explicitly with --team if you trust it")
        for key, flag in TRUSTED_ONLY.items():
            if getattr(g, key):
                raise UserError(f"{where}: worker group {name!r} sets {key}, which a team.yaml inside a model folder "
                                f"may not set; pass that team file explicitly with {flag} if you trust it")
        for key, flag in TRUSTED_ONLY_OPTIONS.items():
            if key in g.options and g.options[key] not in (None, False):
                if key == "trust_remote_code" and trust_remote_code:
                    continue
                raise UserError(f"{where}: worker group {name!r} sets options.{key}, which a team.yaml inside a "
                                f"model folder may not set; pass {flag} if you trust it")


def check_engine_options(team: "TeamSpec") -> None:
    """Every worker group's engine options are known to its engine and its ``api_key_env`` is set
    (before anything loads)."""

    for name, g in team.worker_groups.items():
        g.engine_options()  # api_key_env must name a variable that is set
        opts = dict(g.options, **({"base_url": g.base_url} if g.base_url else {}))
        valid = {f.name for f in fields(engine_class(g.engine).Options)}
        unknown = sorted(k for k in opts if k.replace("-", "_") not in valid)
        if unknown:
            raise UserError(f"worker group {name!r}: option(s) {', '.join(unknown)} not known to the {g.engine} engine; "
                            f"its options: {', '.join(sorted(valid))}")


def team_from_dict(d: dict[str, Any], agents_of_workflow: tuple[str, ...], default_workflow: str,
                   where: str = "team", base_dir: Path | None = None, inside: bool = False) -> TeamSpec:
    """Validate a team mapping (:class:`TeamFileSchema`) against the workflow's agents."""
    if not isinstance(d, dict):
        raise UserError(f"{where}: a team file must be a mapping")
    f = parse(TeamFileSchema, d, where)
    groups = {}
    for name, g in (f.worker_groups or {}).items():
        safe_name(name, f"{where}: worker group")
        model = g.model
        if base_dir is not None and not Path(model).is_absolute() and (base_dir / model).exists():
            model = str(base_dir / model)
        groups[name] = WorkerGroupSpec(name=name, model=model, engine=g.engine, price=g.price or _base_price(f.trained, name),
                                       base_url=g.base_url, api_key_env=g.api_key_env, options=dict(g.options or {}))
    agents, agent_sampling, agent_limits = {}, {}, {}
    for agent, v in (f.agents or {}).items():
        if agent not in agents_of_workflow:
            raise UserError(f"{where}: agents.{agent}: unknown agent {agent!r} for this workflow; "
                            f"its agents: {', '.join(agents_of_workflow)}")
        if v.sampling is not None:
            agent_sampling[agent] = v.sampling.model_dump(exclude_unset=True)
        if v.limits is not None and v.limits.model_dump(exclude_none=True):
            agent_limits[agent] = v.limits.model_dump(exclude_none=True)
        if v.wg not in groups:
            raise UserError(f"{where}: agents.{agent}: agent {agent!r} uses unknown worker group {v.wg!r}; "
                            f"defined: {', '.join(groups) or 'none'}")
        agents[agent] = v.wg
    missing = [a for a in agents_of_workflow if a not in agents]
    if missing:
        raise UserError(f"{where}: agents: no worker group for agent(s) {', '.join(missing)}")
    prompts, prompts_source = _prompts(f.prompts, where, base_dir, inside)
    return TeamSpec(
        workflow=f.workflow or default_workflow,
        agents=agents,
        worker_groups=groups,
        sampling=f.sampling.model_dump(exclude_unset=True) if f.sampling else {},
        agent_sampling=agent_sampling,
        workflow_options=dict(f.workflow_options or {}),
        prompts=prompts,
        prompts_source=prompts_source,
        protocol=f.protocol.model_dump(exclude_none=True) if f.protocol else {},
        retriever=dict(f.retriever) if f.retriever else None,
        cache=(f.cache if base_dir is None or Path(f.cache).expanduser().is_absolute() else str(base_dir / f.cache))
        if f.cache else None,
        limits=f.limits.model_dump(exclude_none=True) if f.limits else {},
        agent_limits=agent_limits,
    )


def _base_price(trained: dict[str, Any] | None, group: str) -> str | None:
    """A trained checkpoint's group is priced as the base model it was trained from (the trainer
    records ``trained.base_models``), not by its folder name (``models/solver`` -> ``solver``)."""
    base = ((trained or {}).get("base_models") or {}).get(group)
    return Path(str(base).rstrip("/")).name if isinstance(base, str) and base else None


def _prompts(v: Any, where: str, base_dir: Path | None, inside: bool) -> tuple[dict[str, Any] | None, str | None]:
    """A team file's ``prompts:``: an inline mapping, or a YAML file relative to the team file (which
    must stay inside the folder when `inside`, i.e. for a checkpoint's team.yaml)."""
    if v is None:
        return None, None
    if isinstance(v, dict):
        return v, where
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
               model_for: list[str] | None = None, engine: str = DEFAULT_ENGINE, base_url: str | None = None,
               engine_options: dict[str, Any] | None = None, trust_remote_code: bool = False,
               explicit: Explicit | None = None, team_doc: Any = None) -> TeamSpec:
    """Resolve the CLI's team flags into a TeamSpec (see the module docstring), built once: the
    team file or shorthand flags first, then the user's ``explicit`` values over them
    (:mod:`drmas_bench.agents.explicit`); engine options are checked against each engine's options
    before anything loads, and nothing edits the returned team afterwards.

    ``trust_remote_code``: the user's ``--trust-remote-code``: set on every hf/sglang group, and
    allowed in a ``team.yaml`` found inside ``model`` (which is otherwise untrusted data).
    ``team_doc``: the team file's content when the caller has read it already (``plan.resolve``
    reads it once, for its ``workflow:``); None: read here."""
    team = _build_team(workflow, agents, model=model, team_file=team_file, model_for=model_for, engine=engine,
                       base_url=base_url, engine_options=engine_options or {}, trust_remote_code=trust_remote_code,
                       team_doc=team_doc)
    if trust_remote_code:
        for g in team.worker_groups.values():
            if not traits(g.engine).remote:  # a model loaded here: its folder's code may run
                g.options["trust_remote_code"] = True
    check_engine_options(team)  # the file's own options, before explicit ones may drop them
    recorded = {n: {k: v for k, v in g.options.items() if k in CARRIED} for n, g in team.worker_groups.items()}
    if explicit is not None:
        team = apply_explicit(team, explicit, base_url, trust_remote_code)
        if explicit.changes_groups:
            check_engine_options(team)
    if not team_file and model and Path(model, "team.yaml").is_file():  # a checkpoint: say what it carried
        logger.info(f"[eval] {describe(recorded, {n: g.options for n, g in team.worker_groups.items()})}")
    return team


def _build_team(workflow: str, agents: tuple[str, ...], *, model: str | None, team_file: str | None,
                model_for: list[str] | None, engine: str, base_url: str | None, engine_options: dict[str, Any],
                trust_remote_code: bool, team_doc: Any = None) -> TeamSpec:
    if not team_file and model and Path(model, "team.yaml").is_file():
        p = Path(model, "team.yaml")  # a trained team's checkpoint folder: its team.yaml is data
        doc = team_doc if team_doc is not None else read_yaml(p, "team file")
        team = team_from_dict(doc, agents, workflow, where=str(p), base_dir=p.parent,
                             inside=True)
        check_untrusted(team, str(p), trust_remote_code=trust_remote_code)
        check_carried(team.worker_groups, str(p))  # engine options: only those a checkpoint carries, valid
        if base_url:  # the user's own --base-url serves the checkpoint's openai groups
            for g in team.worker_groups.values():
                if traits(g.engine).remote and not g.base_url:
                    g.base_url = base_url
        return team
    if team_file:
        p = Path(team_file)
        doc = team_doc if team_doc is not None else read_yaml(p, "team file")
        return team_from_dict(doc, agents, workflow, where=str(p), base_dir=p.parent)
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
