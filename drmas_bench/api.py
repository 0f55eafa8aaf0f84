"""The library entry point for evaluation: ``evaluate(EvalConfig) -> Summary``.

    from drmas_bench import evaluate, EvalConfig
    s = evaluate(EvalConfig(model="tiny-random", suite="toy", n=2, limit=3, out="runs/toy-nb"))
    s["micro"]["avg@n"], s.run_dir, print(s.markdown)       # avg@n is a fraction (0.25 = 25 %)

``drmas-bench eval`` only maps its flags to an :class:`EvalConfig` and calls :func:`evaluate`; so do
``drmas-bench cost --team`` and notebooks. A field left ``None`` is "not set", which is how the one
precedence rule tells an explicit value from a default:

    built-in defaults  <  team file / a checkpoint's team.yaml  <  explicit EvalConfig values (flags)

- sampling (``temperature``, ``top_p``, ``max_new_tokens``, ``enable_thinking``): REFERENCE.md §3
  defaults (``SAMPLING_DEFAULTS``, ``DEFAULT_MAX_NEW`` per suite) < the team file's ``sampling:``
  (team-wide, then per agent) < the explicit values, which hold for every agent;
- workflow: the suite's (``SUITE_WORKFLOW``) < the team file's ``workflow:`` < ``workflow``; it is
  chosen first and the team is validated against *its* agents;
- prompts / prompt limit: packaged < team file's ``prompts:`` / ``protocol:`` < ``prompts`` /
  ``max_prompt_tokens``;
- engines: the team file's ``engine:`` per worker group < ``engine`` (every group; options the new
  engine lacks are dropped with a note);
- engine options: each engine's defaults < the team file's ``options:`` < ``max_batch`` /
  ``engine_args`` (set on every worker group whose engine has that option; an option no group's
  engine has is an error).

Everything is checked before anything loads and before the run directory is touched (a mistake
leaves no config behind); then the run directory's lock is taken, its identity checked (resume or
refuse), the episodes run and the summary is written. Every run records its provenance
(``drmas_bench.provenance``, plus data hashes, model identity, grader, prompts hash and workflow
code hash) under ``provenance:`` in ``config.yaml`` (outside the identity: it never blocks a resume)
and in ``summary.json`` with start / end time and duration.

Progress lines (``[eval] ...``) go to the ``drmas_bench`` logger at INFO; a library caller sees them
after ``logging.basicConfig(level=logging.INFO)`` or ``drmas_bench.log.setup()`` (the CLI's handler).
An unexpected error is raised as ``drmas_bench.log.UnexpectedError`` (a UserError whose
``.original`` is the exception itself).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import inspect
import logging
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from drmas_bench.log import UnexpectedError, one_line, traceback_note, unexpected
from drmas_bench.types import UserError

logger = logging.getLogger(__name__)

# REFERENCE.md §3: eval sampling; max new tokens per call per suite
SAMPLING_DEFAULTS = {"temperature": 0.6, "top_p": 0.95, "enable_thinking": False}
DEFAULT_MAX_NEW = {"math": 4096, "search": 800, "toy": 32}
DEFAULT_MAX_BATCH = 32  # engine micro-batch of worker groups built from `model` / `model_for`


@dataclass
class EvalConfig:
    """One evaluation, as ``drmas-bench eval`` flags (``--max-new-tokens`` -> ``max_new_tokens``).
    ``None`` = not set: the team file's value or the default applies (see the module docstring)."""

    # --- team: one of model / model_for / team
    model: str | None = None  # every agent: alias, local dir, hub id, a checkpoint dir holding team.yaml, or a
    # checkpoint URL (ROOT/step_K, ROOT/latest under an fsspec ckpt_root; downloaded first, see local_model)
    model_for: list[str] | dict[str, str] | None = None  # per-agent models: ["agent=M", ...] or {agent: M}
    team: str | None = None  # team YAML file (docs/teams.md); trusted like a flag
    engine: str | None = None  # hf | openai | sglang for every worker group; None: hf, or the team file's
    base_url: str | None = None  # OpenAI-compatible server for engine openai
    tokenizer: str | None = None  # engine openai: local tokenizer to template and cut prompts here
    engine_args: dict[str, Any] | None = None  # any engine option (dtype, device, mem_fraction_static, ...)
    workflow: str | None = None  # None: the team file's, else the suite's (math_refine, search_route, toy)
    prompts: str | None = None  # prompt templates YAML replacing the packaged / team file's ones
    max_prompt_tokens: int | None = None  # prompt limit in tokens, 0 = none; None: team file's, else the suite's
    trust_remote_code: bool = False  # let transformers run code shipped in model folders (docs/security.md)
    # --- benchmarks
    suite: str | None = None  # math | search | toy
    benchmarks: str | list[str] | None = None  # names (comma-separated or a list); None: the whole suite
    data_dir: str | None = None  # local benchmark files; None: $DRMAS_DATA_DIR, else the hub
    limit: int | None = None  # first N questions per benchmark
    n: int = 16  # samples per question
    grader: str | None = None  # math grader (drmas_bench.grading.registry.GRADERS); None: the default
    # --- sampling (None: team file's, else SAMPLING_DEFAULTS / DEFAULT_MAX_NEW[suite])
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    enable_thinking: bool | None = None  # Qwen3 chat-template thinking switch
    seed: int = 0  # run seed; each call's seed derives from it
    # --- search
    retriever: str | None = None  # bm25:DIR | lucene:DIR | dense:DIR | http://HOST:PORT; None: BM25 over the mini corpus
    # --- run
    out: str | None = None  # run directory; None: runs/<suite>-<model>-<config hash>
    fresh: bool = False  # discard an existing run in `out` instead of resuming
    prices: str | None = None  # price sheet YAML for $ columns (docs/pricing.md)
    concurrency: int = 256  # episodes in flight
    max_batch: int | None = None  # engine micro-batch; None: 32 for model / model_for groups, a team file's own
    pool: str = "local"  # local (in-process) | ray
    pool_budget: float | None = None  # memory budget in models; None: unlimited
    ray_address: str | None = None  # pool "ray": attach to this cluster; None: $RAY_ADDRESS, else start one (docs/scaling.md)
    flush_every: int = 16  # append finished trajectories in batches of N
    progress: bool = True  # progress bar on stderr
    argv: list[str] | None = None  # the command line that asked for this run (provenance; the CLI sets it)

    def to_dict(self) -> dict[str, Any]:
        """The fields but ``argv`` as a plain mapping, secrets in ``engine_args`` redacted (for provenance)."""
        d = asdict(self)
        d.pop("argv")
        if d.get("engine_args") and "api_key" in d["engine_args"]:
            d["engine_args"] = {**d["engine_args"], "api_key": "<redacted>"}
        return d


