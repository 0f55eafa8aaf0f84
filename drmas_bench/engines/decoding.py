"""The ``hf`` engine's decoding loop pieces: per-batch bookkeeping (``Rows``), the sampler
(``sample``) and the padded-batch decode (``padded_decode``, the ``batch_invariant=false`` path).

``Rows`` holds what one batch of requests needs whatever the forward pass: each request's own
``torch.Generator`` (seeded with ``Sampling.seed``), its sampling parameters, the tokens and
log-probs so far, and why it finished. ``Rows.take(logits, active)`` samples one token per active
row, records it, and says which rows go on; ``Rows.completions`` builds the results in the
requests' order. The batch-invariant decode (``invariant.py``) and the padded one share it, so
they differ only in how the logits are computed.

``padded_decode`` left-pads the prompts into one ``(B, L)`` batch with correct ``position_ids`` and
decodes the rows together over transformers' KV cache; rows that finish leave the batch. It is
fast, but a row's logits depend on its neighbours in the last bits (CPU fp32, up to 4e-5 on
smollm2-135m) or more (bf16: up to 0.5), through the reductions whose order follows the batch's
shape (matmul kernels chosen by the row count, attention over padded keys).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from drmas_bench.types import Completion


class Rows:
    """Bookkeeping of one batch: which items run, their generators, tokens, log-probs, finish."""

    def __init__(self, items: list[Any], device: Any, eos_ids: set[int]) -> None:
        self.items = items
        self.eos_ids = eos_ids
        self.results: list[Completion | None] = [None] * len(items)
        self.rows: list[int] = []  # indices of items that actually run
        for i, it in enumerate(items):
            if it.request.sampling.max_new_tokens <= 0 or not it.prompt_ids:
                self.results[i] = Completion(
                    text="", prompt_ids=list(it.prompt_ids), prompt_tokens=len(it.prompt_ids), finish="length",
                    logprobs=[] if it.request.want_logprobs else None, prompt_truncated=it.truncated,
                )
            else:
                self.rows.append(i)
        samp = [items[i].request.sampling for i in self.rows]
        self.gens = []
        for s in samp:
            g = torch.Generator(device="cpu")
            g.manual_seed(s.seed if s.seed is not None else random.SystemRandom().getrandbits(63))
            self.gens.append(g)
        self.want_lp = [items[i].request.want_logprobs for i in self.rows]
        self.max_new = [s.max_new_tokens for s in samp]
        self.out_ids: list[list[int]] = [[] for _ in self.rows]
        self.out_lp: list[list[float]] = [[] for _ in self.rows]
        self.finish = ["length"] * len(self.rows)
        self.temps = torch.tensor([s.temperature for s in samp], dtype=torch.float32, device=device)
        self.top_ps = torch.tensor([s.top_p for s in samp], dtype=torch.float32, device=device)
        self.top_ks = torch.tensor([s.top_k for s in samp], dtype=torch.long, device=device)

    def prompt(self, r: int) -> list[int]:
        """The prompt ids of row ``r`` (an index into ``rows``)."""
        return self.items[self.rows[r]].prompt_ids

    def take(self, logits: Any, active: list[int]) -> tuple[Any, list[int]]:
        """Sample one token for each row of ``active`` (``logits``: one float row each, in that
        order), record it; returns the tokens and the positions ``k`` in ``active`` still going."""
        act = torch.tensor(active, dtype=torch.long, device=logits.device)
        tokens = sample(logits, self.temps[act], self.top_ps[act], [self.gens[r] for r in active], self.top_ks[act])
        lps = None
        if any(self.want_lp[r] for r in active):
            lps = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0].tolist()
        still: list[int] = []
        for k, (r, t) in enumerate(zip(active, tokens.tolist())):
            self.out_ids[r].append(t)
            if self.want_lp[r] and lps is not None:
                self.out_lp[r].append(float(lps[k]))
            if t in self.eos_ids:
                self.finish[r] = "stop"
            elif len(self.out_ids[r]) < self.max_new[r]:
                still.append(k)
        return tokens, still

    def completions(self, tokenizer: Any) -> list[Completion]:
        """One Completion per item, in the items' order."""
        for b, i in enumerate(self.rows):
            it, ids = self.items[i], self.out_ids[b]
            self.results[i] = Completion(
                text=tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids, prompt_ids=list(it.prompt_ids),
                logprobs=self.out_lp[b] if self.want_lp[b] else None, prompt_tokens=len(it.prompt_ids),
                completion_tokens=len(ids), finish=self.finish[b], prompt_truncated=it.truncated,
            )
        return [r for r in self.results if r is not None]


