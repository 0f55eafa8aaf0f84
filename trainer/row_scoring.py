"""A worker group's look at its rollout rows before the step's first update: its own old log-probs
of them and the token-in/token-out check (``score_rows``): a mix-in of
:class:`~drmas_trainer.worker.WorkerGroup`, so a sharded group (``drmas_trainer.fsdp.worker``)
scores its rank's share of the rows the same way. The loop then applies what it found
(``drmas_trainer.scoring``)."""

from __future__ import annotations

import time
from typing import Any

import torch

from drmas_trainer.logprobs import pack_rows
from drmas_trainer.reference_policy import reference_logprobs
from drmas_trainer.rows import Row


class RowScoring:
    """``score_rows`` for a worker group (the attributes it reads are WorkerGroup's)."""

    settings: Any
    tokenizer: Any
    pad_id: int
    device: torch.device
    # hooks the worker group defines (one process: identity; sharded: over the ranks)
    engine_sleep: Any
    _use_agent: Any
    _merge_rows: Any
    _share: Any
    _autocast: Any
    _logprobs: Any

    async def score_rows(self, rows: list[Row], *, recompute: bool = True, reference: bool = False) -> dict[str, Any]:
        """Before the step's first update: the trainer's own old log-probs of the rows (``recompute``)
        and the token-in/token-out check.

        Recompute is one no-grad forward of the current policy over the rows, ``micro_batch_size``
        rows at a time, in the update's dtype and mode (so on-policy rows start at ratio 1 in the
        update). The check decodes each row's response ids with the group's tokenizer: they must give
        back the text the workflow used (``Row.text``); the ids themselves are trained on as the
        engine returned them, never re-tokenised.

        Returns ``{"logprobs": [[float] per row] | None, "mismatch": [None | {"row", "position",
        "engine_id", "text_id"} per row], "old_logprob_s"}``: ``position`` is the first response token
        where the engine's ids and the text's re-tokenisation differ."""
        t0 = time.perf_counter()
        if recompute and self.settings.sleep_engine:
            await self.engine_sleep()  # the forward's memory, as the update's
        mismatch = [self._token_mismatch(k, r) for k, r in enumerate(rows)]
        logprobs = self._old_logprobs(rows) if recompute else None
        out = {"logprobs": logprobs, "mismatch": mismatch, "old_logprob_s": time.perf_counter() - t0}
        if reference:  # KL in the reward: the frozen reference policy's log-probs too (drmas_trainer.reference_policy)
            out["ref_logprobs"] = reference_logprobs(self, rows)
        return out

    def _old_logprobs(self, rows: list[Row]) -> list[list[float]]:
        """The current policy's log-probs of each row's response tokens (no grad, micro-batched)."""
        out: list[list[float]] = [[] for _ in rows]
        by_agent: dict[str, list[int]] = {}
        for k, r in enumerate(rows):
            if r.response_ids:
                by_agent.setdefault(r.agent, []).append(k)
        with torch.no_grad():
            for agent, ks in by_agent.items():  # per agent, as the update forms its micro-batches
                self._use_agent(agent)  # per-agent LoRA adapters: the agent's own (a no-op without them)
                self._logprobs_into(rows, ks, out)
        return self._merge_rows(out)

    def _logprobs_into(self, rows: list[Row], ks: list[int], out: list[list[float]], root: Any = None) -> None:
        """``out[k]`` = the policy's log-probs of row k's response tokens, for this rank's share of
        ``ks``, micro-batched (padding micro-batches of a sharded group run and write nothing).
        The caller holds ``torch.no_grad()`` and chooses the adapter. ``root``: another module to
        run instead (a sharded group's frozen reference copy, ``fsdp.worker``)."""
        for micro, real in self._share(ks):
            batch = pack_rows([rows[k].prompt_ids for k in micro], [rows[k].response_ids for k in micro],
                              self.pad_id, self.device)
            with self._autocast():
                logp, _ = (root(batch, chunk=self.settings.logprob_chunk) if root is not None
                           else self._logprobs(batch, chunk=self.settings.logprob_chunk))
            logp = logp.float().cpu()
            for b, k in enumerate(micro if real else []):
                out[k] = logp[b, : len(rows[k].response_ids)].tolist()

    def _token_mismatch(self, k: int, r: Row) -> dict[str, Any] | None:
        """None when row ``r``'s response ids decode to its text (or it carries none), else where the
        engine's ids and the re-tokenised text first differ."""
        if r.text is None or self.tokenizer.decode(r.response_ids, skip_special_tokens=True) == r.text:
            return None
        text_ids = list(self.tokenizer(r.text, add_special_tokens=False)["input_ids"])
        pos = next((i for i, (a, b) in enumerate(zip(r.response_ids, text_ids)) if a != b),
                   min(len(r.response_ids), len(text_ids)))
        return {"row": k, "position": pos, "engine_id": r.response_ids[pos] if pos < len(r.response_ids) else None,
                "text_id": text_ids[pos] if pos < len(text_ids) else None}
