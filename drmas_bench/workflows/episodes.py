"""What the recorded turns of an episode say per episode, for compliance and the workflows' effects:
the search env's steps (from its own record, ``extra["env"]``, else from the actors' texts) and the
math loop's rounds, chosen by the agents' format rules (the protocol's roles)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

import drmas_bench.workflows.protocol as P
from drmas_bench.records import RecordView, mean_or_none

ACTION_KINDS = ("search", "answer", "empty")
ACTORS = ("searcher", "answerer")  # the format rules of agents whose responses are search env actions


def action_kind(role: str, text: str) -> str:
    """What the search env makes of a searcher's / answerer's response: 'answer' (its projected
    action holds ``<answer>`` and ``</answer>``: the episode ends), 'search' (a query), or 'empty'
    (neither: the step passes). For records without the env's own account (``extra["env"]``)."""
    action = P.project(role, text)
    if "<answer>" in action and "</answer>" in action:
        return "answer"
    return "search" if P.env_query(action) is not None else "empty"


def step_kind(step: Mapping[str, Any]) -> str:
    """An env step's kind from the env's record (`protocol.SearchEnv.record`)."""
    if step.get("done"):
        return "answer" if "<answer>" in str(step.get("action")) and "</answer>" in str(step.get("action")) else "end"
    return "search" if step.get("query") is not None else "empty"


def search_steps(r: RecordView) -> list[str]:
    """The kind of each env step of one search_route episode: from the env's own account when it is
    recorded (``extra["env"]``: search / empty / answer / end, end = done without an answer), else
    from the searcher's and answerer's texts (`action_kind`; records from before the env record)."""
    if r.env_steps is not None:
        return [step_kind(s) for s in r.env_steps]
    return [action_kind(t.agent, t.text) for t in r.turns if t.agent in ACTORS]


def episode_compliance(recs: list[RecordView], rules: dict[str, Any]) -> dict[str, Any]:
    """The per-episode half of `metrics.compliance` (see its docstring): env steps when an agent's rule is a
    search action, rounds when one is the math verifier's."""
    out: dict[str, Any] = {"episodes": len(recs)}
    if any(rule in ACTORS for rule in rules.values()):
        steps, searches, empty, answered = [], [], [], []
        for r in recs:
            kinds = search_steps(r)
            steps.append(len(r.env_steps) if r.env_steps is not None else len(r.agent_turns("verifier")))
            searches.append(kinds.count("search"))
            empty.append(kinds.count("empty"))
            answered.append(float(r.final_answer is not None))
        answer_rate = mean_or_none(answered)
        out.update(steps_per_episode=mean_or_none(steps), searches_per_episode=mean_or_none(searches),
                   empty_steps_per_episode=mean_or_none(empty), answer_tag_rate=answer_rate,
                   no_answer_rate=None if answer_rate is None else 1.0 - answer_rate,
                   searches_distribution={str(k): v for k, v in sorted(Counter(searches).items())})
    elif "math_verifier" in rules.values():
        rounds = [len(r.agent_turns("solver")) for r in recs]
        verdicts = [P.math_verdict(t.text) for r in recs for t in r.agent_turns("verifier")]
        out.update(rounds_per_episode=mean_or_none(rounds),
                   approve_rate=verdicts.count("approve") / len(verdicts) if verdicts else None)
    return out
