"""Reading stored trajectory records (the dicts of ``samples.jsonl``) through typed views, the one
place that knows their keys, defaults and older shapes: metrics, compliance, each workflow's
effects, reports, the viewer, the exports and the call cache's summary all read a record as a
`RecordView` (its turns as `TurnView`, each call as `CallView`) built once by `view`. A leaf: it
imports only `types`.

A view is frozen and tolerant: a key a record lacks (a hand-made record, one written before the key
existed) reads as the default the writer would have stored (`Completion`'s, `Trajectory`'s), so
every reader sees the same value for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from drmas_bench.types import is_correct, record_reward

USAGE_SOURCES = ("server", "counted", "unknown")  # Completion.usage


def _mapping(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _float(v: Any) -> float:
    return float(v or 0.0)


def _int(v: Any) -> int:
    return int(v or 0)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True)
class CallView:
    """One recorded call's completion (``turn["completion"]``): its text, usage and timing.

    usage: where the token counts come from (`USAGE_SOURCES`; records from before the field: "server");
    `usage_known` is False when they mean nothing. tokens_recorded: both counts were stored (a
    record may lack them). cache_hit / cached_latency_s / cached_usd: the call cache's fields."""

    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_recorded: bool = False
    latency_s: float = 0.0
    finish: str | None = None
    usage: str = "server"
    notes: tuple[str, ...] = ()
    prompt_truncated: bool = False
    prompt_limit_unenforced: bool = False
    cache_hit: bool = False
    cached_latency_s: float | None = None
    cached_usd: float | None = None
    cost_usd: float = 0.0
    system_fingerprint: str | None = None  # the server's, as its answer named it (openai engine)

    @classmethod
    def of(cls, c: Any) -> CallView:
        c = _mapping(c)
        return cls(
            text=str(c.get("text") or ""),
            prompt_tokens=_int(c.get("prompt_tokens")),
            completion_tokens=_int(c.get("completion_tokens")),
            tokens_recorded=c.get("prompt_tokens") is not None and c.get("completion_tokens") is not None,
            latency_s=_float(c.get("latency_s")),
            finish=c.get("finish"),
            usage=str(c.get("usage", "server")),
            notes=tuple(str(n) for n in c.get("notes") or ()),
            prompt_truncated=bool(c.get("prompt_truncated")),
            prompt_limit_unenforced=bool(c.get("prompt_limit_unenforced")),
            cache_hit=bool(c.get("cache_hit")),
            cached_latency_s=_opt_float(c.get("cached_latency_s")),
            cached_usd=_opt_float(c.get("cached_usd")),
            cost_usd=_float(c.get("cost_usd")),
            system_fingerprint=c.get("system_fingerprint") or None,
        )

    @property
    def usage_known(self) -> bool:
        """Whether the call's token counts mean something (not ``usage == "unknown"``)."""
        return self.usage != "unknown"

    @property
    def tokens(self) -> int:
        """prompt + completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TurnView:
    """One recorded turn: the agent, its worker group, its position in the episode (``turn``, the
    stored ``step``), its validity (``Turn.valid``, default True), its call and its request's chat
    messages and sampling."""

    agent: str = "?"
    wg: str | None = None
    turn: int | None = None
    valid: bool = True
    call: CallView = field(default_factory=CallView)
    messages: tuple[dict[str, Any], ...] = ()
    sampling: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, t: Any) -> TurnView:
        if isinstance(t, TurnView):
            return t
        t = _mapping(t)
        req = _mapping(t.get("request"))
        return cls(
            agent=str(t.get("agent", "?")),
            wg=None if t.get("wg") is None else str(t["wg"]),
            turn=t.get("step"),
            valid=bool(t.get("valid", True)),
            call=CallView.of(t.get("completion")),
            messages=tuple(m for m in req.get("messages") or () if isinstance(m, dict)),
            sampling=_mapping(req.get("sampling")),
        )

    @property
    def text(self) -> str:
        """The response text ("" when it has none)."""
        return self.call.text


@dataclass(frozen=True)
class RecordView:
    """One trajectory record: its task, sample, turns, outcome and extras.

    reward: the one outcome (`types.record_reward`: a record with only ``correct`` reads 1.0 / 0.0);
    correct: derived from it. extra: the record's ``extra`` mapping ({} when none); `env_steps`,
    `grade` and `round1_correct` read the keys of it the harness writes. raw: the stored dict, for
    writers that copy it whole."""

    benchmark: str = ""
    task_id: str = ""
    question: str = ""
    answers: tuple[Any, ...] = ()
    task_meta: Mapping[str, Any] = field(default_factory=dict)
    sample_idx: int | None = None
    turns: tuple[TurnView, ...] = ()
    final_answer: Any = None
    reward: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    cost_usd: float = 0.0
    run: Mapping[str, Any] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, r: Any) -> RecordView:
        if isinstance(r, RecordView):
            return r
        d = r if isinstance(r, dict) else r.to_dict()
        task = _mapping(d.get("task"))
        idx = d.get("sample_idx")
        return cls(
            benchmark=str(task.get("benchmark", "")),
            task_id=str(task.get("id", "")),
            question=str(task.get("question") or ""),
            answers=tuple(task.get("answers") or ()),
            task_meta=_mapping(task.get("meta")),
            sample_idx=idx if isinstance(idx, int) and not isinstance(idx, bool) else None,
            turns=tuple(TurnView.of(t) for t in d.get("turns") or ()),
            final_answer=d.get("final_answer"),
            reward=record_reward(d),
            extra=_mapping(d.get("extra")),
            wall_s=_float(d.get("wall_s")),
            cost_usd=_float(d.get("cost_usd")),
            run=_mapping(d.get("run")),
            raw=d,
        )

    @property
    def correct(self) -> bool:
        """Solved or not: `types.is_correct` of the reward."""
        return is_correct(self.reward)

    @property
    def key(self) -> tuple[str, str, int | None]:
        """(benchmark, task id, sample index)."""
        return (self.benchmark, self.task_id, self.sample_idx)

    @property
    def env(self) -> Mapping[str, Any] | None:
        """The search env's own record of the episode (``extra["env"]``), None when not recorded."""
        env = self.extra.get("env")
        return env if isinstance(env, dict) else None

    @property
    def env_steps(self) -> list[dict[str, Any]] | None:
        """The env's step records (``extra["env"]["steps"]``), None when not recorded."""
        steps = self.env.get("steps") if self.env is not None else None
        return steps if isinstance(steps, list) else None

    @property
    def grade(self) -> str | None:
        """How grading ended (``extra["grade"]``: "timeout" when it hit its CPU limit twice)."""
        g = self.extra.get("grade")
        return None if g is None else str(g)

    @property
    def extracted(self) -> str | None:
        """The answer the math grader extracted (``extra["extracted"]``), None when not recorded."""
        v = self.extra.get("extracted")
        return None if v is None else str(v)

    @property
    def round1_correct(self) -> bool | None:
        """The round-1 answer's grade kept at grading time (``extra["round1_correct"]``), None when not kept."""
        v = self.extra.get("round1_correct")
        return None if v is None else bool(v)

    def agent_turns(self, agent: str) -> list[TurnView]:
        """The turns of ``agent``, in order."""
        return [t for t in self.turns if t.agent == agent]


def view(r: Any) -> RecordView:
    """A record as a `RecordView`: a stored dict, a `Trajectory` (by its ``to_dict()``), or a view."""
    return RecordView.of(r)


def views(records: Iterable[Any]) -> list[RecordView]:
    """`view` of each record."""
    return [RecordView.of(r) for r in records]


def as_dict(r: Any) -> dict[str, Any]:
    """A record as a dict: a stored one as it is, a view's stored dict, a `Trajectory` by its ``to_dict()``."""
    if isinstance(r, RecordView):
        return dict(r.raw)
    return r if isinstance(r, dict) else r.to_dict()


def rate(num: int | float, den: int) -> float | None:
    """``num / den``, None when ``den`` is 0."""
    return num / den if den else None


def mean_or_none(xs: Sequence[float]) -> float | None:
    """The mean of ``xs``, None when there are none."""
    return float(np.mean(xs)) if len(xs) else None
