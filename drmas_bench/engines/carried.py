"""The engine options a trained checkpoint carries: the ones that shape its numbers.

A Hugging Face model folder records ``torch_dtype`` in its config; our checkpoints record, per
worker group of ``team.yaml``, the engine options the rollouts and validations ran with that change
a completion's tokens or its numbers::

    worker_groups:
      solver: {model: models/solver, engine: hf, options: {dtype: bfloat16, batch_invariant: true}}

- :func:`carried_options` (the trainer, when it writes ``team.yaml``): of the options a worker
  group's engine was made with, those in :data:`CARRIED` that its engine has, each at the value
  given or else the engine's default (so a later change of a default does not change what an old
  checkpoint meant); unset mappings and lists (``None``) are left out.
- :func:`check_carried` (eval, reading the ``team.yaml`` inside a ``--model`` folder, which is data):
  only the names in :data:`CARRIED` (and ``trust_remote_code``, which its own flag governs), each
  with a value its check accepts; anything else is one line naming the group, the option and what
  a checkpoint may carry.
- :func:`describe` : the one line eval prints of what it used and from where.

Output-neutral options (``max_batch``, memory fractions, sleeping) are not carried: they are the
machine's, not the model's. Engine knowledge is asked of the engine classes (their ``Options``), never
by an engine's name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from drmas_bench.engines import engine_class
from drmas_bench.types import UserError

_SCALARS = (str, int, float, bool, type(None))
_GONE = object()  # an option a flag removed (another engine)


def _dtype(v: Any) -> bool:
    return v in ("auto", "float32", "bfloat16", "float16")


def _flag(v: Any) -> bool:
    return isinstance(v, bool)


def _kwargs(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, _SCALARS) for k, x in v.items())


def _token_ids(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


# option -> (its check, what a valid value is, for the refusal)
CARRIED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "dtype": (_dtype, "auto, float32, bfloat16 or float16"),
    "batch_invariant": (_flag, "true or false"),  # hf: a request's numbers do not depend on its batch
    "deterministic": (_flag, "true or false"),  # sglang: its deterministic inference
    "chat_template_kwargs": (_kwargs, "a mapping of names to plain values"),
    "eos_token_ids": (_token_ids, "a list of token ids"),
}
GOVERNED_ELSEWHERE = ("trust_remote_code",)  # a team.yaml's value is refused or allowed by --trust-remote-code


def _fields(kind: str) -> dict[str, Any]:
    cls: Any = engine_class(kind)
    return {f.name: f for f in dataclasses.fields(cls.Options)}


def _default(f: Any) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def carried_options(kind: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of an engine of ``kind`` made with ``options`` that a checkpoint records (see the
    module docstring), in :data:`CARRIED`'s order."""
    given = {k.replace("-", "_"): v for k, v in options.items()}
    fields = _fields(kind)
    out = {}
    for name in CARRIED:
        if name in fields:
            value = given[name] if name in given else _default(fields[name])
            if value is not None:
                out[name] = value
    return out


def check_carried(groups: Mapping[str, Any], where: str) -> None:
    """Refuse, in one line, an option of a checkpoint's worker group (``groups``: name -> a spec with
    ``engine`` and ``options``) that a checkpoint does not carry, or a carried one with a bad value."""
    for name, g in groups.items():
        for key, value in (g.options or {}).items():
            k = key.replace("-", "_")
            if k in GOVERNED_ELSEWHERE:
                continue
            if k not in CARRIED:
                raise UserError(f"{where}: worker group {name!r} sets options.{key}, which a team.yaml inside a model "
                                 f"folder may not set (it may carry: {', '.join(CARRIED)}); pass that team file "
                                 f"explicitly with --team if you trust it")
            ok, what = CARRIED[k]
            if not ok(value):
                raise UserError(f"{where}: worker group {name!r}: options.{key} must be {what}, got {repr(value)[:80]}")


def describe(recorded: Mapping[str, Mapping[str, Any]], used: Mapping[str, Mapping[str, Any]]) -> str:
    """One line: the engine options a checkpoint carried (``recorded``, per worker group) and those the
    run uses (``used``: the groups' options after the user's flags) where a flag changed them."""
    if not any(recorded.values()):
        return "engine options: the checkpoint records none (an older team.yaml): the engine's defaults and your flags"

    def fmt(opts: Mapping[str, Any]) -> str:
        return ", ".join(f"{k}={v}" for k, v in opts.items()) or "none"

    def per_group(d: Mapping[str, Mapping[str, Any]]) -> str:
        texts = {n: fmt(o) for n, o in d.items()}
        if len(set(texts.values())) == 1:
            return next(iter(texts.values()))
        return "; ".join(f"{n}: {t}" for n, t in texts.items())

    line = f"engine options from the checkpoint: {per_group(recorded)}"
    changed = {n: {k: used[n][k] if k in used.get(n, {}) else "(left out)" for k, v in o.items()
                   if used.get(n, {}).get(k, _GONE) != v} for n, o in recorded.items()}
    if any(changed.values()):
        line += f" (your flags changed: {per_group({n: c for n, c in changed.items() if c})})"
    return line
