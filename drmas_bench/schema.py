"""One schema library for every file a user writes: team files, price sheets, prompts files and the
trainer config are pydantic (v2) models; this module holds the shared pieces.

- :class:`Schema`: the base model (unknown keys are errors, no silent coercion of strings to numbers).
- :func:`parse`: validate a mapping against a schema; the first problem becomes one
  :class:`~drmas_bench.types.UserError` line ``WHERE: key.path: what is wrong, got VALUE`` (never a
  multi-line pydantic dump). An unknown key names itself and lists the allowed ones.
- :class:`SamplingSchema` / :class:`TrainSamplingSchema`: the per-agent sampling overrides that team
  files (eval) and the trainer config share; :class:`ModelOnEngine`: the worker-group core (one
  model on one engine) that a team file's worker group and a trainer agent both extend.
- :class:`Range` / :data:`RANGES`: the valid range of every numeric option that eval flags and the
  trainer config share (temperature, top_p, ...), in one place: eval checks its flags with
  ``RANGES[name].check``, the schemas take ``RANGES[name].field(...)``; a number YAML 1.1 read as a
  string (``3e-1``) is accepted where a schema wants a float (:data:`YamlFloat`).
- :func:`fields_table` / :func:`markdown_table`: every field with its type, default and
  description, for ``drmas-bench config-schema`` and the tables in docs/ (tests/test_schema.py
  checks that the docs match).
"""

from __future__ import annotations

import importlib
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Optional

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from drmas_bench.engines import DEFAULT_ENGINE, ENGINES
from drmas_bench.types import UserError


class Schema(BaseModel):
    """Base of every user-file schema: unknown keys are errors; values are taken as YAML gives them."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _no_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {v!r}")
    return v


#: numbers that may arrive as strings (YAML 1.1 reads ``1e-6`` as one; ``--set`` values) but never as booleans
Float = Annotated[float, BeforeValidator(_no_bool)]
Int = Annotated[int, BeforeValidator(_no_bool)]


def _finite_nonneg(v: float) -> float:
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"must be a finite number >= 0, got {v!r}")
    return v


#: a rate (learning rate, ...): finite and >= 0; NaN, infinite or negative values are one line naming the key
Rate = Annotated[float, BeforeValidator(_no_bool), AfterValidator(_finite_nonneg)]
_YAML11_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _yaml11_float(v: Any) -> Any:
    """``"3e-1"`` -> 0.3: YAML 1.1 (PyYAML) reads an exponent without a dot as a string, while the
    trainer's config (which coerces) takes it as a number; a strict schema does the same here."""
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {v!r}")
    if isinstance(v, str) and _YAML11_NUMBER.fullmatch(v.strip()):
        return float(v)
    return v


#: a float that may arrive as YAML 1.1's string form of a number (``3e-1``) in a strict schema
YamlFloat = Annotated[float, BeforeValidator(_yaml11_float)]


@dataclass(frozen=True)
class Range:
    """The valid values of one numeric option: its kind and bounds (None = unbounded); always finite."""

    kind: type  # int or float
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    text: str | None = None  # how it reads, when the generated wording is not the clearest

    @property
    def what(self) -> str:
        """How the range reads in an error: "an integer >= 1", "a number in (0, 1]", ..."""
        if self.text:
            return self.text
        noun = "an integer" if self.kind is int else "a finite number"
        lo = (f"[{self.ge:g}" if self.ge is not None else f"({self.gt:g}" if self.gt is not None else None)
        hi = (f"{self.le:g}]" if self.le is not None else f"{self.lt:g})" if self.lt is not None else None)
        if lo and hi:
            return f"{'an integer' if self.kind is int else 'a number'} in {lo}, {hi}"
        if lo:
            return f"{noun} {'>=' if self.ge is not None else '>'} {lo[1:]}"
        if hi:
            return f"{noun} {'<=' if self.le is not None else '<'} {hi[:-1]}"
        return noun

    def check(self, v: Any) -> bool:
        """Whether ``v`` is a value of this range (booleans never are; an int is a float here)."""
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (self.kind is int and not isinstance(v, int)):
            return False
        if not math.isfinite(v):
            return False
        return ((self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt)
                and (self.le is None or v <= self.le) and (self.lt is None or v < self.lt))

    def field(self, default: Any = ..., **kw: Any) -> Any:
        """A pydantic ``Field`` with these bounds (and no NaN / infinity for floats)."""
        bounds = {k: getattr(self, k) for k in ("ge", "gt", "le", "lt") if getattr(self, k) is not None}
        if self.kind is float:
            bounds["allow_inf_nan"] = False
        return Field(default, **bounds, **kw)