def padded_decode(engine: Any, rows: Rows) -> None:
    """Decode ``rows`` as one left-padded batch over transformers' KV cache (module docstring)."""
    model, dev, B = engine._hf_model, engine.device, len(rows.rows)
    L = max(len(rows.prompt(b)) for b in range(B))
    input_ids = torch.full((B, L), engine.pad_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for b in range(B):
        p = rows.prompt(b)
        input_ids[b, L - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[b, L - len(p) :] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    input_ids, mask, position_ids = input_ids.to(dev), mask.to(dev), position_ids.to(dev)
    kw: dict[str, Any] = {"attention_mask": mask, "position_ids": position_ids, "use_cache": True}
    if engine._logits_kw:
        kw[engine._logits_kw] = 1
    out = model(input_ids=input_ids, **kw)
    engine.forward_calls += 1
    cache: Any = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    logits = out.logits[:, -1, :].float()
    last_pos = position_ids[:, -1]
    active = list(range(B))  # row numbers still decoding, in cache order
    while True:
        tokens, still = rows.take(logits, active)
        if not still:
            return
        if len(still) < len(active):  # rows that finished leave the batch
            keep = torch.tensor(still, dtype=torch.long, device=dev)
            cache.batch_select_indices(keep)
            tokens, mask, last_pos = tokens[keep], mask[keep], last_pos[keep]
            active = [active[k] for k in still]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        last_pos = last_pos + 1
        out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=last_pos[:, None], use_cache=True,
                    **{engine._cache_kw: cache})
        engine.forward_calls += 1
        logits = out.logits[:, -1, :].float()


def sample(logits: Any, temps: Any, top_ps: Any, gens: list[Any], top_ks: Any = None) -> Any:
    """Pick one token per row. Greedy where temperature <= 0; else temperature, top-k (``top_ks``,
    -1 = none; ``None`` = none for every row), top-p, and inverse-CDF sampling in vocabulary
    order with one uniform from the row's own generator. Top-k and top-p both filter the same
    (temperature-scaled) distribution: a token survives when it is in both sets. Every step works
    on each row alone (a row's result does not depend on the others)."""
    greedy = logits.argmax(dim=-1)
    sampled_rows = (temps > 0).nonzero()[:, 0].tolist()
    if not sampled_rows:
        return greedy
    idx = torch.tensor(sampled_rows, dtype=torch.long, device=logits.device)
    probs = torch.softmax(logits[idx] / temps[idx, None], dim=-1)
    if top_ks is not None:
        probs = _top_k(probs, top_ks[idx])
    tp = top_ps[idx]
    if bool((tp < 1.0).any()):
        # nucleus: keep the most likely tokens until their mass reaches top_p. The top 1024
        # usually hold it (real LMs); a full sort of the vocabulary is the fallback.
        k = min(probs.shape[-1], 1024)
        sp, si = torch.topk(probs, k, dim=-1, sorted=True)
        csum = sp.cumsum(dim=-1)
        if not bool(((csum[:, -1] >= tp) | (tp >= 1.0)).all()):
            sp, si = torch.sort(probs, dim=-1, descending=True, stable=True)
            csum = sp.cumsum(dim=-1)
        before = csum - sp  # mass of the more likely tokens
        drop_sorted = (before >= tp[:, None]) & (tp[:, None] < 1.0)
        drop_sorted[:, 0] = False  # the most likely token always stays (top_p <= 0 = greedy)
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter(1, si, ~drop_sorted)
        probs = probs.masked_fill(~keep, 0.0)
    cdf = probs.cumsum(dim=-1)
    u = torch.stack([torch.rand((), generator=gens[r]) for r in sampled_rows]).to(logits.device)
    x = (u * cdf[:, -1]).unsqueeze(1)
    pick = torch.searchsorted(cdf, x, right=True)[:, 0].clamp(max=cdf.shape[1] - 1)
    out = greedy.clone()
    out[idx] = pick
    return out


def _top_k(probs: Any, tk: Any) -> Any:
    """``probs`` with every token outside each row's top ``tk`` set to 0 (``tk`` < 1 = no cut)."""
    vocab = probs.shape[-1]
    cut_k = (tk >= 1) & (tk < vocab)
    if not bool(cut_k.any()):
        return probs
    kmax = int(tk[cut_k].max())
    _, ki = torch.topk(probs, kmax, dim=-1, sorted=True)
    limit = torch.where(cut_k, tk, torch.full_like(tk, kmax))
    in_top = torch.arange(kmax, device=probs.device)[None, :] < limit[:, None]
    keep_k = torch.zeros_like(probs, dtype=torch.bool).scatter(1, ki, in_top)
    keep_k |= ~cut_k[:, None]
    return probs.masked_fill(~keep_k, 0.0)
