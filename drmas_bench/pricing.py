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

`PriceSheet.cost(model, prompt_tokens, completion_tokens, gpu_seconds=0.0)` adds the token prices
and `gpu_hour * gpus * gpu_seconds / 3600`. A model missing from the sheet is an error that names
the model and the sheet, unless the sheet says `default: zero`; then it costs 0 and is listed in
`PriceSheet.unpriced` so reports can say so. Lookup tries the exact name, then the name without
case, then the part after the last "/" (`Qwen/Qwen2.5-7B-Instruct` finds `qwen2.5-7b-instruct`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drmas_bench.types import UserError

MODEL_KEYS = ("input_per_1m", "output_per_1m", "gpu_hour", "gpus")
TOP_KEYS = ("currency", "default", "models", "note")
DEFAULTS = ("error", "zero")


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
        """Validate a parsed sheet; every problem is a one-line UserError naming the key."""
        if not isinstance(data, dict):
            raise UserError(f"{source}: expected a mapping with a `models:` key, got {type(data).__name__}")
        for key in data:
            if key not in TOP_KEYS:
                raise UserError(f"{source}: unknown key {key!r} (known: {', '.join(TOP_KEYS)})")
        currency = data.get("currency", "USD")
        if currency != "USD":
            raise UserError(f"{source}: currency: only USD is supported, got {currency!r}")
        default = data.get("default", "error")
        if default not in DEFAULTS:
            raise UserError(f"{source}: default: expected one of {', '.join(DEFAULTS)}, got {default!r}")
        models = data.get("models")
        if not isinstance(models, dict):
            raise UserError(f"{source}: models: expected a mapping of model name -> prices, got {type(models).__name__}")
        parsed = {str(name): _model_price(entry, f"{source}: models.{name}") for name, entry in models.items()}
        return cls(parsed, default=default, source=source)


def _model_price(entry: Any, where: str) -> ModelPrice:
    if not isinstance(entry, dict) or not entry:
        raise UserError(f"{where}: expected a mapping with some of {', '.join(MODEL_KEYS)}")
    values: dict[str, float] = {}
    for key, value in entry.items():
        if key not in MODEL_KEYS:
            raise UserError(f"{where}.{key}: unknown key (known: {', '.join(MODEL_KEYS)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise UserError(f"{where}.{key}: expected a non-negative number, got {value!r}")
        values[key] = float(value)
    if values.get("gpus", 1.0) <= 0:
        raise UserError(f"{where}.gpus: expected a positive number, got {values['gpus']!r}")
    return ModelPrice(**values)


def load_prices(path: str | Path) -> PriceSheet:
    """Read and validate a YAML price sheet (see the module docstring for the format)."""
    from drmas_bench.yamlfile import read_yaml

    return PriceSheet.from_dict(read_yaml(path, "price sheet"), source=str(path))
