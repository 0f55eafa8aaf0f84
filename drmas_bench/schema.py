"""One schema library for every file a user writes: team files, price sheets, prompts files and the
trainer config are pydantic (v2) models; this module holds the shared pieces.

- :class:`Schema`: the base model (unknown keys are errors, no silent coercion of strings to numbers).
- :func:`parse`: validate a mapping against a schema; the first problem becomes one
  :class:`~drmas_bench.types.UserError` line ``WHERE: key.path: what is wrong, got VALUE`` (never a
  multi-line pydantic dump). An unknown key names itself and lists the allowed ones.
- :class:`SamplingSchema` / :class:`TrainSamplingSchema`: the per-agent sampling overrides that team
  files (eval) and the trainer config share; :class:`ModelOnEngine`: the worker-group core (one
  model on one engine) that a team file's worker group and a trainer agent both extend.
- :func:`fields_table` / :func:`markdown_table`: every field with its type, default and
  description, for ``drmas-bench config-schema`` and the tables in docs/ (tests/test_schema.py
  checks that the docs match).
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields as dc_fields, is_dataclass
from typing import Annotated, Any, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from drmas_bench.types import UserError


class Schema(BaseModel):
    """Base of every user-file schema: unknown keys are errors; values are taken as YAML gives them."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=False)


def _no_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {v!r}")
    return v


#: numbers that may arrive as strings (YAML 1.1 reads ``1e-6`` as one; ``--set`` values) but never as booleans
Float = Annotated[float, BeforeValidator(_no_bool)]
Int = Annotated[int, BeforeValidator(_no_bool)]
#: config of schemas whose values are coerced (the trainer config: recipes and ``--set`` overrides)
COERCING = ConfigDict(extra="forbid", strict=False, coerce_numbers_to_str=True)


class CoercingSchema(Schema):
    """Base of the trainer config sections: like :class:`Schema`, but ``"1e-6"`` is a float, ``"true"``
    a boolean and ``7`` a string where the field wants one (use :data:`Float` / :data:`Int` for numbers)."""

    model_config = COERCING


# ------------------------------------------------------------------------------ errors


def _allowed_at(schema: Any, loc: tuple) -> list[str] | None:
    """The field names of the (nested) model at ``loc`` (a pydantic error location), if known."""
    cur: Any = schema
    for part in loc:
        if isinstance(part, int) or cur is None:
            return None
        info = _model_fields(cur).get(part)
        if info is None:
            cur = _value_type(cur)  # a dict[str, Model] level: the key is the mapping key
            continue
        cur = _inner_model(info)
    return sorted(_model_fields(cur)) if cur is not None else None


def _model_fields(tp: Any) -> dict[str, Any]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return dict(tp.model_fields)
    if is_dataclass(tp):
        return {f.name: f.type for f in dc_fields(tp)}
    return {}


def _inner_model(info: Any) -> Any:
    """The model or dataclass inside a field's annotation (``Model``, ``Model | None``, ``dict[str, Model]``)."""
    import typing

    tp = getattr(info, "annotation", info)
    if isinstance(tp, str):
        return None
    if isinstance(tp, type) and (issubclass(tp, BaseModel) or is_dataclass(tp)):
        return tp
    for arg in typing.get_args(tp):
        found = _inner_model(arg)
        if found is not None:
            return _DictOf(found) if typing.get_origin(tp) is dict else found
    return None


class _DictOf:
    """Marks a ``dict[str, Model]`` level while walking an error location."""

    def __init__(self, model: Any) -> None:
        self.model = model


def _value_type(cur: Any) -> Any:
    return cur.model if isinstance(cur, _DictOf) else None


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
        text = f"{msg}, got {err.get('input')!r}"
    line = f"{path}: {text}" if path else text
    return " ".join(line.split())[:400]


def parse(schema: Any, data: Any, where: str, prefix: str = "") -> Any:
    """``data`` validated as ``schema`` (a model or a dataclass); else one UserError naming ``where``
    and the key path (``prefix`` + the error's location)."""
    try:
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            return schema.model_validate(data)
        return TypeAdapter(schema).validate_python(data)
    except ValidationError as e:
        raise UserError(f"{where}: {error_line(e, schema, prefix)}") from None


