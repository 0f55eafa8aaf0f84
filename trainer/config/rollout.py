"""The recipe's ``data:`` and ``rollout:`` sections: what a run trains on and how its rollouts are
sampled and served (the engines awake or pooled under a memory budget). Part of
:class:`drmas_trainer.config.train.TrainConfig`, which re-exports both.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from drmas_bench.schema import RANGES, CoercingSchema, Float, Int, registered


class DataConfig(CoercingSchema):
    """Where the training prompts come from and in which order."""

    source: str = Field("toy", description='"toy" (generated) | "benchmark:NAME[,NAME]" (registry) | path to a Task .jsonl')
    size: Int = RANGES["positive_count"].field(1000, description="toy: how many questions to generate")
    max_operand: Int = Field(9, ge=0, description="toy: operands are 0..max_operand")
    seed: Int = Field(0, description="toy generation seed and the shuffle seed (epoch e uses seed + e)")
    shuffle: bool = Field(True, description="reshuffle the prompts every epoch")
    limit: Optional[Int] = RANGES["limit"].field(None, description="use only the first N tasks of the source")
    data_dir: Optional[str] = Field(None, description="benchmark files (default $DRMAS_DATA_DIR, else the hub)")


class RolloutConfig(CoercingSchema):
    """How rollouts are sampled (one iteration = prompts_per_step x n trajectories)."""

    prompts_per_step: Int = Field(32, ge=1, description="distinct prompts per iteration (REFERENCE §6: math 32, search 128)")
    n: Int = Field(8, ge=1, description="rollouts per prompt, the group of the advantage statistics (math 8, search 5)")
    temperature: Float = RANGES["temperature"].field(
        1.0, description="sampling temperature of every agent (agents.NAME.sampling overrides), finite and >= 0")
    top_p: Float = RANGES["top_p"].field(1.0, description="nucleus sampling mass, in (0, 1]")
    max_new_tokens: Int = RANGES["max_new_tokens"].field(512, description="completion tokens per agent call")
    concurrency: Int = RANGES["concurrency"].field(1024, description="episodes in flight, >= 1")
    old_logprobs: Literal["recompute", "engine"] = Field(
        "recompute", description="the PPO ratio's old log-probs: recompute (a no-grad forward of the trainer's policy "
                                 "before the step's first update; the default, as verl) | engine (the rollout engine's; "
                                 "saves that forward, exact only when the engine computes like the trainer)")
    correction: str = Field("none", description="rollout correction of the engine/trainer gap, per token's policy "
                                                "gradient: none | tis_token | tis_seq | mis_token | mis_seq (needs "
                                                "old_logprobs: recompute; docs/trainer.md)")
    correction_threshold: Float = Field(2.0, gt=1.0, allow_inf_nan=False,
                                        description="C of the correction: ratios are truncated at C (tis) or "
                                                    "dropped above it (mis); > 1")
    engines: Literal["auto", "awake", "pooled"] = Field(
        "auto", description="the worker groups' engines during rollouts: awake (each stays awake and is synced right "
                            "after its update) | pooled (a pool adopts them per GPU and keeps awake what the memory "
                            "budget allows, sleeping the least recently used; held asleep during updates; a stale "
                            "engine is synced when it wakes) | auto (pooled when the budget says not all engines fit "
                            "on a GPU at once, else awake; docs/trainer.md)")
    engine_budget_gib: Optional[Float] = Field(
        None, gt=0, allow_inf_nan=False, description="pooled: GiB per GPU the awake engines may hold together during "
                                                     "rollouts (null: from the memory plan on CUDA: the GPU less the "
                                                     "resident states; none on CPU)")
    engines_awake: Optional[Int] = Field(
        None, ge=1, description="pooled: the budget as a number of engines per GPU (times the largest engine's "
                                "footprint), instead of engine_budget_gib")
    max_token_mismatch: Float = RANGES["share"].field(
        0.01, description="stop the run when more than this share of a worker group's rows in one step have "
                          "response ids that do not decode to the text the workflow used, in [0, 1]")

    @field_validator("correction")
    @classmethod
    def _correction(cls, v: str) -> str:
        from drmas_trainer.rollout_correction import CORRECTIONS  # the registry (imports torch)

        return registered(v, list(CORRECTIONS), "rollout correction")

    @model_validator(mode="after")
    def _one_budget(self) -> "RolloutConfig":
        if self.engine_budget_gib is not None and self.engines_awake is not None:
            raise ValueError("give rollout.engine_budget_gib or rollout.engines_awake, not both")
        if self.engines == "awake" and (self.engine_budget_gib is not None or self.engines_awake is not None):
            raise ValueError("engines: awake keeps every engine awake, so a budget (engine_budget_gib, engines_awake) "
                             "would be ignored; set engines: pooled (or auto), or drop the budget")
        return self

    @model_validator(mode="after")
    def _correction_needs_recompute(self) -> "RolloutConfig":
        if self.correction != "none" and self.old_logprobs == "engine":
            raise ValueError(f"correction {self.correction} needs old_logprobs: recompute (with the engine's own "
                             f"log-probs as the old policy there is no gap left to correct)")
        return self
