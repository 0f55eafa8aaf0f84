"""``tiny-random-llama``: a ~0.8M-parameter Llama with random weights and its OWN tokenizer, for
heterogeneous teams in tests and CI (a Qwen2 ``tiny-random`` and this model train side by side, each
worker group with its own vocabulary, ids and chat template).

Everything differs from ``tiny-random`` where a real Llama differs from a real Qwen: the architecture
(``LlamaForCausalLM``: no q/k/v biases, plain multi-head attention, tied embeddings, as Llama-3.2),
the special tokens and the chat template (Llama 3's ``<|begin_of_text|>``, ``<|start_header_id|>``
.. ``<|end_header_id|>``, ``<|eot_id|>``), and the vocabulary (a byte-level BPE of 1,536 tokens
trained on the same built-in text, with Llama-formatted conversations instead of ChatML ones), so
that the same text has other ids under each tokenizer. Deterministic like ``tiny-random``: the
tokenizer does not depend on the seed, the weights come from ``torch.Generator().manual_seed(seed)``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drmas_bench.models.model_cache import progress
from drmas_bench.models.tiny import TINY_DEFAULT_SEED, tiny_corpus, train_tiny_tokenizer

#: Llama 3's special tokens (their ids here: 0..5, in this order); pad is Llama 3.1's own pad token
LLAMA_SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>", "<|finetune_right_pad_id|>"]
LLAMA_VOCAB_SIZE = 1536  # well below tiny-random's 2,458: the same words get other ids

# Llama 3's chat layout (without its default "Cutting Knowledge Date" system block): the bos token, then
# per message a header and the content closed by <|eot_id|>
LLAMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def llama_corpus() -> list[str]:
    """:func:`tiny_corpus` with its ChatML conversations replaced by Llama-3-formatted ones."""
    rng = random.Random(20250301)
    lines = [ln for ln in tiny_corpus() if "<|im_start|>" not in ln]
    for _ in range(300):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        lines.append(f"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is {a} + {b}?<|eot_id|>"
                     f"<|start_header_id|>assistant<|end_header_id|>\n\n{a} + {b} = {a + b}.<|eot_id|>")
    return lines


def train_llama_tokenizer(vocab_size: int = LLAMA_VOCAB_SIZE) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` on :func:`llama_corpus` (digits one by one, the
    :data:`LLAMA_SPECIAL_TOKENS` first)."""
    return train_tiny_tokenizer(vocab_size, LLAMA_SPECIAL_TOKENS, llama_corpus())


def build_tiny_random_llama(dest: Path, seed: int = TINY_DEFAULT_SEED, log: Callable[[str], None] = progress,
                            hidden_size: int = 128, num_layers: int = 3) -> dict[str, Any]:
    """Write a random LlamaForCausalLM + its tokenizer into ``dest``; byte-identical for the same seed
    (with the same transformers / tokenizers / torch versions)."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from drmas_bench.models.tiny_build import save_tiny, seeded_random_model

    dest.mkdir(parents=True, exist_ok=True)
    log(f"tiny-random-llama: training a byte-level BPE tokenizer and building a Llama model (seed {seed})")
    raw = train_llama_tokenizer()
    ids = {t: raw.token_to_id(t) for t in LLAMA_SPECIAL_TOKENS}
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                  pad_token="<|finetune_right_pad_id|>", model_max_length=8192)
    tok.chat_template = LLAMA_CHAT_TEMPLATE
    tok.padding_side = "left"
    config = LlamaConfig(
        vocab_size=raw.get_vocab_size(), hidden_size=hidden_size, intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, rms_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        bos_token_id=ids["<|begin_of_text|>"], eos_token_id=[ids["<|eot_id|>"], ids["<|end_of_text|>"]],
        pad_token_id=ids["<|finetune_right_pad_id|>"], dtype="float32",
    )
    model = seeded_random_model(LlamaForCausalLM, config, seed)  # tied: lm_head.weight is embed_tokens.weight
    saved = save_tiny(dest, model, tok, {"bos_token_id": ids["<|begin_of_text|>"],
                                         "eos_token_id": [ids["<|eot_id|>"], ids["<|end_of_text|>"]],
                                         "pad_token_id": ids["<|finetune_right_pad_id|>"]})
    return {"seed": seed, "parameters": saved.pop("parameters"), "vocab_size": config.vocab_size, "dtype": "float32",
            "architecture": "LlamaForCausalLM", **saved}
