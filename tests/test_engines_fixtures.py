"""Fixtures shared by the engine tests (imported by tests/test_engines*.py; it holds no tests).

``tiny_model_dir`` is ``drmas_bench.models.resolve_model("tiny-random")`` when that module exists;
otherwise a tiny Qwen2 checkpoint with a byte-level ChatML tokenizer is built here, offline, in
a second.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_qwen2(out: Path) -> Path:
    """Write a random 2-layer Qwen2 model + byte-level ChatML tokenizer to ``out``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML
    )
    fast.save_pretrained(out)
    ids = {s: fast.convert_tokens_to_ids(s) for s in specials}
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"]
    )
    model.save_pretrained(out)
    (out / "drmas_fixture.json").write_text(json.dumps({"built_by": "tests/test_engines_fixtures.py"}))
    return out


def tiny_model_path(tmp_root: Path) -> Path:
    """The tiny checkpoint directory: the project's ``tiny-random`` alias when available."""
    try:
        from drmas_bench.models import resolve_model  # type: ignore[import-not-found]
    except ImportError:
        return build_tiny_qwen2(tmp_root / "tiny-qwen2")
    got = resolve_model("tiny-random")
    path = getattr(got, "path", got)
    return Path(path)


# A chat template that branches on enable_thinking the way Qwen3's does: with thinking off, the
# generation prompt carries an empty think block (written here; only the branch matters).
THINKING_CHATML = CHATML.replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}",
)
EMPTY_THINK = "<think>\n\n</think>\n\n"


def thinking_model_path(tiny: Path, out: Path) -> Path:
    """A copy of the tiny checkpoint whose tokenizer has ``THINKING_CHATML`` as its chat template."""
    import shutil

    from transformers import AutoTokenizer

    if not (out / "config.json").is_file():
        shutil.copytree(tiny, out, dirs_exist_ok=True)
        (out / "chat_template.jinja").unlink(missing_ok=True)
        tok = AutoTokenizer.from_pretrained(out)
        tok.chat_template = THINKING_CHATML
        tok.save_pretrained(out)
    return out
