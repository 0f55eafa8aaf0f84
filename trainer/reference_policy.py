"""The reference (frozen) policy of KL in the reward (``algo.use_kl_in_reward``): its log-probs of a
worker group's rows (``drmas_trainer.forecast.memory`` counts its GPU memory for ``train --plan``).

The reference policy is the model the recipe names, before any training (verl's reference model:
``actor_rollout_ref.model.path``; a supervised warm start is training too, so a toy run with ``sft``
measures KL against the untrained model).

- **LoRA groups** (``lora:``, ``shared_base``): the group's frozen base *is* that model, so the
  reference shares its weights in memory: the forward runs the base with every adapter switched
  off (peft's ``disable_adapter()``). No extra memory.
- **Full-weight groups**: the trained weights move, so the reference is a separate frozen copy in
  the group's compute dtype (2 bytes per parameter in bf16, 4 in fp32), loaded on the group's
  device at its first use and kept; on resume it is loaded from the recipe's model again (never
  from the checkpoint).

One forward without gradients per micro-batch of ``micro_batch_size`` rows, as the old log-probs.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from drmas_bench.engines.base import resolve_model_path
from drmas_bench.models.loading import load_causal_lm
from drmas_trainer.logprobs import pack_rows, token_logprobs

__all__ = ["reference_logprobs"]


def _reference(wg: Any) -> tuple[Any, AbstractContextManager]:
    """(the module to run, a context that makes it the reference policy) for worker group ``wg``."""
    if getattr(wg, "adapters", None):
        return wg.policy, wg.policy.disable_adapter()  # the shared frozen base, adapters off
    ref = getattr(wg, "_reference_policy", None)
    if ref is None:
        path = resolve_model_path(wg.settings.model or wg.model_path)
        ref = load_causal_lm(path, dtype=wg.compute_dtype).to(wg.device)
        ref.eval().requires_grad_(False)
        wg._reference_policy = ref
    return ref, nullcontext()


def reference_logprobs(wg: Any, rows: list[Any]) -> list[list[float]]:
    """The reference policy's log-probs of each row's response tokens (one float per token; [] for a
    row without response tokens), in the group's compute dtype, without gradients.

    Args:
        wg: a ``drmas_trainer.worker.WorkerGroup`` (its policy, settings, device, pad id, autocast).
        rows: ``Row`` objects (prompt_ids, response_ids).
    """
    out: list[list[float]] = [[] for _ in rows]
    live = [k for k, r in enumerate(rows) if r.response_ids]
    if not live:
        return out
    model, ctx = _reference(wg)
    step = max(1, int(wg.settings.micro_batch_size))
    with torch.no_grad(), ctx:  # the module's train/eval mode as the old log-probs' forward has it
        for i in range(0, len(live), step):
            micro = live[i: i + step]
            batch = pack_rows([rows[k].prompt_ids for k in micro], [rows[k].response_ids for k in micro],
                              wg.pad_id, wg.device)
            with wg._autocast():
                logp, _ = token_logprobs(model, batch, chunk=wg.settings.logprob_chunk)
            logp = logp.float().cpu()
            for b, k in enumerate(micro):
                out[k] = logp[b, : len(rows[k].response_ids)].tolist()
    return out
