"""The records that flow through the harness (see DESIGN.md, "The data that flows").

Task -> (workflow asks agents) -> Request -> engine -> Completion -> Turn (= one training "row")
-> Trajectory (one episode of one task) -> a JSON line in runs/<run_id>/samples.jsonl.

Everything here is a plain dataclass that round-trips through ``to_dict`` / ``from_dict`` so that
run directories stay readable with nothing but ``json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


class UserError(Exception):
    """A problem with the user's input (names, files, flags). The CLI prints it as one line and
    exits non-zero; library callers catch it like any other exception."""


@dataclass
class Task:
    """One benchmark question."""

    id: str  # unique within its benchmark
    benchmark: str  # registry name, e.g. "aime24", "hotpotqa", "toy"
    question: str
    answers: list[str]  # every accepted gold answer (math: usually one)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass
class Sampling:
    """Decoding settings for one request. REFERENCE.md §3: eval uses 0.6 / 0.95."""

    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 512
    seed: int | None = None  # per-request seed: makes a sample reproducible independent of batching
    top_k: int = -1  # -1 = no top-k; sent explicitly on every engine (REFERENCE.md §2b)
    enable_thinking: bool = False  # chat-template switch for thinking models (Qwen3); off by default (§2b)


@dataclass
class Request:
    """One agent call: the chat messages the agent sees and how to sample."""

    agent: str
    messages: list[dict[str, str]]  # [{"role": "system"|"user"|"assistant", "content": str}]
    sampling: Sampling = field(default_factory=Sampling)
    want_logprobs: bool = False
    # prompt-length limit on the chat-templated prompt tokens (REFERENCE.md §2b: math 8192 cut in
    # the middle, search 4096 cut from the left); None = no limit. Every engine applies it.
    max_prompt_tokens: int | None = None
    truncate: str = "left"  # which tokens go when the prompt is too long: "left" | "middle" | "right"
    sample_idx: int | None = None  # which of its task's n samples the call belongs to (the episode sets it): the
    # call cache keys on it, so two samples are never served one completion


@dataclass
class Completion:
    """What an engine returns for one Request."""

    text: str
    token_ids: list[int] = field(default_factory=list)  # response tokens
    prompt_ids: list[int] = field(default_factory=list)  # prompt tokens (for training rows)
    logprobs: list[float] | None = None  # per response token, when asked
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    finish: str = "stop"  # "stop" (EOS / stop string) | "length"
    prompt_truncated: bool = False  # the prompt was cut to Request.max_prompt_tokens
    # where prompt_tokens / completion_tokens come from (drmas_bench.metrics.USAGE_SOURCES): "server"
    # (the engine or the server's usage), "counted" (the server gave none: counted here with the
    # model's tokenizer) or "unknown" (none given and no tokenizer: the counts are 0 and mean nothing)
    usage: str = "server"
    # the request carried a prompt limit the engine could not apply (an HTTP model with no tokenizer
    # here and no /tokenize on its server): the prompt went out uncut
    prompt_limit_unenforced: bool = False
    notes: list[str] = field(default_factory=list)  # what the engine corrected or doubts in this reply (one line each)
    # served by the call cache (drmas_bench.call_cache): latency_s and this run's dollars are what the lookup cost;
    # the original call's latency and dollars are kept here. Written to records only on a hit.
    cache_hit: bool = False
    cached_latency_s: float | None = None
    cached_usd: float | None = None
    # the server's build and configuration as it named them in its answer (an OpenAI-compatible server's
    # ``system_fingerprint``); None when it gave none. Written to records only when set.
    system_fingerprint: str | None = None


CACHE_FIELDS = ("cache_hit", "cached_latency_s", "cached_usd")  # Completion's call-cache fields


@dataclass
class Turn:
    """One agent action inside a trajectory = one training row (REFERENCE.md §1)."""

    agent: str  # logical agent id ("solver", "verifier", ...)
    wg: str  # worker group (physical model) serving the agent
    step: int  # the turn: position of the call in the episode, 0-based (the stored key of a turn index)
    request: Request
    completion: Completion
    valid: bool = True  # format check passed

    def to_dict(self, with_tokens: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_tokens:
            d["completion"].pop("token_ids", None)
            d["completion"].pop("prompt_ids", None)
            d["completion"].pop("logprobs", None)
        if not d["completion"].get("cache_hit"):  # the call-cache fields are written only on a hit
            for key in CACHE_FIELDS:
                d["completion"].pop(key, None)
        if d["completion"].get("system_fingerprint") is None:
            d["completion"].pop("system_fingerprint", None)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Turn":
        req = dict(d["request"])
        req["sampling"] = Sampling(**req.get("sampling", {}))
        return cls(
            agent=d["agent"],
            wg=d["wg"],
            step=d["step"],
            request=Request(**req),
            completion=Completion(**d["completion"]),
            valid=d.get("valid", True),
        )


CORRECT_AT = 1.0  # the reward at and above which an episode counts as solved


def is_correct(reward: float) -> bool:
    """Whether an outcome reward counts as solved. The one definition of "correct": the reward is the
    one stored outcome (the trainer reads it, and shaped or partial rewards stay possible), and what
    metrics count as right is derived from it here, so the two can never disagree."""
    return float(reward) >= CORRECT_AT


def record_reward(d: dict[str, Any]) -> float:
    """The outcome reward of a trajectory record. Records written before the reward was the one
    outcome may carry only `correct` (or a missing/None reward); those read as 1.0 / 0.0 from it,
    which is what the runner always stored beside it, so old run dirs read the same."""
    r = d.get("reward")
    if r is None:
        return 1.0 if d.get("correct", False) else 0.0
    return float(r)


def record_correct(d: dict[str, Any]) -> bool:
    """Whether a trajectory record counts as solved: `is_correct` of `record_reward`; every reader of
    stored records (metrics, reports, the viewer) asks this rather than the record's `correct` key."""
    return is_correct(record_reward(d))


