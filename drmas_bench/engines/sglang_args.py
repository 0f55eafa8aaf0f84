"""The ``sglang`` engine's options and its pure translations (no SGLang import): options -> ``ServerArgs``
(the ``deterministic`` mode's fields and checks, the LoRA fields), ``Sampling`` -> ``sampling_params``,
a batch -> ``async_generate``'s keywords, an output dict -> ``Completion``. ``engines.sglang`` holds the
engine itself and re-exports these; each is tested without a GPU."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from drmas_bench.checkpoints.adapter_names import ADAPTER_CONFIG
from drmas_bench.engines.base import EngineError
from drmas_bench.log import squeeze
from drmas_bench.models.adapter_layout import resolve_base
from drmas_bench.types import Completion, Request, Sampling

INSTALL_HINT = "the sglang engine needs SGLang: pip install 'drmas-bench[sglang]'"
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # SGLang's --dtype choices
# sglang 0.5.23 srt/arg_groups/choices.py DETERMINISTIC_ATTENTION_BACKEND_CHOICES: the attention backends it
# accepts with enable_deterministic_inference (srt/arg_groups/overrides.py _deterministic_attention_backend
# raises a ValueError for any other)
DETERMINISTIC_BACKENDS = ("ascend", "fa3", "fa4", "flashinfer", "intel_xpu", "triton")
# the one chosen when none is given: it runs on every CUDA GPU (fa3 needs Hopper, which SGLang's own
# fallback assumes) and keeps the radix cache (RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND)
DETERMINISTIC_DEFAULT_BACKEND = "triton"
# the sampling backends deterministic inference keeps (overrides.py _deterministic_sampling_backend sets
# "pytorch" over any other but "ascend")
DETERMINISTIC_SAMPLING = ("pytorch", "ascend")
DEFAULT_MEM_FRACTION = 0.9  # about what SGLang picks on an 80-141 GB GPU (it keeps >= 10 GiB back)


@dataclass
class SGLangOptions:
    """Options of the ``sglang`` engine (see the module docstring for each one)."""

    mem_fraction_static: float | None = None
    tp_size: int = 1
    dtype: str = "auto"
    enable_memory_saver: bool = True
    release_tags: list[str] | None = None
    original_logprobs: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    auto_wake: bool = True
    trust_remote_code: bool = False
    deterministic: bool = False
    engine_args: dict[str, Any] | None = None


def deterministic_args(deterministic: bool, engine_args: dict[str, Any] | None) -> dict[str, Any]:
    """The ``ServerArgs`` the ``deterministic`` option adds (pure): ``enable_deterministic_inference``
    and the attention backend (``engine_args``' own when it names one SGLang supports in that mode).
    ``{}`` without the option. A combination SGLang would refuse (another attention backend) or change
    behind the user's back (another sampling backend), or ``engine_args`` turning the mode off, is an
    ``EngineError`` of one line."""
    extra = dict(engine_args or {})
    if not deterministic:
        return {}
    if extra.get("enable_deterministic_inference") is False:
        raise EngineError("sglang engine: deterministic=true and engine_args enable_deterministic_inference=false "
                          "contradict each other; drop one")
    backend = extra.get("attention_backend") or DETERMINISTIC_DEFAULT_BACKEND
    if backend not in DETERMINISTIC_BACKENDS:
        raise EngineError(f"sglang engine: deterministic=true needs an attention backend SGLang supports for "
                          f"deterministic inference ({', '.join(DETERMINISTIC_BACKENDS)}); engine_args sets "
                          f"attention_backend={backend}")
    sampling = extra.get("sampling_backend")
    if sampling is not None and sampling not in DETERMINISTIC_SAMPLING:
        raise EngineError(f"sglang engine: deterministic=true samples with the pytorch backend; engine_args sets "
                          f"sampling_backend={sampling}, which SGLang would replace")
    return {"enable_deterministic_inference": True, "attention_backend": backend}


def is_deterministic(options: dict[str, Any]) -> bool:
    """Whether SGLang runs its deterministic inference under these options (the option, or
    ``engine_args`` setting the field itself)."""
    return bool(options.get("deterministic") or (options.get("engine_args") or {}).get("enable_deterministic_inference"))


# ---------------------------------------------------------------------- pure translations


def sampling_params(s: Sampling) -> dict[str, Any]:
    """``Sampling`` -> SGLang ``sampling_params`` (temperature 0 is greedy in SGLang too; ``top_k``
    is always sent, -1 = whole vocabulary)."""
    p: dict[str, Any] = {
        "temperature": float(s.temperature),
        "top_p": float(s.top_p),
        "top_k": int(s.top_k),
        "max_new_tokens": int(s.max_new_tokens),
        "skip_special_tokens": True,
    }
    if s.seed is not None:
        p["sampling_seed"] = int(s.seed)
    return p


def generate_kwargs(prompts: list[list[int]], requests: list[Request], layout: Any = None) -> dict[str, Any]:
    """Keyword arguments of ``sglang.Engine.async_generate`` for one batch of requests; with an
    adapter ``layout`` (models.adapters) each request names its agent's adapter in ``lora_path``."""
    kw: dict[str, Any] = {
        "input_ids": [list(p) for p in prompts],
        "sampling_params": [sampling_params(r.sampling) for r in requests],
        "return_logprob": [bool(r.want_logprobs) for r in requests],
    }
    if layout is not None:
        kw["lora_path"] = [layout.adapter_for(r.agent) for r in requests]
    return kw


def lora_server_args(layout: Any) -> dict[str, Any]:
    """The LoRA ``ServerArgs`` for serving (and later updating) ``layout``'s adapters (pure): the
    base as ``model_path``, ``enable_lora``, ``lora_paths``, the largest rank, the union of the
    target modules (peft's names; ``all-linear`` -> SGLang's ``all``), room for every adapter and the
    base in one batch."""

    ranks, targets = [], set()
    for folder in layout.adapters.values():
        cfg = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        ranks.append(int(cfg.get("r", 8)))
        t = cfg.get("target_modules") or []
        targets |= {"all"} if t in ("all-linear", "all") else set([t] if isinstance(t, str) else t)
    return {
        "model_path": resolve_base(layout),
        "enable_lora": True,
        "lora_paths": {n: str(f) for n, f in layout.adapters.items()},
        "max_lora_rank": max(ranks),
        "lora_target_modules": ["all"] if "all" in targets else sorted(targets),
        "max_loras_per_batch": max(8, len(layout.adapters) + 1),
    }


def completion_from_output(out: dict[str, Any], prompt_ids: list[int], want_logprobs: bool) -> Completion:
    """One SGLang output dict (``text``, ``output_ids``, ``meta_info``) -> Completion.

    ``meta_info.finish_reason`` is ``{"type": "stop"|"length"|"abort", ...}``; an abort is an
    ``EngineError`` carrying SGLang's message. ``latency_s`` is left at 0 for the caller.
    """
    meta = out.get("meta_info") or {}
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind == "abort":
        msg = reason.get("message", "") if isinstance(reason, dict) else ""
        raise EngineError(f"sglang engine aborted a request: {squeeze(msg)}")
    token_ids = [int(t) for t in (out.get("output_ids") or [])]
    logprobs = None
    if want_logprobs:
        logprobs = [float(e[0]) for e in meta.get("output_token_logprobs") or []]
    return Completion(
        text=out.get("text") or "",
        token_ids=token_ids,
        prompt_ids=list(prompt_ids),
        logprobs=logprobs,
        prompt_tokens=int(meta.get("prompt_tokens", len(prompt_ids))),
        completion_tokens=int(meta.get("completion_tokens", len(token_ids))),
        finish="length" if kind == "length" else "stop",
    )
