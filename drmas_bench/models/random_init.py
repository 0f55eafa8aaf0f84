"""The tiny models' one initialisation (``tiny.build_tiny_random``, ``tiny_llama.build_tiny_random_llama``):
weights that depend on a seed alone, whatever the global RNG holds. Imports torch: the builders
import it when they build."""

from __future__ import annotations

from typing import Any

import torch


def seeded_random_model(model_class: Any, config: Any, seed: int) -> Any:
    """``model_class(config)`` with every parameter drawn from one ``torch.Generator`` seeded with
    ``seed``, in parameter-name order: norm weights 1, biases 0, the rest N(0, 0.02^2) in float32.
    The global RNG is left untouched (construction draws from it); tied weights are one parameter,
    drawn once."""
    with torch.random.fork_rng(devices=[]):  # construction inits with the global RNG: leave it untouched
        model = model_class(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.02)
    return model