@dataclass
class Summary:
    """What :func:`evaluate` returns: ``summary.json``'s content (also reachable as ``s[key]``), the
    Markdown the CLI prints, and the run directory."""

    data: dict[str, Any]
    markdown: str
    run_dir: Path

    def to_dict(self) -> dict[str, Any]:
        return self.data

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


# ------------------------------------------------------------------------------------ checks

# the EvalConfig fields with a numeric range (drmas_bench.schema.RANGES, shared with the trainer);
# None values (not set) are not checked. Messages name the flag.
RANGED_FIELDS = ("n", "limit", "max_new_tokens", "max_prompt_tokens", "seed", "temperature", "top_p", "concurrency",
                 "max_batch", "flush_every", "pool_budget")


def choices() -> dict[str, tuple[str, ...]]:
    """The fields with a fixed set of values, from their registries."""
    from drmas_bench.agents.team import ENGINE_KINDS
    from drmas_bench.pool import POOLS
    from drmas_bench.workflows import SUITE_WORKFLOW

    return {"engine": ENGINE_KINDS, "pool": POOLS, "suite": tuple(SUITE_WORKFLOW)}


def flag(name: str) -> str:
    """A field's flag name: ``max_new_tokens`` -> ``--max-new-tokens``."""
    return "--" + name.replace("_", "-")


def validate_config(cfg: EvalConfig) -> None:
    """Check the numeric fields (``RANGED_FIELDS``, ranges from ``drmas_bench.schema.RANGES``) and choices (``choices()``) before anything is read
    or loaded; one UserError naming the flag per mistake."""
    from drmas_bench.schema import RANGES

    for name in RANGED_FIELDS:
        v = getattr(cfg, name)
        if v is not None and not RANGES[name].check(v):
            raise UserError(f"{flag(name)} must be {RANGES[name].what}, got {v!r}")
    for name, allowed in choices().items():
        v = getattr(cfg, name)
        if v is not None and v not in allowed:
            raise UserError(f"{flag(name)} must be one of {', '.join(allowed)}, got {v!r}")
    if cfg.ray_address and cfg.pool != "ray":
        raise UserError(f"--ray-address is for --pool ray (got --pool {cfg.pool})")
    if cfg.engine_args is not None and not isinstance(cfg.engine_args, dict):
        raise UserError(f"--engine-args must be a mapping of engine options, got {type(cfg.engine_args).__name__}")


def parse_engine_args(text: str) -> dict[str, Any]:
    """``--engine-args "dtype=bfloat16,max_batch=8,chat_template_kwargs={a: 1}"`` -> a dict; each
    value is read as a YAML scalar / flow value (8 -> int, true -> bool, {..} -> dict); commas inside
    brackets or braces do not split."""
    import yaml

    items, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    out: dict[str, Any] = {}
    for item in (i.strip() for i in items):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--engine-args expects KEY=VALUE[,KEY=VALUE...], got {item!r}")
        try:
            out[key.strip().replace("-", "_")] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            raise UserError(f"--engine-args {key.strip()}: cannot read the value {value!r}") from None
    return out


