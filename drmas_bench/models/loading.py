"""Loading a resolved model with its tokenizer, one greedy chat turn (``models chat``), and the
tokenizer check eval runs on every local model folder before any call (``check_tokenizer_dir``)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drmas_bench.models.names import ALIASES, resolve_model
from drmas_bench.types import UserError

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


# transformers' from_pretrained sets torch's process-wide default dtype to the load dtype and puts
# the old one back afterwards. Two loads in two threads (the pool wakes worker groups concurrently;
# the trainer loads policies beside engines) interleave those set/restore pairs, and the process
# can be left with bfloat16 as its default dtype: every later `torch.tensor(...)` is then bf16 and
# fp32 matmuls fail with "mat1 and mat2 must have the same dtype". Loads go through this lock.
_LOAD_LOCK = threading.Lock()


def load_causal_lm(path: str, **kwargs: Any) -> Any:
    """``AutoModelForCausalLM.from_pretrained(path, **kwargs)``, one load at a time per process, with
    torch's default dtype unchanged afterwards (``dtype=`` falls back to ``torch_dtype=`` on
    transformers < 4.56)."""
    import torch

    with _LOAD_LOCK:  # the import too: transformers' lazy modules are not safe to first-import in threads
        from transformers import AutoModelForCausalLM

        default = torch.get_default_dtype()
        try:
            try:
                return AutoModelForCausalLM.from_pretrained(path, **kwargs)
            except TypeError:
                if "dtype" not in kwargs:
                    raise
                kwargs = dict(kwargs)
                kwargs["torch_dtype"] = kwargs.pop("dtype")
                return AutoModelForCausalLM.from_pretrained(path, **kwargs)
        finally:
            torch.set_default_dtype(default)


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


# a text every chat model's tokenizer encodes and decodes back (words, digits, punctuation)
TOKENIZER_PROBE = "The quick brown fox jumps over the lazy dog: 12 + 30 = 42."


def check_tokenizer(tok: Any, where: str) -> None:
    """One UserError unless ``tok`` round-trips :data:`TOKENIZER_PROBE` (spaces and case aside).

    transformers builds a tokenizer even from a folder whose vocabulary files are gone (a
    checkpoint without tokenizer.json loads as 2 special tokens): every prompt then encodes to a
    couple of tokens, the model answers garbage, and the run is graded as if it were real."""
    try:
        ids = tok.encode(TOKENIZER_PROBE, add_special_tokens=False)
        back = tok.decode(ids, skip_special_tokens=True)
    except Exception as e:  # noqa: BLE001 - any failure here means the tokenizer cannot be used
        raise UserError(f"{where}: the tokenizer cannot encode text ({type(e).__name__}: {e})") from None
    squash = lambda t: "".join(str(t).split()).casefold()  # noqa: E731
    if not ids or squash(back) != squash(TOKENIZER_PROBE):
        size = len(tok) if hasattr(tok, "__len__") else "?"
        raise UserError(f"{where}: the tokenizer does not work ({size} tokens in its vocabulary; a test sentence "
                        f"came back as {back[:40]!r}); are tokenizer.json / the vocabulary files missing?")


def check_tokenizer_dir(folder: str | os.PathLike[str], where: str, trust_remote_code: bool = False) -> None:
    """Load the tokenizer of a local model folder and :func:`check_tokenizer` it; one UserError if
    either fails. ``where`` names the folder's role in the message."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - missing, broken or foreign files: one line
        text = str(e).strip()
        raise UserError(f"{where}: cannot load the tokenizer in {folder} "
                        f"({type(e).__name__}: {text.splitlines()[0] if text else ''})") from None
    check_tokenizer(tok, f"{where} ({folder})")


def load_model_and_tokenizer(name: str | os.PathLike[str], device: str = "cpu",
                             dtype: Any = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) for a name :func:`resolve_model` accepts, ready for batched generation:
    model in eval mode on ``device``; tokenizer with left padding and a pad token.

    ``dtype``: None (the checkpoint's own), "auto", "float32", "bfloat16", "float16" or a torch dtype.
    """
    from transformers import AutoTokenizer


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
    check_tokenizer(tok, f"model {os.fspath(name)!r}")
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