# ------------------------------------------------------------------------------ shared schemas


class TrainSamplingSchema(Schema):
    """Sampling overrides the trainer accepts per agent (the eval ones add ``enable_thinking``)."""

    temperature: Optional[float] = Field(None, ge=0, allow_inf_nan=False,
                                         description="sampling temperature (0 = greedy), a finite number >= 0")
    top_p: Optional[float] = Field(None, gt=0, le=1, description="nucleus sampling mass, in (0, 1]")
    max_new_tokens: Optional[int] = Field(None, ge=1, description="completion tokens per call, >= 1")


class SamplingSchema(TrainSamplingSchema):
    """A team file's ``sampling:`` (team-wide or per agent): only the keys given override."""

    enable_thinking: Optional[bool] = Field(None, description="Qwen3 chat-template thinking switch (true | false)")


def sampling_overrides(data: Any, where: str, schema: type[Schema] = SamplingSchema, prefix: str = "") -> dict[str, Any]:
    """The keys a sampling mapping sets, validated (None or {} -> {}); errors name ``prefix.key``."""
    return parse(schema, data or {}, where, prefix=prefix).model_dump(exclude_unset=True)


class ModelOnEngine(Schema):
    """The worker-group core shared by eval and training: one model served by one engine."""

    model: str = Field(min_length=1, description="model alias, local folder or hub id")
    engine: str = Field("hf", description="inference engine, a name in the engine registry (drmas_bench.engines.ENGINES)")

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        from drmas_bench.engines import ENGINES

        if v not in ENGINES:
            raise ValueError(f"unknown engine {v!r}; known: {', '.join(ENGINES)}")
        return v


# ------------------------------------------------------------------------------ describing schemas


def _type_name(tp: Any) -> str:
    import typing

    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin is not None:
        args = typing.get_args(tp)
        if origin in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)):
            return " | ".join(_type_name(a) for a in args)
        if origin is typing.Literal:
            return " | ".join(str(a) for a in args)
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]" if args else name
    return getattr(tp, "__name__", str(tp))


def fields_table(schema: Any, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key path, type, default, description) for every field, nested models expanded in place."""
    rows: list[tuple[str, str, str, str]] = []
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        items = [(n, f.annotation, f.get_default(call_default_factory=True) if not f.is_required() else MISSING,
                  f.description or "") for n, f in schema.model_fields.items()]
    else:
        items = []
        hints = __import__("typing").get_type_hints(schema, include_extras=True)
        for f in dc_fields(schema):
            default = f.default if f.default is not MISSING else (
                f.default_factory() if f.default_factory is not MISSING else MISSING)
            items.append((f.name, hints[f.name], default, _description(hints[f.name])))
    for name, tp, default, desc in items:
        inner = _inner_model(tp)
        key = f"{prefix}{name}"
        if inner is not None and not isinstance(inner, _DictOf) and (default is MISSING or _is_model_value(default)):
            rows.append((key, "section", "", desc))
            rows.extend(fields_table(inner, key + "."))
            continue
        shown = "required" if default is MISSING else ("" if _is_model_value(default) else repr(default))
        rows.append((key, _type_name(tp), shown, desc))
    return rows


def _is_model_value(v: Any) -> bool:
    return isinstance(v, BaseModel) or (is_dataclass(v) and not isinstance(v, type))


def _description(tp: Any) -> str:
    import typing

    for meta in getattr(tp, "__metadata__", ()):
        if getattr(meta, "description", None):
            return meta.description
    return ""


def markdown_table(schema: Any) -> str:
    """The fields of ``schema`` as a markdown table (what docs/ embeds between generated markers)."""
    out = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, tp, default, desc in fields_table(schema):
        cells = [f"`{key}`", tp, f"`{default}`" if default else "", desc]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out) + "\n"


def text_table(schema: Any) -> str:
    """The fields of ``schema`` as plain text for the terminal."""
    rows = fields_table(schema)
    w = max(len(r[0]) for r in rows)
    lines = []
    for key, tp, default, desc in rows:
        head = f"{key:<{w}}  {tp}" + (f" = {default}" if default else "")
        lines.append(head + (f"\n{'':<{w}}    {desc}" if desc else ""))
    return "\n".join(lines) + "\n"