@dataclass
class Trajectory:
    """One episode of a workflow on one task (one of the n samples of that task). Its outcome is
    `reward` alone; `correct` is derived from it (`is_correct`)."""

    task: Task
    sample_idx: int = 0
    turns: list[Turn] = field(default_factory=list)
    final_answer: str | None = None
    reward: float = 0.0  # the outcome reward R (0/1 by default); the one stored outcome
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. {"f1": 0.5, "grade": "timeout"}
    wall_s: float = 0.0
    cost_usd: float = 0.0

    @property
    def correct(self) -> bool:
        """Solved or not, derived from the reward (`is_correct`); set the reward to change it."""
        return is_correct(self.reward)

    @property
    def key(self) -> tuple[str, str, int]:
        """The resume key of a finished sample: (benchmark, task id, sample index)."""
        return (self.task.benchmark, self.task.id, self.sample_idx)

    def to_dict(self, with_tokens: bool = False) -> dict[str, Any]:
        return {
            "task": self.task.to_dict(),
            "sample_idx": self.sample_idx,
            "turns": [t.to_dict(with_tokens) for t in self.turns],
            "final_answer": self.final_answer,
            "reward": self.reward,
            "correct": self.correct,  # derived, written for people reading the file; readers use record_correct
            "extra": self.extra,
            "wall_s": self.wall_s,
            "cost_usd": self.cost_usd,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        return cls(
            task=Task.from_dict(d["task"]),
            sample_idx=d["sample_idx"],
            turns=[Turn.from_dict(t) for t in d.get("turns", [])],
            final_answer=d.get("final_answer"),
            reward=record_reward(d),
            extra=d.get("extra", {}),
            wall_s=d.get("wall_s", 0.0),
            cost_usd=d.get("cost_usd", 0.0),
        )


@dataclass
class SFTExample:
    """One supervised example of a warm start: the agent's chat prompt and the response to imitate
    (a workflow's declared SFT examples, `WorkflowSpec.sft`)."""

    agent: str
    messages: list[dict[str, str]]
    target: str
