"""Price sheets: what one call of a model costs, from a YAML file the user writes (docs/pricing.md).

```yaml
currency: USD            # optional; only USD is supported
default: error           # optional: error (default) | zero  -- what an unlisted model costs
models:
  qwen2.5-7b-instruct:   # the worker group's model name, as recorded in each turn's `wg`
    input_per_1m: 0.30   # $ per 1M prompt tokens
    output_per_1m: 0.30  # $ per 1M completion tokens
  my-self-hosted-model:
    gpu_hour: 2.50       # $ per GPU-hour, charged on the call's latency
    gpus: 1              # GPUs the model occupies (default 1)
```

Prices are numbers; ``3e-1`` (which YAML 1.1 reads as a string) counts as 0.3, as in the trainer's
config. `PriceSheet.cost(model, prompt_tokens, completion_tokens, gpu_seconds=0.0)` adds the token prices
and `gpu_hour * gpus * gpu_seconds / 3600`. A model missing from the sheet is an error that names
the model and the sheet, unless the sheet says `default: zero`; then it costs 0 and is listed in
`PriceSheet.unpriced` so reports can say so.

What a call costs is defined here once: :func:`call_cost` (one call, live ``Completion`` or
recorded ``records.CallView``), :func:`turn_cost` (a recorded turn, priced as its worker group),
:func:`trajectory_cost` (an episode's known calls); :func:`team_prices` reads a sheet and checks
it covers a team's worker groups before a run starts. The file is parsed by :class:`PriceSheetSchema`
(``drmas-bench config-schema prices``). Lookup tries the exact name, then the name without
case, then the part after the last "/" (`Qwen/Qwen2.5-7B-Instruct` finds `qwen2.5-7b-instruct`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from drmas_bench.records import TurnView
from drmas_bench.schema import Schema, YamlFloat, parse
from drmas_bench.types import UserError
from drmas_bench.yamlfile import read_yaml

DEFAULTS = ("error", "zero")


class ModelPriceSchema(Schema):
    """One model's entry under ``models:`` (all prices in USD; at least one key)."""

    input_per_1m: YamlFloat = Field(0.0, ge=0, allow_inf_nan=False, description="$ per 1M prompt tokens")
    output_per_1m: YamlFloat = Field(0.0, ge=0, allow_inf_nan=False, description="$ per 1M completion tokens")
    gpu_hour: YamlFloat = Field(0.0, ge=0, allow_inf_nan=False,
                            description="$ per GPU-hour (self-hosted models), charged on each call's latency")
    gpus: YamlFloat = Field(1.0, gt=0, allow_inf_nan=False, description="GPUs one replica of the model occupies")

    @model_validator(mode="before")
    @classmethod
    def _some_price(cls, d: Any) -> Any:
        if isinstance(d, dict) and not d:
            raise ValueError(f"expected a mapping with some of {', '.join(cls.model_fields)}")
        return d


class PriceSheetSchema(Schema):
    """A price sheet file (docs/pricing.md)."""

    currency: Literal["USD"] = Field("USD", description="only USD is supported")
    default: Literal[DEFAULTS] = Field(
        "error", description="what a model missing from the sheet costs: error (stop and name it) | zero ($0, listed as unpriced)")
    models: dict[str, ModelPriceSchema] = Field(description="model name (as recorded in each turn's `wg`) -> its prices")
    note: Optional[str] = Field(None, description="free text (e.g. where the prices come from); ignored")


@dataclass(frozen=True)
class ModelPrice:
    """Prices of one model (all in USD)."""

    input_per_1m: float = 0.0  # per 1M prompt tokens
    output_per_1m: float = 0.0  # per 1M completion tokens
    gpu_hour: float = 0.0  # per GPU-hour (self-hosted models)
    gpus: float = 1.0  # GPUs one replica occupies

    def cost(self, prompt_tokens: int, completion_tokens: int, gpu_seconds: float = 0.0) -> float:
        return (
            prompt_tokens * self.input_per_1m / 1e6
            + completion_tokens * self.output_per_1m / 1e6
            + self.gpu_hour * self.gpus * gpu_seconds / 3600.0
        )


