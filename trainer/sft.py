"""The supervised warm start of a worker group (``sft:`` of a recipe): a mix-in of
:class:`~drmas_trainer.worker.WorkerGroup`, so a sharded group (``drmas_trainer.fsdp.worker``)
runs the same steps with its rows split over its ranks.

Each step draws ``batch_size`` examples (shuffled passes), forms micro-batches (per agent with LoRA,
so each forward runs one agent's adapter), takes this rank's share of them (``_share``: all of them
in one process), and minimises the token-mean cross-entropy of the targets (+ EOS) over the whole
batch: every micro-batch's summed negative log-likelihood is divided by the batch's token count,
so the accumulated gradient is the batch's whatever the split.
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Any

import torch

from drmas_bench.engines.prompt import default_template_kwargs, encode_chat
from drmas_bench.types import SFTExample
from drmas_trainer.logprobs import pack_rows
from drmas_trainer.rows import chunks

logger = logging.getLogger(__name__)
#: a long supervised warm start reports its step at most this often (seconds)
SFT_REPORT_EVERY_S = 10.0
#: the supervised warm start stops after this many consecutive non-finite steps
SFT_MAX_BAD_IN_A_ROW = 5


class WarmStart:
    """``sft`` for a worker group (the attributes it reads are WorkerGroup's)."""

    name: str
    settings: Any
    tokenizer: Any
    engine_options: dict[str, Any]
    params: list
    policy: Any
    pad_id: int
    device: torch.device
    adapters: dict

    # hooks the worker group defines (one process: identity; sharded: over the ranks)
    _use_agent: Any
    _autocast: Any
    _logprobs: Any
    _clip_grads: Any
    weights_finite: Any
    _share: Any
    _all_sum: Any
    _grad_scale: float
    world: int

    async def sft(self, examples: list[SFTExample], *, steps: int, lr: float, batch_size: int, seed: int = 0,
                  template_kwargs: dict[str, Any] | None = None,
                  max_bad_in_a_row: int = SFT_MAX_BAD_IN_A_ROW) -> dict[str, Any]:
        """Supervised warm start: ``steps`` AdamW steps (own optimiser, lr ``lr``) of token-mean
        cross-entropy on the targets (+ EOS) of ``examples``, drawn in shuffled passes.

        A step whose loss or gradient norm is not finite is skipped (gradients dropped, no optimiser
        step) and counted; after ``max_bad_in_a_row`` such steps in a row the stage stops early and
        the result carries ``sft_aborted`` (the reason; also when the weights end non-finite), so the
        caller can stop with one line (this may run in a Ray actor, where an exception would arrive
        wrapped in a traceback).

        Returns ``sft_loss_first`` / ``sft_loss_last`` (mean over the first / last applied steps; None
        when none applied), ``sft_steps`` (applied), ``sft_skipped``, ``sft_s`` and maybe ``sft_aborted``."""

        if not examples or steps <= 0:
            return {}
        data = self._sft_data(examples, template_kwargs)
        opt = torch.optim.AdamW(self.params, lr=lr, betas=tuple(self.settings.betas), weight_decay=self.settings.weight_decay)
        rng = random.Random(seed)
        order: list[int] = []
        losses: list[float] = []
        skipped = bad_in_a_row = 0
        aborted = None
        t0 = last_report = time.perf_counter()
        self.policy.train()
        for step in range(steps):
            if time.perf_counter() - last_report >= SFT_REPORT_EVERY_S:  # minutes on a CPU: say how far
                last_report = time.perf_counter()
                loss_now = f", loss {losses[-1]:.3f}" if losses else ""
                logger.info(f"[train] sft {self.name}: step {step}/{steps}{loss_now}, {last_report - t0:.0f} s")
            if len(order) < batch_size:
                more = list(range(len(data)))
                rng.shuffle(more)
                order += more
            idx, order = order[:batch_size], order[batch_size:]
            opt.zero_grad(set_to_none=True)
            total = self._sft_backward([data[i] for i in idx])
            norm = float("nan")
            if math.isfinite(total):
                norm = self._clip_grads()
            if not math.isfinite(norm):  # a non-finite loss or gradient: drop it, do not step
                opt.zero_grad(set_to_none=True)
                skipped += 1
                bad_in_a_row += 1
                if bad_in_a_row >= max_bad_in_a_row:
                    aborted = (f"{bad_in_a_row} steps in a row had a non-finite "
                               f"{'loss' if not math.isfinite(total) else 'gradient'} (lr {lr:g})")
                    break
                continue
            bad_in_a_row = 0
            opt.step()
            losses.append(total)
        opt.zero_grad(set_to_none=True)
        del opt
        if aborted is None and not self.weights_finite():  # finite gradients, but a step too large
            aborted = f"the weights are no longer finite after {len(losses)} steps (lr {lr:g})"
        k = max(1, min(10, len(losses) // 5))
        out: dict[str, Any] = {"sft_loss_first": sum(losses[:k]) / k if losses else None,
                               "sft_loss_last": sum(losses[-k:]) / k if losses else None,
                               "sft_steps": len(losses), "sft_skipped": skipped, "sft_s": time.perf_counter() - t0}
        if aborted:
            out["sft_aborted"] = aborted
        return out

    def _sft_data(self, examples: list[SFTExample], template_kwargs: dict[str, Any] | None) -> list[tuple]:
        """(prompt ids, target ids + EOS, agent) of each example; a prompt shared by examples is encoded once."""
        tk = default_template_kwargs(template_kwargs if template_kwargs is not None
                                     else self.engine_options.get("chat_template_kwargs"))
        eos = self.tokenizer.eos_token_id
        cache: dict[tuple, list[int]] = {}
        data = []
        for ex in examples:
            key = tuple((m["role"], m["content"]) for m in ex.messages)
            if key not in cache:
                cache[key] = encode_chat(self.tokenizer, ex.messages, tk, model=self.name)
            tgt = list(self.tokenizer(ex.target, add_special_tokens=False)["input_ids"]) + ([eos] if eos is not None else [])
            data.append((cache[key], tgt, ex.agent))
        return data

    def _sft_backward(self, batch_rows: list[tuple]) -> float:
        """Back-propagate one warm-start batch's token-mean cross-entropy; return its loss summed over
        the ranks (non-finite: a lone process stops at the first bad micro-batch)."""
        n_tok = sum(len(t) for _, t, _ in batch_rows)
        total = 0.0
        for agent, micro, real in self._sft_micro_batches(batch_rows):
            self._use_agent(agent)
            b = pack_rows([p for p, _, _ in micro], [t for _, t, _ in micro], self.pad_id, self.device)
            with self._autocast():
                logp, _ = self._logprobs(b, chunk=self.settings.logprob_chunk)
            nll = -(logp * b["mask"]).sum() / n_tok
            if real:
                total += float(nll.detach())
            if not math.isfinite(total) and self.world == 1:  # one process: stop at once (ranks go on together)
                break
            (nll * (self._grad_scale if real else 0.0)).backward()
        return self._all_sum([total])[0]

    def _sft_micro_batches(self, rows: list[tuple]) -> list[tuple[str | None, list[tuple], bool]]:
        """(agent, micro-batch, real) triples of a warm-start batch for this rank. LoRA: formed per
        agent (in the order the agents first appear), so each forward runs with one agent's
        adapter; full weights: the batch as it came (agent None). ``real`` False: a padding
        micro-batch a sharded rank runs with weight 0 (every rank runs the same number)."""
        if not self.adapters:
            return [(None, m, real) for m, real in self._share(rows)]
        by_agent: dict[str, list[tuple]] = {}
        for r in rows:
            by_agent.setdefault(r[2], []).append(r)
        return [(a, m, real) for a, rs in by_agent.items() for m, real in self._share(rs)]


__all__ = ["SFT_MAX_BAD_IN_A_ROW", "SFT_REPORT_EVERY_S", "WarmStart", "chunks"]
