"""The user's explicit values over a team: computed by the plan from the flags, applied once while
:func:`drmas_bench.agents.team.build_team` builds the team, so no one edits a built team afterwards.

Precedence (``drmas_bench.api``'s docstring): a team file's worker groups < these values. Each step
is a pure function from worker groups to new worker groups, in the order the flags always applied:
models on the Ray nodes, ``--engine``, ``--max-batch``, ``--engine-args``. Engine knowledge is asked
of ``drmas_bench.engines`` (traits, option names), never by an engine's name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from drmas_bench.checkpoints.copies import model_on_nodes
from drmas_bench.engines import traits
from drmas_bench.engines.hosting import option_names
from drmas_bench.types import UserError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Explicit:
    """What the user set explicitly (``None`` / empty: not set, the team file's value stays)."""

    workflow: str | None = None  # the workflow chosen for the run (over a team file's ``workflow:``)
    engine: str | None = None  # --engine: every worker group runs on it
    tokenizer: str | None = None  # --tokenizer: for groups moved to a remote engine
    max_batch: int | None = None  # --max-batch: set where the engine has it
    engine_args: dict[str, Any] = field(default_factory=dict)  # --engine-args: any engine option
    models_at: str | None = None  # a Ray eval of checkpoint step URL: the nodes fetch each local model under it
    sampling: dict[str, Any] = field(default_factory=dict)  # explicit sampling values (win per agent too)

    @property
    def changes_groups(self) -> bool:
        return bool(self.engine or self.max_batch is not None or self.engine_args or self.models_at)


def models_on_nodes(groups: dict, step_url: str) -> dict:
    """Each local worker group's model as its URL under checkpoint ``step_url``
    (checkpoints.copies.model_on_nodes), for Ray actors to fetch on their own nodes."""

    return {n: g if traits(g.engine).remote else replace(g, model=model_on_nodes(str(g.model), step_url))
            for n, g in groups.items()}


def on_engine(g, engine: str, base_url: str | None, tokenizer: str | None, trust_remote_code: bool):
    """Worker group ``g`` moved to an explicit ``engine``: options that engine lacks are dropped (said
    on stderr); a group served over HTTP (``base_url`` / ``api_key_env``) cannot move to an in-process
    engine; a group moved to a remote engine gets ``base_url`` / ``tokenizer``."""
    if g.engine == engine:
        return g
    names = option_names(engine)
    if not traits(engine).remote and (g.base_url or g.api_key_env):
        raise UserError(f"--engine {engine}: worker group {g.name!r} is an openai group with base_url / api_key_env; "
                        f"it cannot run in-process (leave out --engine, or edit the team file)")
    dropped = sorted(k for k in g.options if k.replace("-", "_") not in names)
    if dropped:
        logger.info(f"[eval] --engine {engine}: worker group {g.name!r} leaves its {g.engine} option(s) "
                    f"{', '.join(dropped)} behind")
    options = {k: v for k, v in g.options.items() if k.replace("-", "_") in names}
    url = g.base_url
    if traits(engine).remote:
        url = g.base_url or base_url
        if tokenizer:
            options["tokenizer"] = tokenizer
    elif trust_remote_code:
        options["trust_remote_code"] = True
    return replace(g, engine=engine, base_url=url, options=options)


def with_max_batch(g, max_batch: int):
    """``--max-batch``: a generic option, set where the group's engine has it (like fit_options)."""
    if "max_batch" not in option_names(g.engine):
        return g
    return replace(g, options={**g.options, "max_batch": max_batch})


def with_engine_args(groups: dict, engine_args: dict[str, Any]) -> dict:
    """Each explicit engine option set on every worker group whose engine has it (over a team file's
    ``options:``); an option that no group's engine has is one UserError."""
    options = {n: dict(g.options) for n, g in groups.items()}
    for key, value in engine_args.items():
        k = key.replace("-", "_")
        hit = False
        for n, g in groups.items():
            if k in option_names(g.engine):
                options[n].pop(key, None)
                options[n][k] = value
                hit = True
        if not hit:
            engines = sorted({g.engine for g in groups.values()})
            known = sorted(set().union(*(option_names(e) for e in engines)))
            raise UserError(f"--engine-args {key}: not an option of the {'/'.join(engines)} engine; "
                            f"options: {', '.join(known)}")
    return {n: replace(g, options=options[n]) for n, g in groups.items()}


def apply_explicit(team, explicit: Explicit, base_url: str | None, trust_remote_code: bool):
    """A new team: ``team`` (as its file or shorthand flags give it) with ``explicit`` over it."""
    groups = dict(team.worker_groups)
    if explicit.models_at:
        groups = models_on_nodes(groups, explicit.models_at)
    if explicit.engine:
        groups = {n: on_engine(g, explicit.engine, base_url, explicit.tokenizer, trust_remote_code)
                  for n, g in groups.items()}
    if explicit.max_batch is not None:
        groups = {n: with_max_batch(g, explicit.max_batch) for n, g in groups.items()}
    if explicit.engine_args:
        groups = with_engine_args(groups, explicit.engine_args)
    return replace(team, workflow=explicit.workflow or team.workflow, worker_groups=groups,
                   flag_sampling=dict(explicit.sampling))