@dataclass
class PriceSheet:
    """Model name -> ModelPrice, plus what to do with unlisted models (see the module docstring)."""

    models: dict[str, ModelPrice]
    default: str = "error"  # "error" | "zero"
    source: str = "<price sheet>"
    unpriced: set[str] = field(default_factory=set)  # models costed at zero through `default: zero`
    aliases: dict[str, str] = field(default_factory=dict)  # e.g. worker-group name -> its model's price key

    def with_aliases(self, aliases: dict[str, str]) -> "PriceSheet":
        """The same sheet, where each alias (e.g. a run's worker-group names) prices as its target."""
        return PriceSheet(self.models, self.default, self.source, self.unpriced, {**self.aliases, **aliases})

    def lookup(self, model: str) -> ModelPrice | None:
        model = self.aliases.get(model, model)
        if model in self.models:
            return self.models[model]
        folded = {k.lower(): v for k, v in self.models.items()}
        for name in (model.lower(), model.rsplit("/", 1)[-1].lower()):
            if name in folded:
                return folded[name]
        return None

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int, gpu_seconds: float = 0.0) -> float:
        """Dollars for one call of `model`. Unknown model: UserError, or 0 with `default: zero`."""
        price = self.lookup(model)
        if price is None:
            if self.default == "zero":
                self.unpriced.add(model)
                return 0.0
            known = ", ".join(sorted(self.models)) or "none"
            name = f"{self.aliases[model]!r} (worker group {model!r})" if model in self.aliases else repr(model)
            raise UserError(
                f"model {name} has no price in {self.source} (priced: {known}); "
                f"add it under `models:` or set `default: zero` to cost unlisted models at $0"
            )
        return price.cost(prompt_tokens, completion_tokens, gpu_seconds)

    @classmethod
    def from_dict(cls, data: Any, source: str = "<price sheet>") -> "PriceSheet":
        """Validate a parsed sheet (:class:`PriceSheetSchema`); every problem is a one-line UserError
        naming the key."""
        if not isinstance(data, dict):
            raise UserError(f"{source}: expected a mapping with a `models:` key, got {type(data).__name__}")
        sheet = parse(PriceSheetSchema, {str(k): v for k, v in data.items()}, source)
        parsed = {name: ModelPrice(**p.model_dump()) for name, p in sheet.models.items()}
        return cls(parsed, default=sheet.default, source=source)


def load_prices(path: str | Path) -> PriceSheet:
    """Read and validate a YAML price sheet (see the module docstring for the format)."""

    return PriceSheet.from_dict(read_yaml(path, "price sheet"), source=str(path))


def team_prices(path: str | Path, team: Any) -> PriceSheet:
    """The price sheet at ``path``, each of ``team``'s worker groups priced as its model (turns record
    their worker group), checked now: a model the sheet lacks fails before the run, not after it."""
    prices = load_prices(path).with_aliases({n: g.price_key for n, g in team.worker_groups.items()})
    for name in team.worker_groups:
        prices.cost(name, 0, 0)
    return prices


def call_cost(call: Any, prices: PriceSheet, name: str) -> float | None:
    """One call's dollars under ``prices`` entry ``name``: its prompt / completion tokens and (for
    GPU-hour prices) its latency. ``call``: a live ``types.Completion`` or a recorded
    ``records.CallView`` (both carry ``usage``, ``cache_hit``, the token counts and ``latency_s``).
    None when its usage is unknown (such a call has no price, and $0 would be a lie); $0 when the
    call cache served it (this run paid nothing; the original dollars are ``cached_usd``)."""
    if call.usage == "unknown":
        prices.cost(name, 0, 0)  # an unpriced model is still an error (or listed as unpriced)
        return None
    if call.cache_hit:
        prices.cost(name, 0, 0)
        return 0.0
    return prices.cost(name, call.prompt_tokens, call.completion_tokens, call.latency_s)


def turn_cost(turn: Any, prices: PriceSheet, key: str | None = None) -> float | None:
    """One recorded call's dollars (:func:`call_cost`): ``prices`` entry ``key`` (default: the turn's
    worker group ``wg``); the turn a ``records.TurnView`` or a stored turn dict."""
    t = TurnView.of(turn)
    return call_cost(t.call, prices, (t.wg or "") if key is None else key)


def trajectory_cost(traj: Any, prices: PriceSheet) -> float:
    """A live trajectory's known calls' dollars (a call of unknown usage adds nothing; the summary
    says when some were unknown)."""
    return sum(call_cost(t.completion, prices, t.wg) or 0.0 for t in traj.turns)
