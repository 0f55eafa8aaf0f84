"""The ``val:`` section of the trainer config: validation during training (drmas_trainer.validation).
Kept beside ``drmas_trainer.config.train``, which embeds it as ``TrainConfig.val``."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from drmas_bench.benchmarks.catalog import get_benchmark
from drmas_bench.schema import RANGES, CoercingSchema, Float, Int
from drmas_bench.types import UserError


class ValConfig(CoercingSchema):
    """Validation during training, as the reference's ``trainer.test_freq`` / ``val_before_train``
    (drmas_trainer.validation): the current policy evaluated through the harness's own evaluation
    (``drmas_bench.api.run_on_engines``: workflow, protocol, grader, metrics and summary of
    ``drmas-bench eval``) on the trainer's engines after the weight sync, each validation a run
    folder ``RUN/val/step_N``. Sampling is eval's (temperature 0.6, top p 0.95 unless set here),
    never the training temperature; seeds are eval's, so ``drmas-bench eval --model
    RUN/ckpt/step_N --seed SEED`` on the same questions gives the same records."""

    every: Int = RANGES["every"].field(0, description="validate every N RL steps and at the last step (the reference's "
                                       "trainer.test_freq: search 5, math 10); 0 = not during training")
    before_train: bool = Field(False, description="validate the team before step 1 (step 0: the warm-started team, "
                               "ckpt/step_0; the reference's trainer.val_before_train)")
    benchmarks: Optional[list[str]] = Field(None, description="the harness benchmarks validated on (registry names, "
                                            "e.g. [toy] or [math500, aime24, aime25]); needed when every > 0 or "
                                            "before_train")
    data: Optional[str] = Field(None, description="folder of the validation benchmarks' files (null = data.data_dir, "
                                "else $DRMAS_DATA_DIR, else the hub)")
    limit: Optional[Int] = RANGES["limit"].field(None, description="the first N questions of each benchmark (the "
                                                 "reference's sampled sets: the first 30 / 50 rows per source); null = all")
    n: Int = RANGES["n"].field(1, description="samples per question (the reference: 1 during training, 16 in its "
                               "eval mode); avg@n and pass@k for k <= n are logged")
    temperature: Optional[Float] = RANGES["temperature"].field(None, description="null = eval's (0.6)")
    top_p: Optional[Float] = RANGES["top_p"].field(None, description="null = eval's (0.95)")
    seed: Int = RANGES["seed"].field(0, description="the evaluation seed (eval's --seed): every call's seed derives "
                                     "from it and the question, not from the training step")
    keep_best: Optional[str] = Field(None, description="a logged validation metric (e.g. val/avg@1): the step where it "
                                     "is highest gets a checkpoint kept beside latest (ckpt/best); null = off")

    @field_validator("benchmarks", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        return [n.strip() for n in v.split(",") if n.strip()] if isinstance(v, str) else v

    @field_validator("benchmarks")
    @classmethod
    def _known(cls, v: list[str] | None) -> list[str] | None:
        for name in v or []:
            try:
                get_benchmark(name)
            except UserError as e:  # named with its key path by the schema
                raise ValueError(str(e)) from None
        return v

    @field_validator("keep_best")
    @classmethod
    def _val_metric(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("val/"):
            raise ValueError(f"must name a validation metric (val/...), got {v!r}")
        return v

    @model_validator(mode="after")
    def _needs_benchmarks(self) -> "ValConfig":
        if (self.every or self.before_train) and not self.benchmarks:
            raise ValueError("validation (every > 0 or before_train) needs benchmarks, e.g. [toy] or [math500]")
        return self

    @property
    def active(self) -> bool:
        return bool(self.every or self.before_train)