def check_workflow_options(options: dict, wf) -> None:
    """Team ``workflow_options`` must be keyword parameters of the workflow function."""
    params = list(inspect.signature(wf.fn).parameters.values())[1:]  # the first is the Episode
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    known = sorted(p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        raise UserError(f"workflow_options: unknown option(s) {', '.join(unknown)} for workflow {wf.name!r}; "
                        f"its options: {', '.join(known) or 'none'}")
    for k, v in options.items():
        default = wf.defaults.get(k)
        if default is not None and not isinstance(v, type(default)) and not (
                isinstance(default, float) and isinstance(v, int) and not isinstance(v, bool)):
            raise UserError(f"workflow_options.{k}: expected {type(default).__name__} (like the default {default!r}), got {v!r}")


# ------------------------------------------------------------------------------------ resolving


@dataclass
class Resolved:
    """An EvalConfig resolved against the registries and the team file (nothing loaded yet)."""

    suite: str
    benches: list
    wf: Any  # WorkflowSpec
    team: Any  # TeamSpec
    sampling: Any  # Sampling: the defaults with the explicit values applied (team file in between per agent)


def team_file_workflow(cfg: EvalConfig) -> str | None:
    """The ``workflow:`` named by the team file (``team``, or ``model``'s checkpoint team.yaml), if any;
    a file that cannot be read is left to the team validation to report."""
    from drmas_bench.yamlfile import read_yaml

    path = Path(cfg.team) if cfg.team else (Path(cfg.model, "team.yaml") if cfg.model else None)
    if path is None or not path.is_file():
        return None
    d = read_yaml(path, "team file")
    wf = d.get("workflow") if isinstance(d, dict) else None
    return wf if isinstance(wf, str) and wf else None


def _model_for_list(v: list[str] | dict[str, str] | None) -> list[str] | None:
    if isinstance(v, dict):
        return [f"{a}={m}" for a, m in v.items()]
    if isinstance(v, str):
        return [v]
    return list(v) if v else None


def apply_engine_args(team, engine_args: dict[str, Any]) -> None:
    """Set each explicit engine option on every worker group whose engine has it (explicit wins over
    a team file's ``options:``); an option that no group's engine has is one UserError."""
    from drmas_bench.pool.hosting import option_names

    for key, value in engine_args.items():
        k = key.replace("-", "_")
        hit = False
        for g in team.worker_groups.values():
            if k in option_names(g.engine):
                g.options.pop(key, None)
                g.options[k] = value
                hit = True
        if not hit:
            engines = sorted({g.engine for g in team.worker_groups.values()})
            known = sorted(set().union(*(option_names(e) for e in engines)))
            raise UserError(f"--engine-args {key}: not an option of the {'/'.join(engines)} engine; "
                            f"options: {', '.join(known)}")


def switch_engine(team, engine: str, base_url: str | None, tokenizer: str | None, trust_remote_code: bool) -> None:
    """An explicit ``engine`` over a team file's engines: every worker group runs on it. Options that
    engine lacks are dropped (said on stderr); a group served over HTTP (``base_url`` / ``api_key_env``)
    cannot move to an in-process engine; groups moved to openai get ``base_url`` / ``tokenizer``."""
    from drmas_bench.pool.hosting import option_names

    names = option_names(engine)
    for g in team.worker_groups.values():
        if g.engine == engine:
            continue
        if engine != "openai" and (g.base_url or g.api_key_env):
            raise UserError(f"--engine {engine}: worker group {g.name!r} is an openai group with base_url / api_key_env; "
                            f"it cannot run in-process (leave out --engine, or edit the team file)")
        dropped = sorted(k for k in g.options if k.replace("-", "_") not in names)
        if dropped:
            logger.info(f"[eval] --engine {engine}: worker group {g.name!r} leaves its {g.engine} option(s) "
                        f"{', '.join(dropped)} behind")
        g.options = {k: v for k, v in g.options.items() if k.replace("-", "_") in names}
        g.engine = engine
        if engine == "openai":
            g.base_url = g.base_url or base_url
            if tokenizer:
                g.options["tokenizer"] = tokenizer
        elif trust_remote_code:
            g.options["trust_remote_code"] = True


def local_model(cfg: EvalConfig) -> tuple[EvalConfig, str | None]:
    """``model`` given as a checkpoint URL (``ROOT/step_K`` or ``ROOT/latest`` under an fsspec
    ckpt_root, e.g. ``s3://bucket/run1/latest``): the same config with ``model`` pointing at a local
    copy (``<cache dir>/checkpoints/<hash of ROOT/step_K>``, drmas_trainer.ckpt_store), which is then
    evaluated as a checkpoint folder (its team.yaml is untrusted data, as for any folder), and the
    step's URL. With ``pool="ray"`` the copy holds only the team file: the nodes fetch the models
    (:func:`models_on_nodes`). Other configs: ``(cfg, None)``."""
    from dataclasses import replace

    from drmas_trainer.ckpt_store import TEAM_PARTS, cached_checkpoint, is_url, resolve_latest

    if not (cfg.model and is_url(cfg.model)):
        return cfg, None
    step_url = resolve_latest(cfg.model)
    if cfg.pool == "ray":
        return replace(cfg, model=str(cached_checkpoint(step_url, parts=TEAM_PARTS))), step_url
    return replace(cfg, model=str(cached_checkpoint(step_url))), step_url


def models_on_nodes(team, step_url: str) -> None:
    """A Ray eval of checkpoint ``step_url``: each worker group's model, recorded relative to the
    checkpoint (``models/<wg>``), becomes its URL (``ROOT/step_K/models/<wg>``), which the actor
    resolves on its own node (models.resolve_model downloads it into that node's cache). A path that
    would leave the checkpoint (``..``, absolute) is left as it is, and resolves (or fails) locally."""
    for g in team.worker_groups.values():
        if g.engine == "openai" or Path(g.model).is_absolute():
            continue
        parts = Path(g.model).parts
        if parts and not any(p in ("..", ".") for p in parts):
            g.model = "/".join([step_url.rstrip("/"), *parts])


def resolve(cfg: EvalConfig) -> Resolved:
    """Benchmarks, workflow (chosen before the team is validated), team and sampling for ``cfg``."""
    from drmas_bench.agents.team import build_team, check_engine_options, validate_sampling
    from drmas_bench.pool.hosting import fit_options, option_names
    from drmas_bench.tasks import select_benchmarks
    from drmas_bench.types import Sampling
    from drmas_bench.workflows import SUITE_WORKFLOW, get_workflow

    cfg, step_url = local_model(cfg)
    if cfg.model and Path(cfg.model).is_dir():
        refuse_incomplete_checkpoint(cfg.model)  # before its team.yaml is read
    benches = select_benchmarks(cfg.suite, cfg.benchmarks)
    suites = {b.suite for b in benches}
    if len(suites) > 1:
        raise UserError(f"one suite per run; the selection mixes {', '.join(sorted(suites))}")
    suite = suites.pop()
    engine = cfg.engine or "hf"
    if cfg.tokenizer and engine != "openai":
        raise UserError("--tokenizer is for --engine openai (the other engines load the model's own tokenizer)")
    if not (cfg.model or cfg.model_for or cfg.team):
        raise UserError("choose a team: --model M, --model-for AGENT=M, or --team FILE")
    from_file = team_file_workflow(cfg)
    wf_name = cfg.workflow or from_file or SUITE_WORKFLOW[suite]
    wf = get_workflow(wf_name)
    if cfg.workflow and from_file and from_file != cfg.workflow:
        logger.info(f"[eval] --workflow {cfg.workflow} overrides the team file's workflow {from_file}")
    generic = {"max_batch": cfg.max_batch or DEFAULT_MAX_BATCH}
    team = build_team(wf_name, wf.agents, model=cfg.model, team_file=cfg.team, model_for=_model_for_list(cfg.model_for),
                      engine=engine, base_url=cfg.base_url,
                      engine_options=fit_options(engine, generic, {"tokenizer": cfg.tokenizer} if cfg.tokenizer else None),
                      trust_remote_code=cfg.trust_remote_code)
    team.workflow = wf_name
    if step_url and cfg.pool == "ray":
        models_on_nodes(team, step_url)
    if cfg.engine is not None:
        switch_engine(team, cfg.engine, cfg.base_url, cfg.tokenizer, cfg.trust_remote_code)
        check_engine_options(team)
    if cfg.max_batch is not None:  # a generic option: set where the engine has it (hf), like fit_options
        for g in team.worker_groups.values():
            if "max_batch" in option_names(g.engine):
                g.options["max_batch"] = cfg.max_batch
    if cfg.engine_args:
        apply_engine_args(team, cfg.engine_args)
        check_engine_options(team)
    check_workflow_options(team.workflow_options, wf)
    explicit = {k: getattr(cfg, k) for k in ("temperature", "top_p", "max_new_tokens", "enable_thinking")
                if getattr(cfg, k) is not None}
    validate_sampling(explicit, "EvalConfig")
    for key, v in explicit.items():
        recorded = {team.sampling.get(key)} | {s.get(key) for s in team.agent_sampling.values()}
        if recorded - {None, v}:
            logger.info(f"[eval] {flag(key)} {v} overrides the team file's {key}")
    team.flag_sampling = explicit
    sampling = Sampling(**{**SAMPLING_DEFAULTS, "max_new_tokens": DEFAULT_MAX_NEW[suite], **explicit})
    return Resolved(suite, benches, wf, team, sampling)


def resolve_protocol(cfg: EvalConfig, team, wf):
    """(templates or None, protocol options) for the run, checked before any model loads.
    Order: packaged templates < the team file's ``prompts:`` < ``prompts``; the same for the
    prompt limit (team ``protocol:`` < ``max_prompt_tokens``). Says so when a flag overrides
    what a team file (e.g. a trained checkpoint's team.yaml) recorded."""
    from drmas_bench.workflows import protocol as P

    prompts_flag, limit_flag = cfg.prompts, cfg.max_prompt_tokens
    if not P.has_templates(wf.name):
        if prompts_flag or team.prompts:
            raise UserError(f"workflow {wf.name} has no prompt templates to replace (--prompts / prompts:)")
        return None, P.ProtocolOptions()
    if prompts_flag and team.prompts:
        logger.info(f"[eval] --prompts {prompts_flag} overrides the prompts recorded in {team.prompts_source}")
    tpl = P.load_templates(wf.name, (None if prompts_flag else team.prompts, team.prompts_source or "team file"),
                           (prompts_flag, prompts_flag or ""))
    opts = P.ProtocolOptions.from_dict(team.protocol, "team file")
    if limit_flag is not None:
        if opts.max_prompt_tokens is not None and opts.max_prompt_tokens != limit_flag:
            logger.info(f"[eval] --max-prompt-tokens {limit_flag} overrides the team file's {opts.max_prompt_tokens}")
        opts = P.ProtocolOptions(limit_flag, opts.truncate)
    return tpl, opts


def grader_record(family: str, math_grader: str | None) -> dict:
    """What grades this run: {"family": "math" | "qa" | "toy", and for math "name", "version"}.
    `--grader` on a workflow that is not graded as math is a UserError."""
    from drmas_bench.grading.registry import DEFAULT_GRADER, get_grader

    if family != "math":
        if math_grader is not None:
            raise UserError(f"--grader picks a math grader; this workflow is graded by {family!r}")
        return {"family": family}
    return {"family": family, **get_grader(math_grader or DEFAULT_GRADER).identity()}


def default_retriever_spec(data_dir) -> str:
    """The embedded default: BM25 over the mini corpus, cached under the user cache dir."""
    from drmas_bench.models import cache_dir

    if data_dir is None or not (Path(data_dir) / "corpus" / "mini_corpus.jsonl").is_file():
        raise UserError("the search suite needs a retriever: pass --retriever bm25:DIR|lucene:DIR|dense:DIR|URL, "
                        "or a --data-dir holding corpus/mini_corpus.jsonl for the default BM25 index")
    out = cache_dir() / "indexes" / "mini_corpus-bm25"
    if not (out / "drmas_index.json").is_file():
        from drmas_retrieval import build_index

        logger.info(f"[eval] building the default BM25 index of the mini corpus in {out}")
        build_index("bm25", Path(data_dir) / "corpus" / "mini_corpus.jsonl", out)
    return f"bm25:{out}"


def _note_retriever(team, retriever_spec: str | None) -> None:
    """A trained team records the retriever it learned with; say so when eval uses another one."""
    from drmas_bench.workflows.protocol import retriever_record

    if not team.retriever or not retriever_spec:
        return
    try:
        now = retriever_record(retriever_spec)
    except Exception:  # an unreadable index fails later with its own message
        return
    if now != {k: team.retriever.get(k) for k in ("kind", "identity")}:
        logger.warning(f"[eval] note: the team was trained with retriever {team.retriever.get('kind')} "
                       f"({team.retriever.get('identity')}); this run uses {now['kind']} ({now['identity']})")


# ------------------------------------------------------------------------------------ identity


def models_identity(team, on_nodes: bool = False) -> dict[str, dict[str, str]]:
    """What each local worker group's ``model`` resolves to: real path + content hash (store.model_identity).
    Hub ids not downloaded and remote (openai) models are identified by name only. ``on_nodes`` (a Ray
    pool, where models are resolved on the nodes that load them): an alias is not prepared on the
    driver for this, and a model the driver cannot see is identified by name."""
    from drmas_bench.models import resolve_model
    from drmas_bench.store import model_identity
    from drmas_trainer.ckpt_store import is_url

    out = {}
    for name, g in team.worker_groups.items():
        if g.engine == "openai":
            continue
        if on_nodes and is_url(str(g.model)):  # a checkpoint URL: fetched by the nodes, not the driver
            out[name] = {"name": str(g.model), "resolved_on": "the Ray nodes"}
            continue
        try:
            resolved = resolve_model(g.model, prepare=not on_nodes)
        except UserError:
            if not on_nodes:
                raise
            out[name] = {"name": str(g.model), "resolved_on": "the Ray nodes"}
            continue
        out[name] = model_identity(resolved) if Path(resolved).is_dir() else {"name": str(resolved)}
    return out


def refuse_incomplete_checkpoint(folder: str | Path) -> None:
    """A trainer checkpoint (``step_K`` holding trainer_state.json) without its ``COMPLETE`` marker is
    a save that did not finish (weights may be missing or half written): refused with one line naming
    the newest complete step beside it. Also checked for a worker group's model inside one
    (``step_K/models/<wg>``)."""
    from drmas_trainer.ckpt_store import _STEP, MARKER

    p = Path(folder)
    for ckpt in (p, p.parent.parent):
        if not (ckpt / "trainer_state.json").is_file() or (ckpt / MARKER).is_file():
            continue
        steps = sorted((int(m.group(1)), d.name) for d in ckpt.parent.iterdir()
                       if (m := _STEP.match(d.name)) and (d / MARKER).is_file())
        hint = f"; the newest complete one beside it is {ckpt.parent / steps[-1][1]}" if steps else ""
        raise UserError(f"{ckpt}: an incomplete checkpoint (no {MARKER} marker: its save did not finish), "
                        f"not evaluated{hint}")


def check_team_models(team, on_nodes: bool = False) -> None:
    """Refuse, before any call, a worker group whose local model folder is part of an incomplete
    checkpoint or has no working tokenizer (models.loading.check_tokenizer_dir). Remote (openai)
    groups and, with ``on_nodes``, models the nodes resolve are left to their engines."""
    from drmas_bench.models import resolve_model
    from drmas_bench.models.loading import check_tokenizer_dir
    from drmas_trainer.ckpt_store import is_url

    for name, g in team.worker_groups.items():
        if g.engine == "openai" or is_url(str(g.model)):
            continue
        try:
            resolved = resolve_model(g.model, prepare=not on_nodes)
        except UserError:
            if on_nodes:
                continue
            raise
        if isinstance(resolved, Path) and resolved.is_dir():
            refuse_incomplete_checkpoint(resolved)
            check_tokenizer_dir(resolved, f"worker group {name!r}",
                                trust_remote_code=bool(g.options.get("trust_remote_code")))


def data_identity(benches, data_dir) -> dict[str, str]:
    """sha256 of every benchmark file read (generated / hub benchmarks: where they come from)."""
    from drmas_bench.store import file_sha256, load_hash_cache, save_hash_cache
    from drmas_bench.tasks.registry import local_file, source_of

    cache = load_hash_cache()
    out = {}
    for b in benches:
        path = local_file(b, Path(data_dir)) if data_dir and b.generate is None else None
        out[b.name] = f"sha256:{file_sha256(path, cache)}" if path else source_of(b, Path(data_dir) if data_dir else None)[0]
    save_hash_cache(cache)
    return out


def workflow_record(wf) -> dict[str, str]:
    """A workflow's name and version: the package version and a hash of the module defining it."""
    from drmas_bench.provenance import package_version

    src = inspect.getsourcefile(wf.fn)
    code = hashlib.sha256(Path(src).read_bytes()).hexdigest()[:16] if src and Path(src).is_file() else None
    return {"name": wf.name, "package_version": package_version(), "code_sha256": code}


def protocol_summary(records: list[dict], info: dict | None) -> dict:
    """summary.json's ``protocol``: the prompts hash / source and prompt limit of the run, the number
    of recorded calls, how many had their prompt truncated by the engine, and how many carried a
    limit the engine could not apply (an HTTP model without a tokenizer here or on its server:
    ``prompt_limit_unenforced_calls``)."""
    calls = [t for r in records for t in r["turns"]]
    truncated = sum(bool(t["completion"].get("prompt_truncated")) for t in calls)
    unenforced = sum(bool(t["completion"].get("prompt_limit_unenforced")) for t in calls)
    return {**(info or {}), "calls": len(calls), "prompt_truncated_calls": truncated,
            "prompt_limit_unenforced_calls": unenforced}


# ------------------------------------------------------------------------------------ running


_one_line = one_line


def _load_prices(path: str, team):
    """The price sheet, checked against the team's worker groups before the run starts."""
    from drmas_bench.pricing import load_prices

    # turns record their worker group; price each as its model
    prices = load_prices(path).with_aliases({n: g.price_key for n, g in team.worker_groups.items()})
    for name in team.worker_groups:
        prices.cost(name, 0, 0)  # fail now, not after the run, on a model the sheet lacks
    return prices


async def _run(cfg: EvalConfig, team, wf, tasks, store, sampling, retriever, cost_fn, protocol_opts=None):
    """Serve the team's worker groups from a pool (engines asleep until needed when the budget is
    smaller than the team), run the episodes, always release the engines. -> (RunStats, pool stats)"""
    from drmas_bench.pool import make_pool, specs_from_team
    from drmas_bench.runner import TeamRuntime, run_episodes

    ray_opts = {"address": cfg.ray_address} if cfg.pool == "ray" else {}
    pool = make_pool(cfg.pool, specs_from_team(team), budget_models=cfg.pool_budget, **ray_opts)
    try:
        await pool.__aenter__()  # loads the engines that fit the budget
    except UserError:
        raise
    except Exception as e:
        models = ", ".join(f"{n}={g.model}" for n, g in team.worker_groups.items())
        log = store.log_error(e)
        raise UnexpectedError(f"cannot load the team's models ({models}): {_one_line(e)} ({traceback_note(log)})",
                              e, log) from None
    try:
        runtime = TeamRuntime(team, pool.views(), sampling)
        logger.info(f"[eval] {len(tasks)} questions x {cfg.n} samples, workflow {wf.name}, run dir {store.path}")
        try:
            stats = await run_episodes(
                tasks, cfg.n, runtime, wf, store, seed=cfg.seed, retriever=retriever,
                workflow_options={**team.workflow_options, **(protocol_opts or {})}, concurrency=cfg.concurrency,
                cost_fn=cost_fn, progress=cfg.progress, flush_every=cfg.flush_every,
                math_grader=cfg.grader,
            )
        except UserError as e:
            raise UserError(f"{e} (finished samples are saved in {store.samples_path}; re-run to resume)") from None
        except Exception as e:
            raise unexpected(e, "run stopped", log=store.log_error(e),
                             hint=f"finished samples are saved in {store.samples_path}; re-run to resume") from None
        return stats, pool.stats()
    finally:
        await pool.__aexit__(None, None, None)


def evaluate(config: EvalConfig) -> Summary:
    """Run (or resume) one evaluation and return its summary (see the module docstring).

    Raises UserError (one line) on bad input, before anything loads; after the run directory is
    opened, an unexpected error keeps its traceback in RUN/error.log and finished samples stay."""
    from drmas_bench.provenance import collect, redact_argv, utc_now
    from drmas_bench.store import RunDir, fingerprint
    from drmas_bench.tasks import load_tasks, resolve_data_dir

    if not isinstance(config, EvalConfig):
        raise UserError(f"evaluate() takes an EvalConfig, got {type(config).__name__}")
    cfg = config
    started, t0 = utc_now(), time.monotonic()
    # everything is checked before the run directory is touched: a mistake leaves no config behind
    validate_config(cfg)
    r = resolve(cfg)
    wf, team, sampling = r.wf, r.team, r.sampling
    templates, proto = resolve_protocol(cfg, team, wf)
    data_dir = resolve_data_dir(cfg.data_dir)
    tasks = []
    for b in r.benches:
        tasks.extend(load_tasks(b, data_dir, limit=cfg.limit))
    if not tasks:
        raise UserError("the benchmark selection has no tasks")

    retriever_spec = None
    if wf.needs_retriever:
        retriever_spec = cfg.retriever or default_retriever_spec(data_dir)
        _note_retriever(team, retriever_spec)

    check_team_models(team, on_nodes=cfg.pool == "ray")  # before the run dir is touched and any call is made
    runtime_sampling = {a: team.sampling_for(a, sampling).__dict__ for a in team.agents}
    identity = {
        "team": team.to_dict(),
        "models": models_identity(team, on_nodes=cfg.pool == "ray"),
        "sampling": runtime_sampling,
        "seed": cfg.seed,
        "retriever": retriever_spec,
    }
    protocol_opts, protocol_info = {}, None
    if templates is not None:
        limit, side = proto.resolve(wf.name)
        protocol_info = {"prompts_sha256": templates.sha256, "prompts_source": templates.source,
                         "max_prompt_tokens": limit, "truncate": side}
        identity["protocol"] = {k: protocol_info[k] for k in ("prompts_sha256", "max_prompt_tokens", "truncate")}
        protocol_opts = {"prompts": templates, "protocol": proto}
    grader = grader_record(wf.grader, cfg.grader)
    if wf.grader == "math":  # a resume with another math grader (or version) is refused
        identity["grader"] = {k: grader[k] for k in ("name", "version")}
    model_label = team.worker_groups[next(iter(team.worker_groups))].model if len(team.worker_groups) == 1 else "team"
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(model_label.rstrip("/")).name).strip(".") or "model"
    named = {k: v for k, v in identity.items() if k != "models"}  # default names stay those of earlier versions
    out = Path(cfg.out or Path("runs") / f"{r.suite}-{label}-{fingerprint(named)[:8]}")
    data = data_identity(r.benches, data_dir)
    provenance = copy.deepcopy({  # copies: config.yaml writes no YAML aliases to the identity's values
        **collect(cfg.argv),
        "started_at": started,
        "data": data,
        "models": identity["models"],
        "grader": grader,
        "prompts": ({k: protocol_info[k] for k in ("prompts_sha256", "prompts_source")} if protocol_info else None),
        "workflow": workflow_record(wf),
        "eval_config": cfg.to_dict(),
    })
    config_doc = {
        "identity": identity,
        "data": data,
        "suite": r.suite,
        "workflow": wf.name,
        "benchmarks": [b.name for b in r.benches],
        "n": cfg.n,
        "limit": cfg.limit,
        # the questions a --limit chose (without one: every question of each benchmark file, whose hash is in data)
        "question_ids": ({b.name: [t.id for t in tasks if t.benchmark == b.name] for b in r.benches}
                         if cfg.limit is not None else None),
        "data_dir": str(data_dir) if data_dir else None,
        "argv": redact_argv(cfg.argv[1:]) if cfg.argv else None,
        "provenance": provenance,  # not part of the identity: never blocks a resume
    }
    prices = _load_prices(cfg.prices, team) if cfg.prices else None

    def cost_fn(traj) -> float:  # the known calls' dollars; the summary says when some were unknown
        return sum(prices.cost(t.wg, t.completion.prompt_tokens, t.completion.completion_tokens, t.completion.latency_s)
                   for t in traj.turns if t.completion.usage != "unknown")

    retriever = None
    if retriever_spec:
        from drmas_retrieval import load_retriever

        try:
            retriever = load_retriever(retriever_spec)
            retriever.search(["probe"], 1)  # a server that is down fails here, before any episode runs
        except Exception as e:  # a down server, a missing index dir
            raise UserError(f"retriever {retriever_spec}: {e}") from None

    store = RunDir(out, config_doc, fresh=cfg.fresh)  # takes RUN/.lock, then writes the identity
    try:
        return _run_and_summarize(cfg, team, wf, tasks, store, sampling, retriever, cost_fn if prices else None, prices,
                                  protocol_opts, protocol_info, grader, provenance, t0)
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as e:  # a bug, not a user mistake: keep the traceback, say so in one line
        raise unexpected(e, log=store.log_error(e), hint=f"finished samples are kept in {store.samples_path}") from None
    finally:
        store.close()


