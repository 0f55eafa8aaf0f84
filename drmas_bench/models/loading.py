"""Loading a resolved model with its tokenizer, and one greedy chat turn (``models chat``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drmas_bench.models.registry import ALIASES, resolve_model
from drmas_bench.types import UserError

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if dtype is None or dtype == "auto" or isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    try:
        return names[str(dtype)]
    except KeyError:
        raise UserError(f"unknown dtype {dtype!r}; use one of: auto, {', '.join(names)}") from None


def load_model_and_tokenizer(name: str | os.PathLike[str], device: str = "cpu",
                             dtype: Any = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) for a name :func:`resolve_model` accepts, ready for batched generation:
    model in eval mode on ``device``; tokenizer with left padding and a pad token.

    ``dtype``: None (the checkpoint's own), "auto", "float32", "bfloat16", "float16" or a torch dtype.
    """
    from transformers import AutoTokenizer

    from drmas_bench.engines.base import load_causal_lm

    src = resolve_model(name)
    if isinstance(src, Path) and (src / "team.yaml").is_file() and not (src / "config.json").is_file():
        raise UserError(f"{name}: is a trained team (team.yaml), not one model; load it as a team")

    def load_error(e: Exception) -> UserError:  # unreachable hub, missing or broken files: one line + fix
        text = str(e).strip()
        first = text.splitlines()[0] if text else type(e).__name__
        hint = ""
        if isinstance(src, str):  # a hub id
            hint = f" (no network? set HF_HUB_OFFLINE=1 and use a cached model or an alias: {', '.join(ALIASES)})"
        return UserError(f"cannot load model {os.fspath(name)!r}: {first}{hint}")

    try:
        tok = AutoTokenizer.from_pretrained(str(src))
    except (OSError, ValueError) as e:
        raise load_error(e) from None
    tok.padding_side = "left"
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise UserError(f"{name}: tokenizer has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    kwargs: dict[str, Any] = {}
    td = _torch_dtype(dtype)
    if td is not None:
        kwargs["dtype"] = td
    try:
        model = load_causal_lm(str(src), **kwargs)
    except (OSError, ValueError) as e:
        raise load_error(e) from None
    model.to(device)
    model.eval()
    gc = model.generation_config
    if gc.pad_token_id is None:
        gc.pad_token_id = tok.pad_token_id
    return model, tok


def chat(model: PreTrainedModel, tok: PreTrainedTokenizerBase, messages: list[dict[str, str]] | str,
         max_new_tokens: int = 64, greedy: bool = True) -> str:
    """One chat turn: apply the chat template, generate, return the decoded answer (stripped).

    ``messages`` is a chat list or a plain string (taken as one user message). ``greedy=False``
    samples with the model's generation config.
    """
    import torch

    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
    gen: dict[str, Any] = {"max_new_tokens": max_new_tokens, "pad_token_id": tok.pad_token_id}
    if greedy:
        gen.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        gen.update(do_sample=True)
    with torch.no_grad():
        out = model.generate(**enc, **gen)
    return tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()
