"""The recipe's ``plan:`` section: what ``drmas-bench train --plan`` assumes where its flags
do not say - the GPU kind, memory other processes hold, the longest prompt, the reported hours, and
the workload of one step. drmas_trainer.forecast (memory, hours) reads it; the trainer never
does. How many GPUs is the recipe's ``fsdp`` section's.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field, field_validator

from drmas_bench.schema import RANGES, CoercingSchema, Float, Int, registered
from drmas_trainer.forecast.hardware import HARDWARE


class ForecastCallConfig(CoercingSchema):
    """One synchronous generate call of a training step, as the hours model sees it: the batch waits
    for its longest response before the next call starts (the reference's orchestra calls agent by
    agent over every open episode)."""

    agent: str = Field(..., description="the agent that answers this call (one of the workflow's agents)")
    share: Float = Field(1.0, gt=0, le=1, allow_inf_nan=False,
                         description="share of the step's episodes still open that this call serves, in (0, 1]")
    context_tokens: Int = Field(0, ge=0, description="prompt tokens beyond the question's own: earlier responses "
                                "(team context) and observations (retrieved passages) it sees")
    share_low: Optional[Float] = Field(None, ge=0, le=1, allow_inf_nan=False, description="the share at the low end "
                                       "of the range (as early as the workflow lets episodes stop; 0: the call does "
                                       "not happen); null = share")
    share_high: Optional[Float] = Field(None, ge=0, le=1, allow_inf_nan=False, description="the share at the high "
                                        "end (no episode stops before the workflow's last turn; 0: the call does not "
                                        "happen); null = share")


class ForecastBounds(CoercingSchema):
    """The stated bounds of the plan's range on what no plan knows before a run (docs/trainer.md, "A
    range"): the longest response of a call (the batch waits for it) as a share of
    ``rollout.max_new_tokens``; early stopping is each call's ``share_low`` / ``share_high``
    (``plan.calls``). A measured workload (``--workload``) replaces them. Write each bound's source
    beside it."""

    longest_low: Optional[Float] = Field(None, gt=0, le=1, allow_inf_nan=False, description="the longest response / "
                                         "max_new_tokens at the low end (null: response_share, the mean: no batch "
                                         "waits for less than its mean)")
    longest_point: Float = Field(1.0, gt=0, le=1, allow_inf_nan=False, description="the longest response / "
                                 "max_new_tokens of the point estimate")
    longest_high: Float = Field(1.0, gt=0, le=1, allow_inf_nan=False, description="the longest response / "
                                "max_new_tokens at the high end (1: the cap, no response runs longer)")


class ForecastConfig(CoercingSchema):
    """What ``train --plan`` assumes where its flags do not say (docs/trainer.md, "How long a run
    takes"): the recipe's GPU kind, memory other processes hold, and the workload of one step. How
    many GPUs is the ``fsdp`` section's (ranks per group, colocated or separate)."""

    gpu: Optional[str] = Field(None, description="the GPU of the hours model: a row of drmas_trainer.forecast.hardware.HARDWARE "
                               "(h100, h200, a100); also --gpu-memory's default (null: h200)")
    prompt_tokens: Optional[Int] = RANGES["positive_count"].field(
        None, description="longest prompt of a row for the memory plan (--prompt-tokens default; null = 4096)")
    reserved_gib: Float = RANGES["rate"].field(0.0, description="GPU memory per GPU held by other processes (the "
                                               "reference's retrieval server: about 6 GB per GPU), GiB")
    reported_hours: Optional[Float] = Field(None, gt=0, allow_inf_nan=False, description="the reference's reported "
                                            "time of this configuration, shown beside the prediction")
    question_tokens: Int = Field(300, ge=0, description="mean prompt tokens of a call before any context: the "
                                 "templated question (docs/results/parity.md measured 315 math, 150 search)")
    response_share: Float = Field(0.5, gt=0, le=1, allow_inf_nan=False,
                                  description="mean response length / rollout.max_new_tokens, in (0, 1] (an "
                                              "assumption of the workload; the longest response is max_new_tokens)")
    calls: list[ForecastCallConfig] = Field(default_factory=list, description="the generate calls of one step, in "
                                        "order (empty: each workflow agent once over every episode)")
    bounds: ForecastBounds = Field(default_factory=ForecastBounds.model_construct, description="the range's stated bounds on the unknowns "
                               "of the workload (the longest response, early stopping)")

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, v: str | None) -> str | None:
        return v if v is None else registered(v, HARDWARE, "gpu")
