"""The keys of ``RUN/metrics.jsonl`` (and of the tracker's scalars), in one place.

Names follow verl's (``verl/trainer/ppo/metric_utils.py`` and its actor) so dashboards built for
verl runs work: ``critic/score/mean``, ``response_length/mean``, ``actor/pg_loss``,
``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/entropy``, ``actor/grad_norm``, ``actor/lr``,
``timing_s/step``, ... A plain name is the step's value over the whole team (for ``actor/*``: the
mean over worker groups). Scoped values put the scope in front of the same name:

    agent/<agent>/<name>   e.g. agent/solver/actor/grad_norm, agent/verifier/critic/advantages/mean
    wg/<group>/<name>      e.g. wg/solver/actor/pg_loss, wg/solver/actor/optimizer_steps

so ``agent/*/actor/grad_norm`` selects every agent's gradient norm (a regress band's glob).
"""

from __future__ import annotations

# --- team-level, per step -------------------------------------------------------------------------
SCORE = "critic/score/mean"  # mean trajectory reward R (the grader's score; verl's sequence score)
ACC = "critic/acc/mean"  # share of trajectories whose final answer is correct
REWARDS = "critic/rewards/mean"  # mean row score used for advantages: R - c_inv * (1 - valid)
NUM_TURNS = "num_turns/mean"  # agent calls per trajectory
RESPONSE_LENGTH = "response_length/mean"  # response tokens per row
PG_LOSS = "actor/pg_loss"
LOSS = "actor/loss"  # the optimised loss (policy loss + entropy term)
PG_CLIPFRAC = "actor/pg_clipfrac"
PG_CLIPFRAC_LOWER = "actor/pg_clipfrac_lower"
PPO_KL = "actor/ppo_kl"  # mean(old_logp - logp): rollout policy vs the updated one (no reference model)
ENTROPY = "actor/entropy"
GRAD_NORM = "actor/grad_norm"  # pre-clip gradient norm
GRAD_NORM_MAX = "actor/grad_norm_max"
LR = "actor/lr"
RATIO_MEAN = "actor/ratio_mean"
RATIO_MAX = "actor/ratio_max"
OPTIMIZER_STEPS = "actor/optimizer_steps"
SKIPPED_STEPS = "actor/skipped_steps"  # updates skipped as non-finite this step
SKIPPED_STEPS_TOTAL = "actor/skipped_steps_total"
TIME_GEN = "timing_s/gen"  # rollout
TIME_UPDATE = "timing_s/update_actor"
TIME_SYNC = "timing_s/sync_weights"
TIME_STEP = "timing_s/step"
TIME_OLD_LOGPROB = "timing_s/old_log_prob"  # recomputing the old log-probs and the token check (verl's name)
TIME_TESTING = "timing_s/testing"  # validation during training (verl's name for its validation)
TIME_SAVE = "timing_s/save_checkpoint"  # the step's checkpoint (and keep_best's), 0 when none is saved (verl's name)
#: the step's phases in order, as train-report draws them (timing_s/step also holds what none of them covers)
PHASES = (TIME_GEN, TIME_OLD_LOGPROB, TIME_UPDATE, TIME_SYNC, TIME_TESTING, TIME_SAVE)
CPU = "cpu_s/"  # beside each timing_s/<phase>: the trainer process's CPU seconds in it (drmas_trainer.phase_clock)


def cpu(timer: str) -> str:
    """``cpu_s/<phase>`` beside the wall timer ``timing_s/<phase>``."""
    return CPU + timer.removeprefix("timing_s/")
# KL in the reward (algo.use_kl_in_reward; drmas_trainer.rewards), the reference's names
REWARD_KL = "actor/reward_kl_penalty"  # mean over rows of the row's mean per-token KL (old vs reference policy)
REWARD_KL_COEFF = "actor/reward_kl_penalty_coeff"  # the beta this step's rewards used
REWARD_KL_COEFF_NEXT = "actor/reward_kl_penalty_coeff_next"  # the controller's beta for the next step (resume reads it)
TOKEN_MISMATCH = "rollout/token_mismatch"  # rows whose response ids do not decode to the text the workflow used
# the rollout engines over the step (team, and per worker group under wg/<g>/; drmas_trainer.rollout_engines)
WEIGHT_SYNCS = "rollout/weight_syncs"  # policy -> engine weight syncs
ENGINE_WAKES = "rollout/engine_wakes"  # engine wakes from sleep (a sync's own wake included)
ENGINE_SLEEPS = "rollout/engine_sleeps"  # engine sleeps (weights and KV cache released)
GENERATE_CALLS = "rollout/generate_calls"  # generate calls the engines served (one per agent call and episode)
REFERENCE_SYNCS = "rollout/reference_syncs"  # syncs the reference would make for these rollouts: one per batched
# agent call of its lockstep loop (agent a's k-th call in every episode at once), each waking the engine and syncing
ENGINES_POOLED = "rollout/engines_pooled"  # 1 when a pool kept the engines under a memory budget, 0 all awake
ENGINE_COUNTERS = {"syncs": WEIGHT_SYNCS, "wakes": ENGINE_WAKES, "sleeps": ENGINE_SLEEPS,
                   "generate_calls": GENERATE_CALLS}  # WorkerGroup.engine_counters key -> the record's name