#: the one table of numeric ranges shared by eval (flags, team files) and the trainer (recipes, --set)
# eval's defaults, declared once: `plan.EvalConfig`'s fields and `drmas-bench eval`'s flags read them
# (sampling: REFERENCE.md §3; a suite's max_new_tokens and a workflow's prompt limit are declared by
# the suite and the workflow)
EVAL_DEFAULTS: dict[str, Any] = {
    "n": 16,  # samples per question
    "seed": 0,  # the run seed; each call's seed derives from it
    "temperature": 0.6,
    "top_p": 0.95,
    "enable_thinking": False,  # Qwen3 chat-template thinking switch
    "max_batch": 32,  # engine micro-batch of worker groups built from `model` / `model_for`
    "concurrency": 256,  # episodes in flight
    "pool": "local",  # local (in-process) | ray
    "flush_every": 16,  # append finished trajectories in batches of N
    "workers": 1,  # processes (or Ray actors) the episodes are split over, each with its own engines
}

RANGES: dict[str, Range] = {
    # sampling (eval flags, team files' sampling:, the trainer's rollout and agents.NAME.sampling)
    "temperature": Range(float, ge=0),
    "top_p": Range(float, gt=0, le=1),
    "max_new_tokens": Range(int, ge=1),
    # counts
    "n": Range(int, ge=1),
    "limit": Range(int, ge=1),
    "concurrency": Range(int, ge=1),
    "batch_size": Range(int, ge=1),
    "max_batch": Range(int, ge=1),
    "flush_every": Range(int, ge=1),
    "workers": Range(int, ge=1),
    "max_prompt_tokens": Range(int, ge=0, text="an integer >= 0 (0 = no limit)"),
    "seed": Range(int),
    "pool_budget": Range(float, gt=0, text="a number > 0"),
    "max_usd": Range(float, gt=0, text="a number of dollars > 0"),  # run limits (drmas_bench.limits)
    "max_tokens": Range(int, ge=1),
    "steps": Range(int, ge=0),  # 0 = none (sft)
    "every": Range(int, ge=0),  # save_every, keep_last: 0 = only the last / keep all
    "positive_count": Range(int, ge=1),  # mini_batches, ppo_epochs, prompts_per_step, micro_batch_size, ...
    # optimisation
    "rate": Range(float, ge=0),  # learning rates, weight decay, penalties (c_inv), std floors, clip widths
    "grad_clip": Range(float),  # finite; <= 0 turns clipping off
    "beta": Range(float, ge=0, lt=1),  # AdamW betas
    "share": Range(float, ge=0, le=1),  # a probability / share
    "coef": Range(float),  # finite, any sign (entropy bonus)
}


#: config of schemas whose values are coerced (the trainer config: recipes and ``--set`` overrides)
COERCING = ConfigDict(extra="forbid", strict=False, coerce_numbers_to_str=True)


class CoercingSchema(Schema):
    """Base of the trainer config sections: like :class:`Schema`, but ``"1e-6"`` is a float, ``"true"``
    a boolean and ``7`` a string where the field wants one (use :data:`Float` / :data:`Int` for numbers)."""

    model_config = COERCING


# ------------------------------------------------------------------------------ errors


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


