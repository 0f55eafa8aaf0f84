"""``plan(cfg)``: an EvalConfig checked and resolved into everything a run needs, before anything
loads and before the run directory is touched (a mistake leaves no config behind).

The precedence rule (``drmas_bench.api``'s docstring): built-in defaults < team file / a checkpoint's
team.yaml < explicit values. In order: the numeric ranges and choices (:func:`validate_config`), where
``--model``'s checkpoint will be read (``needs.locate``: a checkpoint URL's copy, a reference-trainer
(verl) checkpoint's merged team folder, its suite inferred from its agents), the benchmarks, the
workflow (chosen before the team is validated), the team with its engines and options
(:func:`resolve`), the prompts and prompt limit (:func:`resolve_protocol`), the tasks, the
retriever's spec, what the local models need (``needs.model_steps``: an alias to build, a model URL
to copy), each local model checked once (incomplete checkpoint, broken tokenizer) and identified,
then the run's identity, provenance and default name. Nothing is opened, fetched, merged or built:
what must be is returned as a ``needs.Pending`` of steps (``drmas_bench.preparation``), which
``api.run`` performs before it plans again; the call cache, the retriever and the engines are ``api.run``'s.
Engine knowledge is asked of ``drmas_bench.engines`` (traits, options), never by an engine's name.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drmas_bench.agents.explicit import Explicit
from drmas_bench.agents.team import build_team, validate_sampling
from drmas_bench.benchmarks import load_tasks, resolve_data_dir, select_benchmarks
from drmas_bench.benchmarks.base import Benchmark
from drmas_bench.checkpoints.copies import plan_model_copy, refuse_incomplete
from drmas_bench.checkpoints.layout import is_url
from drmas_bench.engines import DEFAULT_ENGINE, traits
from drmas_bench.engines.hosting import fit_options, option_names
from drmas_bench.eval_config import (  # noqa: F401 - re-exported: callers import them from here
    DEFAULT_MAX_BATCH,
    RANGED_FIELDS,
    SAMPLING_DEFAULTS,
    EvalConfig,
    choices,
    flag,
    parse_engine_args,
    validate_config,
)
from drmas_bench.files import fingerprint
from drmas_bench.limits import Limits, resolve_limits
from drmas_bench.models import resolve_model
from drmas_bench.models.adapter_layout import tokenizer_source  # an adapter folder without one: its base's
from drmas_bench.models.loading import check_tokenizer_dir
from drmas_bench.needs import Located, Pending, locate, model_steps
from drmas_bench.preparation import Step, pending
from drmas_bench.pricing import PriceSheet, team_prices
from drmas_bench.provenance import (
    collect,
    data_identity,
    grader_record,
    models_identity,
    redact_argv,
    utc_now,
    workflow_record,
)
from drmas_bench.reproducibility import identity_team
from drmas_bench.retrievers import default_spec, note_trained_retriever
from drmas_bench.suites.registry import get_suite
from drmas_bench.types import Sampling, Task, UserError
from drmas_bench.workflows import get_workflow
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.base import WorkflowSpec, check_workflow_options
from drmas_bench.yamlfile import read_yaml

if TYPE_CHECKING:  # the annotations only: both modules are imported where a plan opens them
    from drmas_bench.agents.team import TeamSpec
    
logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class Resolved:
    """An EvalConfig resolved against the registries and the team file (nothing loaded yet)."""

    suite: str
    benches: list[Benchmark]
    wf: WorkflowSpec
    team: TeamSpec
    sampling: Sampling  # the defaults with the explicit values applied (team file in between per agent)
    checkpoint: str | None = None  # the checkpoint folder ``model`` named, already refused if incomplete
    prepared: tuple[Step, ...] = ()  # what was fetched, merged or built for it (drmas_bench.preparation), all done


def team_file(cfg: EvalConfig) -> tuple[Path | None, Any]:
    """The team file ``cfg`` names (``team``, else ``model``'s checkpoint team.yaml) and its content,
    read once here (``build_team`` is handed the content); (path, None) when it is not a file (the
    team validation names the problem), (None, None) when ``cfg`` names none."""

    path = Path(cfg.team) if cfg.team else (Path(cfg.model, "team.yaml") if cfg.model else None)
    if path is None or not path.is_file():
        return path, None
    return path, read_yaml(path, "team file")


def team_file_workflow(doc: Any) -> str | None:
    """The ``workflow:`` a team file's content names, if any."""
    wf = doc.get("workflow") if isinstance(doc, dict) else None
    return wf if isinstance(wf, str) and wf else None


def _model_for_list(v: list[str] | dict[str, str] | None) -> list[str] | None:
    if isinstance(v, dict):
        return [f"{a}={m}" for a, m in v.items()]
    if isinstance(v, str):
        return [v]
    return list(v) if v else None


def resolve(cfg: EvalConfig) -> Resolved:
    """Benchmarks, workflow (chosen before the team is validated), team and sampling for ``cfg``,
    whose checkpoint (a URL's copy, a reference checkpoint's merge) must be in the cache already:
    else one line saying how to prepare it (``plan`` returns the steps instead)."""
    located = locate(cfg)
    if not located.ready:
        todo = pending(located.steps)[0]
        raise UserError(f"{todo.source} is not prepared yet ({todo.action}): run `drmas-bench models prepare "
                        f"{todo.source}`, or evaluate it (the run prepares it)")
    return resolve_located(located)


def resolve_located(located: Located) -> Resolved:
    """:func:`resolve` of a configuration whose ``model`` is the local folder :func:`needs.locate` found."""

    cfg, step_url, checkpoint = located.cfg, located.step_url, None
    if cfg.model and Path(cfg.model).is_dir():
        refuse_incomplete(str(cfg.model))  # before its team.yaml is read (check_team_models skips it)
        checkpoint = str(cfg.model)
    benches = select_benchmarks(cfg.suite, cfg.benchmarks)
    suites = {b.suite for b in benches}
    if len(suites) > 1:
        raise UserError(f"one suite per run; the selection mixes {', '.join(sorted(suites))}")
    suite = suites.pop()
    engine = cfg.engine or DEFAULT_ENGINE
    if cfg.tokenizer and "tokenizer" not in option_names(engine):
        raise UserError("--tokenizer is for --engine openai (the other engines load the model's own tokenizer)")
    if not (cfg.model or cfg.model_for or cfg.team):
        raise UserError("choose a team: --model M, --model-for AGENT=M, or --team FILE")
    suite_spec = get_suite(suite)
    _, team_doc = team_file(cfg)
    from_file = team_file_workflow(team_doc)
    wf_name = cfg.workflow or from_file or suite_spec.workflow
    wf = get_workflow(wf_name)
    if cfg.workflow and from_file and from_file != cfg.workflow:
        logger.info(f"[eval] --workflow {cfg.workflow} overrides the team file's workflow {from_file}")
    explicit = {k: getattr(cfg, k) for k in ("temperature", "top_p", "max_new_tokens", "enable_thinking")
                if getattr(cfg, k) is not None}
    generic = {"max_batch": cfg.max_batch or DEFAULT_MAX_BATCH}
    given = Explicit(workflow=wf_name, engine=cfg.engine, tokenizer=cfg.tokenizer, max_batch=cfg.max_batch,
                     engine_args=dict(cfg.engine_args or {}), sampling=explicit,
                     models_at=step_url if step_url and cfg.pool == "ray" else None)
    team = build_team(wf_name, wf.agents, model=cfg.model, team_file=cfg.team, model_for=_model_for_list(cfg.model_for),
                      engine=engine, base_url=cfg.base_url,
                      engine_options=fit_options(engine, generic, {"tokenizer": cfg.tokenizer} if cfg.tokenizer else None),
                      trust_remote_code=cfg.trust_remote_code, explicit=given, team_doc=team_doc)
    check_workflow_options(wf, team.workflow_options)
    validate_sampling(explicit, "EvalConfig")  # after the team's own checks: a team file's error is named first
    for key, v in explicit.items():
        recorded = {team.sampling.get(key)} | {s.get(key) for s in team.agent_sampling.values()}
        if recorded - {None, v}:
            logger.info(f"[eval] {flag(key)} {v} overrides the team file's {key}")
    sampling = Sampling(**{**SAMPLING_DEFAULTS, "max_new_tokens": suite_spec.max_new_tokens, **explicit})
    return Resolved(suite, benches, wf, team, sampling, checkpoint, located.steps)


def resolve_protocol(cfg: EvalConfig, team, wf):
    """(templates or None, protocol options) for the run, checked before any model loads.
    Order: packaged templates < the team file's ``prompts:`` < ``prompts``; the same for the
    prompt limit (team ``protocol:`` < ``max_prompt_tokens``). Says so when a flag overrides
    what a team file (e.g. a trained checkpoint's team.yaml) recorded."""

    prompts_flag, limit_flag = cfg.prompts, cfg.max_prompt_tokens
    if not proto.has_templates(wf.name):
        if prompts_flag or team.prompts:
            raise UserError(f"workflow {wf.name} has no prompt templates to replace (--prompts / prompts:)")
        return None, proto.ProtocolOptions()
    if prompts_flag and team.prompts:
        logger.info(f"[eval] --prompts {prompts_flag} overrides the prompts recorded in {team.prompts_source}")
    tpl = proto.load_templates(wf.name, (None if prompts_flag else team.prompts, team.prompts_source or "team file"),
                           (prompts_flag, prompts_flag or ""))
    opts = proto.ProtocolOptions.from_dict(team.protocol, "team file")
    if limit_flag is not None:
        if opts.max_prompt_tokens is not None and opts.max_prompt_tokens != limit_flag:
            logger.info(f"[eval] --max-prompt-tokens {limit_flag} overrides the team file's {opts.max_prompt_tokens}")
        opts = proto.ProtocolOptions(limit_flag, opts.truncate)
    return tpl, opts


def resolve_local_models(team, on_nodes: bool = False) -> dict[str, Any]:
    """Each local worker group's model resolved once (models.resolve_model), for the checks and the
    identity: {wg: Path | hub id | None}, nothing built or fetched (``needs.model_steps`` are done
    first: an alias not built is one line). Remote groups are left out. ``on_nodes`` (a Ray pool,
    whose nodes resolve what they load): a checkpoint URL or a model this machine cannot see is ``None``."""

    out: dict[str, Any] = {}
    for name, g in team.worker_groups.items():
        if traits(g.engine).remote:
            continue
        if on_nodes and is_url(str(g.model)):  # fetched by the nodes, not the driver
            out[name] = None
            continue
        if is_url(str(g.model)):  # its copy in the cache (fetched by a step)
            out[name] = plan_model_copy(str(g.model)).dest
            continue
        try:
            out[name] = resolve_model(g.model, prepare=False)
        except UserError:
            if not on_nodes:
                raise
            out[name] = None
    return out


def check_team_models(team, resolved: dict, checked: str | None = None) -> None:
    """Refuse, before any call, a worker group whose local model folder is part of an incomplete
    checkpoint or has no working tokenizer (models.loading.check_tokenizer_dir). Remote groups,
    checkpoint URLs and models left to the Ray nodes are left to their engines. ``checked``: a
    checkpoint folder already checked for completeness (``Resolved.checkpoint``), not checked again."""

    done = Path(checked).resolve() if checked else None
    for name, where in resolved.items():
        g = team.worker_groups[name]
        if is_url(str(g.model)) or not (isinstance(where, Path) and where.is_dir()):
            continue
        if done is None or done not in (where.resolve(), where.resolve().parent.parent):
            refuse_incomplete(where)
        check_tokenizer_dir(tokenizer_source(where), f"worker group {name!r}",
                            trust_remote_code=bool(g.options.get("trust_remote_code")))


@dataclass(frozen=True)
class Inputs:
    """What the episodes run on: the questions, where their files are, the retriever's spec."""

    tasks: list[Task]
    data_dir: Path | None
    retriever_spec: str | None  # bm25:DIR | lucene:DIR | dense:DIR | http://HOST:PORT (``api.run`` opens it); None: none


@dataclass(frozen=True)
class RunRecord:
    """What the run directory records about the run: where it is, config.yaml, provenance, grader."""

    out: Path  # the run directory
    config_doc: dict[str, Any]  # config.yaml: identity, data, selection, provenance
    provenance: dict[str, Any]
    grader: dict[str, Any]  # provenance.grader_record


@dataclass(frozen=True)
class Prompts:
    """The workflow's prompt templates and prompt limit, as the run applies and records them."""

    options: dict[str, Any]  # workflow options the protocol adds (templates, limits)
    info: dict[str, Any] | None  # summary.json's protocol header; None: the workflow has no templates


@dataclass(frozen=True)
class Costs:
    """How calls are priced, reused and limited: the price sheet, the call cache's folder, the spending limits."""

    prices: PriceSheet | None
    call_cache_dir: str | None = None  # the flag's, else the team file's (``api.run`` opens it); None: off
    limits: Limits | None = None  # the flags over the team file's (drmas_bench.limits), or None: no limits


@dataclass(frozen=True)
class Plan:
    """One evaluation, resolved and checked (nothing opened or loaded: ``api.run`` opens the call
    cache, the retriever and the pool), from its frozen parts; the properties name each part's fields."""

    cfg: EvalConfig  # as given (provenance records it; resolve() works on a local copy of a checkpoint URL)
    resolved: Resolved
    inputs: Inputs
    record: RunRecord
    prompts: Prompts
    costs: Costs
    t0: float  # time.monotonic() when planning began

    # each part's fields by their own names (what api, sweep and the runner read)
    @property
    def suite(self) -> str:
        return self.resolved.suite

    @property
    def benches(self) -> list[Benchmark]:
        return self.resolved.benches

    @property
    def wf(self) -> WorkflowSpec:
        return self.resolved.wf

    @property
    def team(self) -> TeamSpec:
        return self.resolved.team

    @property
    def sampling(self) -> Sampling:
        return self.resolved.sampling

    @property
    def tasks(self) -> list[Task]:
        return self.inputs.tasks

    @property
    def data_dir(self) -> Path | None:
        return self.inputs.data_dir

    @property
    def retriever_spec(self) -> str | None:
        return self.inputs.retriever_spec

    @property
    def out(self) -> Path:
        return self.record.out

    @property
    def config_doc(self) -> dict[str, Any]:
        return self.record.config_doc

    @property
    def provenance(self) -> dict[str, Any]:
        return self.record.provenance

    @property
    def grader(self) -> dict[str, Any]:
        return self.record.grader

    @property
    def protocol_opts(self) -> dict[str, Any]:
        return self.prompts.options

    @property
    def protocol_info(self) -> dict[str, Any] | None:
        return self.prompts.info

    @property
    def prices(self) -> PriceSheet | None:
        return self.costs.prices

    @property
    def call_cache_dir(self) -> str | None:
        return self.costs.call_cache_dir

    @property
    def limits(self) -> Limits | None:
        return self.costs.limits


def load_inputs(cfg: EvalConfig, r: Resolved) -> Inputs:
    """The tasks of the chosen benchmarks (``limit`` each) and, for a workflow that searches, the
    retriever's spec (the flag's, else the default BM25 over the mini corpus); nothing opened."""
    data_dir = resolve_data_dir(cfg.data_dir)
    tasks = []
    for b in r.benches:
        tasks.extend(load_tasks(b, data_dir, limit=cfg.limit))
    if not tasks:
        raise UserError("the benchmark selection has no tasks")
    retriever_spec = None
    if r.wf.needs_retriever:
        retriever_spec = cfg.retriever or default_spec(data_dir)
        note_trained_retriever(r.team, retriever_spec)
    return Inputs(tasks, data_dir, retriever_spec)


def run_identity(cfg: EvalConfig, r: Resolved, inputs: Inputs, models: dict[str, Any], prompts: Prompts,
                 grader: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs the same experiment (config.yaml's ``identity``: a resume with another is
    refused): the team, its models by content, each agent's sampling, the seed, the retriever, the
    prompts and prompt limit, and a math grader's name and version. A batch-invariant group's batching
    options are left out (``reproducibility.identity_team``): they cannot change its records."""
    identity = {"team": identity_team(r.team), "models": models,
                "sampling": {a: r.team.sampling_for(a, r.sampling).__dict__ for a in r.team.agents},
                "seed": cfg.seed, "retriever": inputs.retriever_spec}
    if prompts.info is not None:
        identity["protocol"] = {k: prompts.info[k] for k in ("prompts_sha256", "max_prompt_tokens", "truncate")}
    if "name" in grader:  # a family that takes --grader: a resume with another grader (or version) is refused
        identity["grader"] = {k: grader[k] for k in ("name", "version")}
    return identity


def default_out(r: Resolved, identity: dict[str, Any]) -> Path:
    """``runs/<suite>-<model or team>-<hash of the identity but the models' content>``."""
    team = r.team
    model_label = team.worker_groups[next(iter(team.worker_groups))].model if len(team.worker_groups) == 1 else "team"
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(model_label.rstrip("/")).name).strip(".") or "model"
    named = {k: v for k, v in identity.items() if k != "models"}  # the default name leaves the models' content hashes out
    return Path("runs") / f"{r.suite}-{label}-{fingerprint(named)[:8]}"


def run_record(cfg: EvalConfig, r: Resolved, inputs: Inputs, identity: dict[str, Any], prompts: Prompts,
               grader: dict[str, Any], started: str) -> RunRecord:
    """The run directory and what its config.yaml records: the identity, the data's hashes, the
    selection (a ``--limit``'s question ids), the command line and the provenance (outside the
    identity: it never blocks a resume)."""
    data = data_identity(r.benches, inputs.data_dir)
    info = prompts.info
    provenance = copy.deepcopy({  # copies: config.yaml writes no YAML aliases to the identity's values
        **collect(cfg.argv), "started_at": started, "data": data, "models": identity["models"], "grader": grader,
        "prompts": ({k: info[k] for k in ("prompts_sha256", "prompts_source")} if info else None),
        "workflow": workflow_record(r.wf), "eval_config": cfg.to_dict(),
    })
    config_doc = {
        "identity": identity, "data": data, "suite": r.suite, "workflow": r.wf.name,
        "benchmarks": [b.name for b in r.benches], "n": cfg.n, "limit": cfg.limit,
        # the questions a --limit chose (without one: every question of each benchmark file, whose hash is in data)
        "question_ids": ({b.name: [t.id for t in inputs.tasks if t.benchmark == b.name] for b in r.benches}
                         if cfg.limit is not None else None),
        "data_dir": str(inputs.data_dir) if inputs.data_dir else None,
        "argv": redact_argv(cfg.argv[1:]) if cfg.argv else None,
        "provenance": provenance,  # not part of the identity: never blocks a resume
    }
    return RunRecord(Path(cfg.out) if cfg.out else default_out(r, identity), config_doc, provenance, grader)


def plan_prompts(cfg: EvalConfig, r: Resolved) -> Prompts:
    """The workflow's templates and prompt limit as the run applies (``options``) and records them."""
    templates, protocol_options = resolve_protocol(cfg, r.team, r.wf)
    if templates is None:
        return Prompts({}, None)
    limit, side = protocol_options.resolve(r.wf.name)
    return Prompts({"prompts": templates, "protocol": protocol_options},
                   {"prompts_sha256": templates.sha256, "prompts_source": templates.source,
                    "max_prompt_tokens": limit, "truncate": side})


def plan(cfg: EvalConfig, clock: tuple[str, float] | None = None) -> Plan | Pending:
    """Check and resolve ``cfg`` into a :class:`Plan` (module docstring); nothing is opened, loaded,
    fetched or built, and the run directory is not touched (a mistake leaves no config behind).
    While something must be fetched, merged or built first (``needs``), the answer is a
    :class:`needs.Pending` carrying those steps: ``api.prepare`` performs them and plans again.
    ``clock``: (started, t0) of a first planning that this one completes."""

    started, t0 = clock or (utc_now(), time.monotonic())
    validate_config(cfg)
    located = locate(cfg)
    if not located.ready:  # the checkpoint's team is read from the folder these steps make
        return Pending(cfg, located.steps, started, t0)
    r = resolve_located(located)
    prompts = plan_prompts(cfg, r)
    inputs = load_inputs(cfg, r)
    steps = (*r.prepared, *model_steps(r.team, on_nodes=cfg.pool == "ray"))
    if pending(steps):
        return Pending(cfg, steps, started, t0)
    r = replace(r, prepared=steps)
    resolved = resolve_local_models(r.team, on_nodes=cfg.pool == "ray")  # each model once, for checks and identity
    check_team_models(r.team, resolved, r.checkpoint)  # before the run dir is touched and any call is made
    # the benchmarks name their grading family (one suite per run: one family)
    families = sorted({b.family for b in r.benches})
    grader = grader_record(families[0] if len(families) == 1 else "+".join(families), cfg.grader)
    identity = run_identity(cfg, r, inputs, models_identity(r.team, resolved), prompts, grader)
    record = run_record(cfg, r, inputs, identity, prompts, grader, started)
    prices = team_prices(cfg.prices, r.team) if cfg.prices else None
    limits = resolve_limits(cfg.max_usd, cfg.max_tokens, r.team, prices, cfg.team or "team.yaml")
    if limits is not None and cfg.workers > 1:  # the meter sees every call of one process
        raise UserError("spending limits (--max-usd, --max-tokens, a team file's limits:) need one process: "
                        "drop them or --workers")
    cache_dir = cfg.cache or r.team.cache
    return Plan(cfg, r, inputs, record, prompts, Costs(prices, str(cache_dir) if cache_dir else None, limits), t0)
