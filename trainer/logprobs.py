"""Log-probabilities of response tokens under a causal LM: pure tensor functions, no state.

    batch = pack_rows(prompts, responses, pad_id)          # [B, L] ids, [B, T] positions / targets / mask
    logp, ent = token_logprobs(model, batch, with_entropy=True, chunk=1024)   # [B, T] float32 each

Log-probs are of the raw logits (temperature 1), the same quantity the ``hf`` engine returns as
``Completion.logprobs`` (the old log-probs of the PPO ratio), so a row's ratio is 1 before its
first update.

**Memory.** The trunk's hidden states of the response tokens only are projected to the vocabulary
``chunk`` tokens at a time by a custom autograd function whose backward recomputes each chunk
(:func:`head_logprobs`): no [tokens x V] logits are kept for backward. :func:`full_head_logprobs`
is the plain-autograd reference it is tested against. A model whose logits are not exactly
``lm_head(hidden)`` (soft-capping, a logit scale) takes the full-logits path instead. The entropy
carries gradients only when asked (its loss coefficient is non-zero). The plan of all of it per
GPU: ``drmas_trainer.forecast.memory`` (``train --plan``).

Shapes: B rows, L = longest prompt + response, T = longest response, n = response tokens in the
batch, H hidden size, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["full_head_logprobs", "head_logprobs", "pack_rows", "token_logprobs"]


def pack_rows(prompts: list[list[int]], responses: list[list[int]], pad_id: int,
              device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """Right-padded prompt+response sequences and the index of each response token.

    Returns ``input_ids`` / ``attention_mask`` [B, L]; ``pos`` [B, T]: the position whose logits
    predict response token t (``len(prompt) - 1 + t``); ``targets`` [B, T] response ids; ``mask``
    [B, T] true on real response tokens.
    """
    B = len(prompts)
    plen = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    rlen = torch.tensor([len(r) for r in responses], dtype=torch.long)
    if bool((plen < 1).any()):
        raise ValueError("every row needs at least one prompt token")
    L = int((plen + rlen).max())
    T = max(1, int(rlen.max()))
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    targets = torch.full((B, T), pad_id, dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        seq = list(p) + list(r)
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[b, : len(seq)] = 1
        if r:
            targets[b, : len(r)] = torch.tensor(r, dtype=torch.long)
    t = torch.arange(T)
    pos = (plen[:, None] - 1 + t[None, :]).clamp(max=L - 1)
    mask = t[None, :] < rlen[:, None]
    return {k: v.to(device) for k, v in dict(input_ids=input_ids, attention_mask=attn, pos=pos,
                                              targets=targets, mask=mask).items()}


def _head_logits(h: Tensor, weight: Tensor, bias: Tensor | None, cdtype: torch.dtype) -> Tensor:
    """float32 logits [n, V] of hidden states ``h`` [n, H] through the output layer, the matmul in
    ``cdtype`` (what bf16 autocast would do), outside autocast."""
    with torch.autocast(h.device.type, enabled=False):
        out = torch.nn.functional.linear(h.to(cdtype), weight.to(cdtype), None if bias is None else bias.to(cdtype))
    return out.float()


class _ChunkedHead(torch.autograd.Function):
    """Log-probs and entropies of ``targets`` from hidden states, ``chunk`` rows at a time.

    Forward keeps only per-token numbers (log Z, entropy); backward recomputes each chunk's logits
    and turns them in place into the logits' gradient, so at most two [chunk, V] float32 buffers
    exist at any time, never [tokens, V]. Gradients: d logp / d logits = onehot - p;
    d H / d logits = -p (log p + H)."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, chunk: int,
                cdtype: torch.dtype) -> tuple[Tensor, Tensor]:
        n = h.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=h.device)
        ent = torch.empty(n, dtype=torch.float32, device=h.device)
        logz = torch.empty(n, dtype=torch.float32, device=h.device)
        w = weight.to(cdtype)  # one cast for all chunks (a no-op in float32)
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                logits = _head_logits(h[s:e], w, bias, cdtype)
                lz = torch.logsumexp(logits, dim=-1)
                logz[s:e] = lz
                logp[s:e] = logits.gather(-1, targets[s:e, None]).squeeze(-1) - lz
                logits.sub_(lz[:, None])  # log p
                ent[s:e] = -(logits.exp().unsqueeze(1) @ logits.unsqueeze(-1)).view(-1)  # no 3rd [c, V] buffer
                del logits
        ctx.save_for_backward(h, weight, bias, targets, logz, ent)
        ctx.chunk, ctx.cdtype = chunk, cdtype
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None) -> tuple[Tensor | None, ...]:
        h, weight, bias, targets, logz, ent = ctx.saved_tensors
        chunk, cdtype = ctx.chunk, ctx.cdtype
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        if g_logp is None and g_ent is None:
            return None, None, None, None, None, None
        w = weight.to(cdtype)
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        n = h.shape[0]
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                g = _head_logits(h[s:e], w, bias, cdtype)
                g.sub_(logz[s:e, None])  # log p
                p = g.exp()
                gl = None if g_logp is None else g_logp[s:e, None].float()
                if g_ent is None:  # g <- -g_logp * p   (+ onehot term below)
                    g = p.mul_(-gl)
                else:  # g <- -g_ent * p * (log p + H) - g_logp * p
                    g.add_(ent[s:e, None]).mul_(p).mul_(-g_ent[s:e, None].float())
                    if gl is not None:
                        g.sub_(p.mul_(gl))
                if gl is not None:
                    g.scatter_add_(-1, targets[s:e, None], gl)
                del p
                gc = g.to(cdtype)
                hc = h[s:e].to(cdtype)
                if grad_h is not None:
                    grad_h[s:e] = (gc @ w).to(h.dtype)
                if grad_w is not None:
                    if cdtype == torch.float32:
                        grad_w.addmm_(gc.t(), hc)
                    else:
                        grad_w += (gc.t() @ hc).float()
                if grad_b is not None:
                    grad_b += g.sum(0)
                del g, gc
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None)