class _DictOf:
    """A ``dict[str, Model]`` level (its keys are names the user chose, its values ``model``)."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model


def _inner_model(tp: Any) -> Any:
    """The model inside a field's annotation: ``Model``, ``Model | None`` -> Model; ``dict[str, Model]``
    -> _DictOf(Model); anything else -> None."""

    if _is_model(tp):
        return tp
    for arg in typing.get_args(tp):
        found = _inner_model(arg)
        if found is not None:
            return _DictOf(found) if typing.get_origin(tp) is dict else found
    return None


def _allowed_at(schema: Any, loc: tuple) -> list[str] | None:
    """The field names of the (nested) model at ``loc`` (a pydantic error location), if known."""
    cur: Any = schema
    for part in loc:
        if isinstance(cur, _DictOf):  # the part is a mapping key: its value is the model
            cur = cur.model
        elif _is_model(cur) and part in cur.model_fields:
            cur = _inner_model(cur.model_fields[part].annotation)
        else:
            return None
    return sorted(cur.model_fields) if _is_model(cur) else None


def _loc(loc: tuple) -> str:
    """A pydantic location as a key path; the synthetic parts pydantic adds for unions/functions go."""
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))


def error_line(e: ValidationError, schema: Any = None, prefix: str = "") -> str:
    """The first error of ``e`` as ``key.path: problem, got VALUE`` (one line)."""
    errors = e.errors(include_url=False)
    err = next((x for x in errors if x.get("type") == "extra_forbidden"), errors[0])  # unknown keys first
    loc, kind, msg = tuple(err.get("loc", ())), err.get("type", ""), str(err.get("msg", ""))
    path = ".".join(p for p in (prefix, _loc(loc)) if p)
    if kind == "extra_forbidden":
        allowed = _allowed_at(schema, loc[:-1]) if schema is not None else None
        text = "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    elif kind == "missing":
        text = "required but missing"
    elif kind in ("value_error", "assertion_error"):
        text = msg.split(", ", 1)[1] if msg.startswith(("Value error, ", "Assertion failed, ")) else msg
    else:
        msg = re.sub(r" or instance of \w+", "", msg.replace("Input should be", "must be"))
        msg = msg.replace("a valid dictionary", "a mapping").replace("a valid list", "a list")
        msg = msg.replace("a valid boolean", "true or false")
        # pydantic's "..., got a number with a fractional part": say what was got once, with its value
        msg = msg.replace("a valid integer, got a number with a fractional part", "a whole number")
        text = f"{msg}, got {err.get('input')!r}"
    line = f"{path}: {text}" if path else text
    return " ".join(line.split())[:400]


def parse(schema: type[BaseModel], data: Any, where: str, prefix: str = "") -> Any:
    """``data`` validated as ``schema``; else one UserError naming ``where`` and the key path
    (``prefix`` + the error's location)."""
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise UserError(f"{where}: {error_line(e, schema, prefix)}") from None


# ------------------------------------------------------------------------------ shared schemas


class TrainSamplingSchema(Schema):
    """Sampling overrides the trainer accepts per agent (the eval ones add ``enable_thinking``)."""

    temperature: Optional[float] = RANGES["temperature"].field(
        None, description="sampling temperature (0 = greedy), a finite number >= 0")
    top_p: Optional[float] = RANGES["top_p"].field(None, description="nucleus sampling mass, in (0, 1]")
    max_new_tokens: Optional[int] = RANGES["max_new_tokens"].field(None, description="completion tokens per call, >= 1")


class SamplingSchema(TrainSamplingSchema):
    """A team file's ``sampling:`` (team-wide or per agent): only the keys given override."""

    enable_thinking: Optional[bool] = Field(None, description="Qwen3 chat-template thinking switch (true | false)")


def sampling_overrides(data: Any, where: str, schema: type[Schema] = SamplingSchema, prefix: str = "") -> dict[str, Any]:
    """The keys a sampling mapping sets, validated (None or {} -> {}); errors name ``prefix.key``."""
    return parse(schema, data or {}, where, prefix=prefix).model_dump(exclude_unset=True)


def registered(value: Any, known: Any, what: str | None = None) -> Any:
    """A validator body: ``value`` must be a name in the registry ``known`` (a mapping or sequence).
    The error reads "unknown WHAT 'x'; known: ..." when ``what`` is given, else "must be one of ..."."""
    if value not in known:
        names = ", ".join(known)
        raise ValueError(f"unknown {what} {value!r}; known: {names}" if what else f"must be one of {names}, got {value!r}")
    return value


class LimitsSchema(Schema):
    """A team file's ``limits:`` (the whole run) or ``agents.NAME.limits:`` (one agent's own calls):
    the run stops cleanly once what it spent reaches one (drmas_bench.limits, docs/eval.md)."""

    max_usd: Optional[YamlFloat] = RANGES["max_usd"].field(
        None, description="dollars under the price sheet (needs --prices); like --max-usd")
    max_tokens: Optional[int] = RANGES["max_tokens"].field(
        None, description="prompt + completion tokens of every call (not per call: that is max_new_tokens); like --max-tokens")


class ModelOnEngine(Schema):
    """The worker-group core shared by eval and training: one model served by one engine."""

    model: str = Field(min_length=1, description="model alias, local folder or hub id")
    engine: str = Field(DEFAULT_ENGINE, description="inference engine, a name in the engine registry (drmas_bench.engines.ENGINES)")

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:

        return registered(v, ENGINES, "engine")


# ------------------------------------------------------------------------------ describing schemas

#: the user-written configs: name -> sections (title, "module:Schema"); imported lazily (the modules
#: import this one). ``drmas-bench config-schema NAME`` prints them; docs/ embeds them.
CONFIG_SCHEMAS: dict[str, tuple[tuple[str, str], ...]] = {
    "team": (("team file (--team FILE, a checkpoint's team.yaml)", "drmas_bench.agents.team:TeamFileSchema"),),
    "prices": (("price sheet (--prices FILE)", "drmas_bench.pricing:PriceSheetSchema"),),
    "prompts": (("prompts file (--prompts FILE, a team file's prompts:)", "drmas_bench.workflows.protocol:PromptsFileSchema"),),
    "train": (("trainer config (--recipe NAME|FILE, --set KEY=VALUE)", "drmas_trainer.config.train:TrainConfig"),
              ("agent settings (agent_defaults: and agents.NAME:)", "drmas_trainer.config.train:AgentConfig")),
}


def config_schema(name: str) -> list[tuple[str, Any]]:
    """The (title, schema class) sections of config ``name`` (a key of :data:`CONFIG_SCHEMAS`)."""

    if name not in CONFIG_SCHEMAS:
        raise UserError(f"unknown config {name!r}; known: {', '.join(CONFIG_SCHEMAS)}")
    out = []
    for title, ref in CONFIG_SCHEMAS[name]:
        module, attr = ref.split(":")
        out.append((title, getattr(importlib.import_module(module), attr)))
    return out


def _type_name(tp: Any) -> str:

    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin is not None:
        args = typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            return " | ".join(_type_name(a) for a in args)
        if origin is typing.Literal:
            return " | ".join(str(a) for a in args)
        name = {dict: "mapping", list: "list", tuple: "list"}.get(origin, getattr(origin, "__name__", str(origin)))
        if origin is dict:
            return f"mapping of {_type_name(args[1])}" if args else name
        return f"{name}[{', '.join(_type_name(a) for a in args)}]" if args else name
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "mapping"
    return {dict: "mapping", str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp, getattr(tp, "__name__", str(tp)))


def _shown(default: Any) -> str:
    """A default as YAML writes it (null, true, hf, [0.9, 0.999])."""

    if isinstance(default, tuple):
        default = list(default)
    return yaml.safe_dump(default, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def fields_table(schema: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key path, type, default, description) of every field; nested schemas are expanded in place
    (a ``mapping of Schema`` as ``key.NAME.field``)."""

    rows: list[tuple[str, str, str, str]] = []
    for name, f in schema.model_fields.items():
        key = f"{prefix}{name}"
        default = f.get_default(call_default_factory=True)
        shown = "required" if f.is_required() else ("" if isinstance(default, BaseModel) else _shown(default))
        inner = _inner_model(f.annotation)
        if inner is None:
            rows.append((key, _type_name(f.annotation), shown, f.description or ""))
            continue
        nullable = " | null" if type(None) in typing.get_args(f.annotation) else ""
        rows.append((key, "mapping" + nullable, shown, f.description or ""))
        if isinstance(inner, _DictOf):
            rows.extend(fields_table(inner.model, f"{key}.NAME."))
        else:
            rows.extend(fields_table(inner, f"{key}."))
    return rows


def markdown_table(schema: type[BaseModel]) -> str:
    """The fields of ``schema`` as a markdown table (what docs/ embeds between generated markers)."""
    out = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, tp, default, desc in fields_table(schema):
        cells = [f"`{key}`", tp, f"`{default}`" if default else "", desc]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out) + "\n"


def text_table(schema: type[BaseModel]) -> str:
    """The fields of ``schema`` as plain text for the terminal."""
    rows = fields_table(schema)
    w = max(len(r[0]) for r in rows)
    lines = []
    for key, tp, default, desc in rows:
        head = f"{key:<{w}}  {tp}" + (" (required)" if default == "required" else f" = {default}" if default else "")
        lines.append(head + (f"\n{'':<{w}}    {desc}" if desc else ""))
    return "\n".join(lines) + "\n"


def config_markdown(name: str) -> str:
    """Every section of config ``name`` as markdown: a bold title, then its table."""
    return "\n".join(f"**{title}**\n\n{markdown_table(schema)}" for title, schema in config_schema(name))


_DOC_BLOCK = re.compile(r"(<!-- config-schema:(\w+) -->\n)(.*?)(<!-- /config-schema -->)", re.S)


def update_docs(text: str) -> str:
    """``text`` (a docs page) with every ``<!-- config-schema:NAME -->`` ... ``<!-- /config-schema -->``
    block regenerated from the schemas (``scripts/gen_config_docs.py`` writes it; a test compares)."""
    return _DOC_BLOCK.sub(lambda m: m.group(1) + config_markdown(m.group(2)) + m.group(4), text)
