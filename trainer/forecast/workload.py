"""The workload of one training step, as the hours model (``drmas_trainer.forecast.hours``) reads it: per
synchronous generate call, how many of the step's episodes are still running, how long their
prompts are, and how long their responses run on average and at the longest (the batch waits for
its longest response).

:class:`Workload` is the one input the hours model takes about what the team does. It is shared by
two producers:

- the recipe's ``plan:`` section (:func:`stated`): stated assumptions, and at the low and high
  ends of the range the stated bounds on what no plan can know before a run (the longest response
  between the mean and the cap; episodes stopping as early as the workflow allows, or at its
  last turn);
- ``train --plan --workload RUN``: the same figures measured from a run's step log or an eval
  run's records (``measured=True``), which replace the bounds with one figure.

Whoever builds a :class:`Workload`, the hours model reads nothing else about the workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from drmas_trainer.config.train import TrainConfig

End = Literal["low", "point", "high"]
ENDS: tuple[End, ...] = ("low", "point", "high")


@dataclass(frozen=True)
class CallLoad:
    """One synchronous generate call of a step (the next call starts when its batch is done)."""

    agent: str
    share: float  # episodes still running at this call / the step's episodes (prompts_per_step x n), in (0, 1]
    prompt_tokens: float  # mean prompt tokens of its sequences: the question, team context and observations
    mean_response: float  # mean response tokens
    longest_response: float  # the longest response of the call's batch (what the batch waits for), tokens


@dataclass(frozen=True)
class Workload:
    """What one training step asks of the engines and the update, call by call (module docstring).
    Shared with ``train --plan --workload RUN``: a measured run builds one too, with ``measured`` set
    and ``source`` naming the run."""

    calls: tuple[CallLoad, ...]
    source: str  # where the figures come from, one phrase (printed beside the hours)
    measured: bool = False


def stated(cfg: "TrainConfig", agents: list[str], end: End = "point", *, early: End | None = None) -> Workload:
    """The workload the recipe's ``plan:`` states, at one ``end`` of its range: ``point`` is the
    recipe's own assumptions (``plan.calls``, ``question_tokens``, ``response_share``; the longest
    response ``plan.bounds.longest_point`` of the cap); ``low`` and ``high`` put the two unknowns at
    their stated bounds: the longest response from ``plan.bounds.longest_low`` (null: the mean, no
    batch waits less) to ``longest_high`` of ``rollout.max_new_tokens``, and each call's share of
    the step's episodes from its ``share_low`` (episodes stopping as early as the workflow lets them)
    to its ``share_high`` (none stopping before the workflow's last turn); a call whose share is 0
    does not happen. ``early``: the end of early stopping alone (default ``end``), so that each
    unknown's own share of the range can be shown. ``agents``: the workflow's agents (each once over
    every episode when ``plan.calls`` is empty)."""
    pc = cfg.plan
    b = pc.bounds
    cap = cfg.rollout.max_new_tokens
    mean = pc.response_share * cap
    longest = {"low": pc.response_share if b.longest_low is None else b.longest_low,
               "point": b.longest_point, "high": b.longest_high}[end] * cap
    shares = [(c.share, {"low": c.share_low, "point": None, "high": c.share_high}[early or end]) for c in pc.calls]
    specs = [(c.agent, s if bound is None else bound, c.context_tokens) for c, (s, bound) in zip(pc.calls, shares)]
    calls = tuple(CallLoad(a, share, float(pc.question_tokens + ctx), mean, max(mean, longest))
                  for a, share, ctx in specs or [(a, 1.0, 0) for a in agents] if share > 0)
    words = {"low": "low end of", "point": "point of", "high": "high end of"}[end] if early in (None, end) \
        else f"longest response at the {end}, early stopping at the {early}, of"
    return Workload(calls, f"the {words} the recipe's plan: ({len(calls)} calls, the longest response "
                           f"{max(mean, longest):.0f} of {cap} tokens)")
