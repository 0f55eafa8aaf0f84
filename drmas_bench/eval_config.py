"""``EvalConfig``: what one ``drmas-bench eval`` asks for (the CLI's flags, a library caller's fields),
its defaults (declared once in ``drmas_bench.schema.EVAL_DEFAULTS``), the checks of its numeric ranges
and choices made before anything is read (:func:`validate_config`) and ``--engine-args``' parser.
``drmas_bench.plan`` resolves it into a run's plan and re-exports these names."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import yaml

from drmas_bench.engines import ENGINES
from drmas_bench.pool import POOLS
from drmas_bench.schema import EVAL_DEFAULTS, RANGES
from drmas_bench.suites.registry import suite_names
from drmas_bench.types import UserError

# eval's defaults are declared once, in drmas_bench.schema.EVAL_DEFAULTS (the CLI's flags read them too);
# max new tokens per call: the suite's (`Suite.max_new_tokens`)
SAMPLING_DEFAULTS = {k: EVAL_DEFAULTS[k] for k in ("temperature", "top_p", "enable_thinking")}
DEFAULT_MAX_BATCH = EVAL_DEFAULTS["max_batch"]  # engine micro-batch of worker groups built from `model` / `model_for`


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
    n: int = EVAL_DEFAULTS["n"]  # samples per question
    grader: str | None = None  # math grader (drmas_bench.grading.graders.GRADERS); None: the default
    # --- sampling (None: team file's, else SAMPLING_DEFAULTS / the suite's max_new_tokens)
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    enable_thinking: bool | None = None  # Qwen3 chat-template thinking switch
    seed: int = EVAL_DEFAULTS["seed"]  # run seed; each call's seed derives from it
    # --- search
    retriever: str | None = None  # bm25:DIR | lucene:DIR | dense:DIR | http://HOST:PORT; None: BM25 over the mini corpus
    # --- run
    out: str | None = None  # run directory; None: runs/<suite>-<model>-<config hash>
    fresh: bool = False  # discard an existing run in `out` instead of resuming
    prices: str | None = None  # price sheet YAML for $ columns (docs/pricing.md)
    concurrency: int = EVAL_DEFAULTS["concurrency"]  # episodes in flight
    max_batch: int | None = None  # engine micro-batch; None: 32 for model / model_for groups, a team file's own
    pool: str = EVAL_DEFAULTS["pool"]  # local (in-process) | ray
    pool_budget: float | None = None  # memory budget in models; None: unlimited
    ray_address: str | None = None  # pool "ray": attach to this cluster; None: $RAY_ADDRESS, else start one (docs/scaling.md)
    flush_every: int = EVAL_DEFAULTS["flush_every"]  # append finished trajectories in batches of N
    # worker processes (Ray actors with pool "ray") the episodes are split over, each with its own engines
    # and retriever; one run directory written by this process (drmas_bench.split). Not part of the identity
    workers: int = EVAL_DEFAULTS["workers"]
    cache: str | None = None  # call cache directory (drmas_bench.call_cache; DIR/calls.sqlite3); None: the team file's, else off.
    # Not part of the run's identity: a cached and an uncached run of one configuration are one experiment
    # spending limits (drmas_bench.limits): the run stops cleanly once its calls reach one; None: the team
    # file's limits:, else none. Not part of the run's identity: a re-run with a higher limit resumes
    max_usd: float | None = None  # dollars under the price sheet (needs `prices`)
    max_tokens: int | None = None  # prompt + completion tokens of all calls (per call: max_new_tokens)
    progress: bool = True  # progress bar on stderr
    argv: list[str] | None = None  # the command line that asked for this run (provenance; the CLI sets it)

    def to_dict(self) -> dict[str, Any]:
        """The fields but ``argv`` as a plain mapping, secrets in ``engine_args`` redacted (for provenance)."""
        d = asdict(self)
        d.pop("argv")
        if d.get("engine_args") and "api_key" in d["engine_args"]:
            d["engine_args"] = {**d["engine_args"], "api_key": "<redacted>"}
        return d


# the EvalConfig fields with a numeric range (drmas_bench.schema.RANGES, shared with the trainer);
# None values (not set) are not checked. Messages name the flag.
RANGED_FIELDS = ("n", "limit", "max_new_tokens", "max_prompt_tokens", "seed", "temperature", "top_p", "concurrency",
                 "max_batch", "flush_every", "pool_budget", "max_usd", "max_tokens", "workers")


def choices() -> dict[str, tuple[str, ...]]:
    """The fields with a fixed set of values, from their registries."""

    return {"engine": tuple(ENGINES), "pool": tuple(POOLS), "suite": suite_names()}


def flag(name: str) -> str:
    """A field's flag name: ``max_new_tokens`` -> ``--max-new-tokens``."""
    return "--" + name.replace("_", "-")


def validate_config(cfg: EvalConfig) -> None:
    """Check the numeric fields (``RANGED_FIELDS``, ranges from ``drmas_bench.schema.RANGES``) and choices (``choices()``) before anything is read
    or loaded; one UserError naming the flag per mistake."""

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
