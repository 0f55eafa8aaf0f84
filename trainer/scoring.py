"""A step's rows between the rollout and the update, once each group has scored its own rows
(``WorkerGroup.score_rows``): the token-in/token-out check (:func:`check_tokens`), the rollout
correction of the old log-probs (:func:`correct_rows`), and the KL penalty in the reward
(:func:`start_kl_controller`, :func:`kl_penalised_scores`). The loop (``trainer.py``) calls them in
that order; each returns what it adds to the step's record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from drmas_bench.types import UserError
from drmas_trainer import metric_names
from drmas_trainer.config.train import TrainConfig
from drmas_trainer.rewards import KLController, kl_reward_step, make_kl_controller
from drmas_trainer.rollout_correction import pad_lists
from drmas_trainer.rows import Row
from drmas_trainer.runlog import METRICS, read_metrics


def check_tokens(by_wg: dict[str, list[Row]], scored: dict[str, dict[str, Any]], max_share: float,
                 step: int) -> dict[str, Any]:
    """The token-in/token-out check's record (``rollout/token_mismatch`` per step and per group);
    a group with more than ``max_share`` of its rows mismatched stops the run with one line naming
    the agent and the first differing token (before this step updates anything)."""
    rec: dict[str, Any] = {}
    total = 0
    for wg, rows in by_wg.items():
        bad = [m for m in scored[wg]["mismatch"] if m is not None]
        rec[metric_names.wg(wg, metric_names.TOKEN_MISMATCH)] = len(bad)
        total += len(bad)
        if bad and len(bad) > max_share * len(rows):
            m = bad[0]
            raise UserError(f"step {step}, worker group {wg}: {len(bad)} of {len(rows)} rows have response token ids "
                            f"that do not decode to the text the workflow used (more than rollout.max_token_mismatch "
                            f"{max_share:g}); first: agent {rows[m['row']].agent}, response token {m['position']} "
                            f"(engine id {m['engine_id']}, the text re-tokenises to {m['text_id']}); the engine's ids "
                            f"and text disagree: check its tokenizer and detokenizer")
    rec[metric_names.TOKEN_MISMATCH] = total
    return rec


def correct_rows(by_wg: dict[str, list[Row]], scored: dict[str, dict[str, Any]], rc: Any) -> dict[str, Any]:
    """With recomputed old log-probs: the rows' old log-probs become the trainer's (the engine's are
    kept in ``engine_logprobs``), each row gets the correction's per-token weights (``rollout.correction``,
    per agent since a row is one agent's call), and the record gets the engine-vs-trainer metrics
    ``rollout_corr/*`` for the team, each agent and each worker group (real response tokens only)."""
    from drmas_trainer.rollout_correction import correction_weights, mismatch_metrics, pad_lists

    if all(scored[wg]["logprobs"] is None for wg in by_wg):
        return {}  # old = the engine's: no gap to measure or correct
    for wg, rows in by_wg.items():
        for r, lp in zip(rows, scored[wg]["logprobs"]):
            r.engine_logprobs, r.old_logprobs = r.old_logprobs, lp
        if rc.correction != "none" and rows:
            old, mask = pad_lists([r.old_logprobs for r in rows])
            eng, _ = pad_lists([r.engine_logprobs for r in rows])
            w = correction_weights(rc.correction, old, eng, mask, rc.correction_threshold)
            for b, r in enumerate(rows):
                r.is_weights = w[b, : len(r.old_logprobs)].tolist()

    def metrics(rows: list[Row]) -> dict[str, float]:
        old, mask = pad_lists([r.old_logprobs for r in rows])
        eng, _ = pad_lists([r.engine_logprobs or [] for r in rows])
        m = mismatch_metrics(old, eng, mask, rc.correction, rc.correction_threshold)
        return {metric_names.rollout_corr(k): m[k] for k in metric_names.ROLLOUT_CORR_KEYS if k in m}

    every = [r for rows in by_wg.values() for r in rows]
    rec = metrics(every)
    for wg, rows in by_wg.items():
        rec.update({metric_names.wg(wg, k): v for k, v in metrics(rows).items()})
    for a in dict.fromkeys(r.agent for r in every):
        rec.update({metric_names.agent(a, k): v for k, v in metrics([r for r in every if r.agent == a]).items()})
    return rec


def start_kl_controller(cfg: TrainConfig, run: Path, step0: int) -> KLController | None:
    """The KL-in-reward controller (None when ``use_kl_in_reward`` is off). On resume its value is
    the one the run's record of ``step0`` left for the next step."""
    a = cfg.algo
    if not a.use_kl_in_reward:
        return None
    ctrl = make_kl_controller(a.kl_ctrl.type, a.kl_ctrl.kl_coef, a.kl_ctrl.target_kl, a.kl_ctrl.horizon)
    if step0 > 0:
        last = [r for r in read_metrics(run) if r.get("step") == step0 and metric_names.REWARD_KL_COEFF_NEXT in r]
        if not last:
            raise UserError(f"resuming with use_kl_in_reward from step {step0}: its record in {run / METRICS} has no "
                            f"{metric_names.REWARD_KL_COEFF_NEXT} (the KL controller's state); "
                            "resume with the settings it ran with")
        ctrl.value = float(last[-1][metric_names.REWARD_KL_COEFF_NEXT])
    return ctrl


def kl_penalised_scores(ctrl: KLController, kind: str, rows: list[Row], by_wg: dict[str, list[Row]],
                        scored: dict[str, dict[str, Any]], scores: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """Row scores minus ``beta * sum_t kl_t`` of each row's response tokens (old vs reference log-probs,
    drmas_trainer.rewards), one controller step, and its record (actor/reward_kl_penalty{,_coeff})."""
    ref_of = {id(r): lp for wg, rs in by_wg.items() for r, lp in zip(rs, scored[wg]["ref_logprobs"])}
    old, mask = pad_lists([r.old_logprobs[: len(r.response_ids)] for r in rows])
    ref, _ = pad_lists([ref_of[id(r)] for r in rows])
    old, ref = old.float(), ref.float()  # float32 token rewards, as the reference computes them
    lengths = mask.sum(dim=-1)
    token_scores = torch.zeros_like(old)
    has = lengths > 0
    token_scores[has.nonzero().squeeze(-1), (lengths - 1)[has]] = scores[has].to(old.dtype)
    rewards, current_kl, beta = kl_reward_step(ctrl, token_scores, old, ref, mask, kind)
    penalty = token_scores.sum(dim=-1) - rewards.sum(dim=-1)  # beta * sum_t kl_t per row
    return (scores - penalty.to(scores.dtype)), {metric_names.REWARD_KL: current_kl, metric_names.REWARD_KL_COEFF: beta,
                                                 metric_names.REWARD_KL_COEFF_NEXT: float(ctrl.value)}
