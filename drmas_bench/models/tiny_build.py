"""What the tiny models' builders (``tiny.build_tiny_random``, ``tiny_llama.build_tiny_random_llama``)
share: weights that depend on a seed alone, whatever the global RNG holds (``seeded_random_model``),
and the folder written with the tokenizer beside the model (``save_tiny``). Imports torch and
transformers: the builders import it when they build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers


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


def save_tiny(dest: Path, model: Any, tok: Any, generation: dict[str, Any]) -> dict[str, Any]:
    """Write ``model`` (with a generation config of ``generation``'s token ids) and ``tok`` into
    ``dest``; returns its parameter count and the library versions that make it byte-identical."""
    model.generation_config = transformers.GenerationConfig(**generation)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return {"parameters": sum(p.numel() for p in model.parameters()), "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "torch": torch.__version__.split("+")[0]}