# --- the step's workload, what the hours model (drmas_trainer.forecast.hours) needs; drmas_trainer.workload -----------
# Per generate call: the workflow's call index i (the turn's position in the episode, from 0) and its agent,
#   agent/<a>/workload/call<i>/<WL_*>
# per worker group, the tokens its update trains on: wg/<g>/workload/<WL_PROMPT_TOKENS | WL_RESPONSE_TOKENS>
WL_EPISODES = "workload/episodes"  # team: episodes started this step; per call: those still running at it
WL_PROMPT = "workload/prompt_length/mean"  # per call: mean prompt tokens
WL_RESPONSE = "workload/response_length/mean"  # per call: mean response tokens
WL_RESPONSE_MAX = "workload/response_length/max"  # per call: the longest response (the batch waits for it)
WL_PROMPT_TOKENS = "workload/prompt_tokens"  # per group: prompt tokens of its rows, summed
WL_RESPONSE_TOKENS = "workload/response_tokens"  # per group: response tokens of its rows, summed
WL_CALL_FIGURES = (WL_EPISODES, WL_PROMPT, WL_RESPONSE, WL_RESPONSE_MAX)


def call(a: str, index: int, name: str) -> str:
    """``agent/<a>/workload/call<index>/<name without its workload/ prefix>``: a generate call's figure."""
    return agent(a, f"workload/call{index}/{name.removeprefix('workload/')}")


# --- the rollout engine vs the trainer (trainer/rollout_correction.py), team, agent/<a>/ and wg/<g>/ ---------
ROLLOUT_CORR = "rollout_corr/"  # verl's prefix; the keys below follow it (rollout_corr/kl, ...)
ROLLOUT_CORR_KEYS = (
    "kl",  # mean(engine - trainer) over real response tokens: k1 estimate of KL(engine || trainer)
    "k3_kl",  # mean(r - log r - 1), r = exp(trainer - engine)
    "log_ppl_diff",  # mean over rows of (mean engine log-prob - mean trainer log-prob)
    "log_ppl_abs_diff",
    "rollout_is_mean",  # the importance ratio before truncation (per token, or per sequence for *_seq)
    "rollout_is_max",
    "rollout_is_ratio_fraction_high",  # share above C: truncated (tis) or dropped (mis)
    "rollout_is_ratio_fraction_low",  # share below 1/C
    "rollout_rs_masked_fraction",  # share of real tokens dropped (mis_*)
)

# --- per agent (under agent/<a>/) -----------------------------------------------------------------
CALLS = "num_calls/mean"  # the agent's calls per trajectory
VALID = "valid/mean"  # share of the agent's calls with a well-formed answer
ADV_MEAN = "critic/advantages/mean"
ADV_STD = "critic/advantages/std"
ADV_ABSMAX = "critic/advantages/absmax"
# Lemma 4.2's (sigma_k^2 + (mu_k - mu)^2) / sigma^2 from the step's rollouts (trainer/moment_factor.py):
# the scale global statistics put on the agent's gradient second moment, 1 under Dr. MAS
MOMENT_FACTOR = "critic/moment_factor/mean"
MOMENT_FACTOR_GROUPS = "critic/moment_factor/groups"  # prompt groups it averages (those with sigma > 0)
# The reference's per-step advantage metrics (algo.adv_metrics) keep its own names, the scope inside them:
# adv_std/<agent|all>/..., adv_norm/<agent|all>/..., adv_diag/<agent>/... (drmas_trainer.adv_metrics builds them).

# the worker's update() result key -> the record's name (per worker group, and averaged over groups)
UPDATE_KEYS = {
    "grad_norm": GRAD_NORM, "grad_norm_max": GRAD_NORM_MAX, "loss": LOSS, "pg_loss": PG_LOSS,
    "pg_clipfrac": PG_CLIPFRAC, "pg_clipfrac_lower": PG_CLIPFRAC_LOWER, "ppo_kl": PPO_KL, "entropy": ENTROPY,
    "lr": LR, "ratio_mean": RATIO_MEAN, "ratio_max": RATIO_MAX, "optimizer_steps": OPTIMIZER_STEPS,
    "skipped_steps": SKIPPED_STEPS, "update_s": TIME_UPDATE,
}
# averaged over worker groups into the team-level name
AVERAGED = ("grad_norm", "loss", "pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy", "lr")


def agent(a: str, name: str) -> str:
    """``agent/<a>/<name>``."""
    return f"agent/{a}/{name}"


def wg(g: str, name: str) -> str:
    """``wg/<g>/<name>``."""
    return f"wg/{g}/{name}"


def rollout_corr(key: str) -> str:
    """``rollout_corr/<key>`` (scope it with :func:`agent` / :func:`wg`)."""
    return ROLLOUT_CORR + key


def agents_with(record_keys, name: str) -> list[str]:
    """The agents that have ``agent/<a>/<name>`` among ``record_keys``, sorted."""
    suffix = "/" + name
    return sorted({k[len("agent/"):-len(suffix)] for k in record_keys
                   if k.startswith("agent/") and k.endswith(suffix) and len(k) > len("agent/") + len(suffix)})