def _run_and_summarize(cfg, team, wf, tasks, store, sampling, retriever, cost_fn, prices, protocol_opts,
                       protocol_info, grader, provenance, t0) -> Summary:
    from drmas_bench.report.markdown import format_summary_markdown

    from drmas_bench import metrics
    from drmas_bench.provenance import hardware, utc_now
    from drmas_bench.tasks.registry import get_benchmark

    out = store.path
    stats, pool_stats = asyncio.run(_run(cfg, team, wf, tasks, store, sampling, retriever, cost_fn, protocol_opts))

    records = store.selected()  # the selection leaderboard and cost read too (store.select_records)
    summary = metrics.summarize(records, prices=prices, workflow=wf.name)
    summary["run"] = {"dir": str(out), "workflow": wf.name, "episodes_run": stats.episodes,
                      "episodes_resumed": stats.skipped, "wall_s": round(stats.wall_s, 2),
                      # what summary.md's header and agents table name: every agent of the team (also one
                      # never called), with its worker group and that group's model
                      "suite": cfg.suite or ", ".join(sorted({get_benchmark(t.benchmark).suite for t in tasks})),
                      "benchmarks": list(dict.fromkeys(t.benchmark for t in tasks)),
                      "team": {a: {"worker_group": wg, "model": team.worker_groups[wg].model}
                               for a, wg in team.agents.items()}}
    summary["pool"] = pool_stats
    summary["protocol"] = protocol_summary(records, protocol_info)
    summary["grader"] = grader
    # the engines have imported torch by now: the GPUs are known without a probe of their own
    summary["provenance"] = {**provenance, "hardware": hardware(), "finished_at": utc_now(),
                             "duration_s": round(time.monotonic() - t0, 2)}
    md = format_summary_markdown(summary)
    if protocol_info:
        p = summary["protocol"]
        md += (f"\n- prompts: {p['prompts_source']} (sha256 {p['prompts_sha256'][:12]}); prompt limit "
               f"{p['max_prompt_tokens'] or 'none'} tokens ({p['truncate']}); truncated prompts: "
               f"{p['prompt_truncated_calls']} of {p['calls']} calls"
               + (f"; limit NOT enforced on {p['prompt_limit_unenforced_calls']} calls (no tokenizer here or on the "
                  "server)" if p["prompt_limit_unenforced_calls"] else "") + "\n")
    store.write_summary(summary, md)
    logger.info(f"\n[eval] {stats.episodes} episodes run, {stats.skipped} resumed from disk, {stats.wall_s:.1f} s; "
                f"summary in {out}/summary.md")
    return Summary(summary, md, out)


__all__ = ["EvalConfig", "Summary", "evaluate", "parse_engine_args"]