def head_logprobs(h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *, chunk: int = 1024,
                  entropy_grad: bool = True, cdtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """Log-probs [n] of ``targets`` [n] and entropies [n] (float32) from hidden states ``h`` [n, H]
    through the output layer (``weight`` [V, H], ``bias``), ``chunk`` tokens at a time: the memory
    path of :func:`token_logprobs` (no [n, V] logits are kept for backward).

    Options: ``chunk`` (tokens per vocabulary projection: a [chunk, V] float32 buffer, 0.6 GB at
    chunk 1024 and V 151,936); ``entropy_grad`` False returns the entropy detached (when its loss
    coefficient is 0 it is only a metric); ``cdtype`` the matmul dtype (default: the autocast dtype
    when autocast is on, else ``h``'s)."""
    if cdtype is None:
        dev = h.device.type
        cdtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
    logp, ent = _ChunkedHead.apply(h, weight, bias, targets, max(1, int(chunk)), cdtype)
    return logp, (ent if entropy_grad else ent.detach())


def full_head_logprobs(h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *,
                       entropy_grad: bool = True, cdtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """The reference for :func:`head_logprobs`: all [n, V] logits at once, plain autograd (what the
    trainer did before; used by tests and ``scripts/bench_logprob_memory.py``)."""
    if cdtype is None:
        dev = h.device.type
        cdtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
    logits = _head_logits(h, weight, bias, cdtype)
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - logz
    if entropy_grad:
        ent = logz - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    else:
        with torch.no_grad():
            ent = logz - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, ent


def _trunk_and_head(model: Any) -> tuple[Any, Any] | None:
    """(base model returning hidden states, output layer) of a causal LM whose logits are exactly
    ``lm_head(last_hidden_state)``; None when that cannot be relied on (then the full path runs).
    A peft model (LoRA) is looked through: its adapters live inside the base model's layers."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    cfg = getattr(model, "config", None)
    if cfg is not None and (getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None)
                            or getattr(cfg, "logits_scaling", None)):
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    trunk = getattr(model, getattr(model, "base_model_prefix", "") or "model", None)
    if not isinstance(head, torch.nn.Linear) or trunk is None or trunk is model:
        return None
    return trunk, head


def token_logprobs(model: Any, batch: dict[str, Tensor], with_entropy: bool = False, *, entropy_grad: bool = True,
                   chunk: int = 1024) -> tuple[Tensor, Tensor | None]:
    """Log-probs [B, T] of the response tokens under ``model`` (raw logits, float32; 0 on padding),
    and the per-token entropy [B, T] when asked.

    Options: ``chunk`` > 0 (default 1024): the model's trunk gives hidden states, only the response
    tokens' are kept, and :func:`head_logprobs` projects them to the vocabulary ``chunk`` tokens at a
    time, recomputing each chunk in backward (no [tokens, V] logits kept); ``chunk`` 0, or a model
    whose logits are not plain ``lm_head(hidden)`` (soft-capping, logit scale): the full-logits path.
    ``entropy_grad`` False: the entropy is a detached metric (its loss coefficient is 0)."""
    parts = _trunk_and_head(model) if chunk and chunk > 0 else None
    if parts is None:
        return _full_token_logprobs(model, batch, with_entropy, entropy_grad)
    trunk, head = parts
    out = trunk(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    hidden = out[0] if isinstance(out, tuple) else out.last_hidden_state  # [B, L, H]
    rows, cols = batch["mask"].nonzero(as_tuple=True)
    h = hidden[rows, batch["pos"][rows, cols]]  # [N, H]: response tokens only
    lp, ent = head_logprobs(h, head.weight, head.bias, batch["targets"][rows, cols], chunk=chunk,
                            entropy_grad=entropy_grad)
    shape = batch["mask"].shape
    logp = torch.zeros(shape, dtype=torch.float32, device=h.device).index_put((rows, cols), lp)
    if not with_entropy:
        return logp, None
    return logp, torch.zeros(shape, dtype=torch.float32, device=h.device).index_put((rows, cols), ent)


def _full_token_logprobs(model: Any, batch: dict[str, Tensor], with_entropy: bool = False,
                         entropy_grad: bool = True) -> tuple[Tensor, Tensor | None]:
    """The full-logits path of :func:`token_logprobs`: the model's own logits from the earliest
    response start on (``logits_to_keep``), all kept for backward."""
    ids, pos = batch["input_ids"], batch["pos"]
    L = ids.shape[1]
    start = int(pos.min())
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": batch["attention_mask"], "use_cache": False}
    try:
        out = model(**kwargs, logits_to_keep=torch.arange(start, L, device=ids.device))
        offset = start
    except TypeError:  # models without logits_to_keep: full logits
        out = model(**kwargs)
        offset = 0
    logits = out.logits
    if logits.shape[1] != L - offset:  # logits_to_keep ignored by this model
        offset = L - logits.shape[1]
    idx = (pos - offset)[..., None].expand(-1, -1, logits.shape[-1])
    logits = logits.gather(1, idx).float()  # [B, T, V]
    logz = torch.logsumexp(logits, dim=-1)
    logp = (logits.gather(-1, batch["targets"][..., None]).squeeze(-1) - logz) * batch["mask"]
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = (logz - (torch.softmax(logits, dim=-1) * logits).sum(-1)) * batch["mask"]
    return logp, ent
