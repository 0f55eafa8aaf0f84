"""The search suite's format rules (the protocol's search_verifier, searcher and answerer roles as
`workflows.rules.FormatRule` objects) and what they read off replies and episodes: each reply's env
action and verdict, and per episode the env's steps (from its own record, ``extra["env"]``, else
from the actors' texts), for compliance, the viewer and search_route's effects."""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any, Mapping

from drmas_bench.records import RecordView, mean_or_none
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.rules import FormatRule, format_rule

ACTION_KINDS = ("search", "answer", "empty")
ACTORS = ("searcher", "answerer")  # the format rules of agents whose responses are search env actions


def action_kind(role: str, text: str) -> str:
    """What the search env makes of a searcher's / answerer's response: 'answer' (its projected
    action holds ``<answer>`` and ``</answer>``: the episode ends), 'search' (a query), or 'empty'
    (neither: the step passes). For records without the env's own account (``extra["env"]``)."""
    action = proto.project(role, text)
    if "<answer>" in action and "</answer>" in action:
        return "answer"
    return "search" if proto.env_query(action) is not None else "empty"


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


def search_episode_figures(recs: list[RecordView]) -> dict[str, Any]:
    """The per-episode figures of a search_route run (compliance's ``episodes`` block): env steps,
    searches, empty steps per episode, the share that ended on a tagged answer and its complement,
    and episodes by number of searches."""
    steps, searches, empty, answered = [], [], [], []
    for r in recs:
        kinds = search_steps(r)
        steps.append(len(r.env_steps) if r.env_steps is not None else len(r.agent_turns("verifier")))
        searches.append(kinds.count("search"))
        empty.append(kinds.count("empty"))
        answered.append(float(r.final_answer is not None))
    answer_rate = mean_or_none(answered)
    return {"steps_per_episode": mean_or_none(steps), "searches_per_episode": mean_or_none(searches),
            "empty_steps_per_episode": mean_or_none(empty), "answer_tag_rate": answer_rate,
            "no_answer_rate": None if answer_rate is None else 1.0 - answer_rate,
            "searches_distribution": {str(k): v for k, v in sorted(Counter(searches).items())}}


def actor_figures(role: str) -> Any:
    """The per-agent figures of a searcher's / answerer's replies: the env action each would be
    (``actions``: search / answer / empty) and the share that ended the episode on a tagged answer."""

    def figures(texts: list[str]) -> dict[str, Any]:
        kinds = Counter(action_kind(role, t) for t in texts)
        return {"actions": {k: kinds[k] for k in ACTION_KINDS},
                "answer_tag_rate": kinds["answer"] / len(texts) if texts else None}

    return figures


def verifier_figures(texts: list[str]) -> dict[str, Any]:
    """The search verifier's verdicts over its replies (answer / search)."""
    return {"verdicts": dict(sorted(Counter(proto.search_verdict(t) for t in texts).items()))}


def verifier_parse(text: str) -> tuple[str | None, str | None]:
    """(the spliced reply where the splice changed it, the verdict)."""
    spliced = proto.verify_splice(text)
    return (spliced if spliced != text else None), proto.search_verdict(text)


ACTION_REASONS = ("missing_action_tag", "think_count", "think_order", "cjk")
REASON_LABELS = {"missing_verify_tag": "no <verify> tag", "missing_action_tag": "no search/answer tag",
                 "think_count": "not one <think>", "think_order": "<think> not first", "cjk": "CJK characters"}
EPISODE_LABELS = {"answer_tag_rate": "ended on a tagged answer (%)", "steps_per_episode": "env steps per episode",
                  "searches_per_episode": "searches per episode", "empty_steps_per_episode": "empty steps per episode",
                  "no_answer_rate": "no answer (%)", "searches_distribution": "episodes by number of searches"}

SEARCH_VERIFIER = format_rule(FormatRule(
    "search_verifier", partial(proto.reasons, "search_verifier"), ("missing_verify_tag", "cjk"), verifier_parse,
    agent_figures=verifier_figures, labels=REASON_LABELS))
def actor_parse(role: str) -> Any:
    """The parse of a searcher's / answerer's reply: its projected env action ("" for an empty step)."""

    def parse(text: str) -> tuple[str | None, str | None]:
        return proto.tag_action(text, proto.ACTION_TAGS[role]), None

    return parse


def actor_rule(role: str) -> FormatRule:
    """The searcher's or the answerer's format rule (their own action tag, the think block, no CJK)."""
    return format_rule(FormatRule(role, partial(proto.reasons, role), ACTION_REASONS, actor_parse(role),
                                  agent_figures=actor_figures(role), episode_figures=search_episode_figures,
                                  labels={**REASON_LABELS, **EPISODE_LABELS}))


SEARCHER, ANSWERER = actor_rule("searcher"), actor_rule("answerer")
