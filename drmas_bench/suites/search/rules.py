"""The search suite's protocol roles (REFERENCE.md §2b: search_verifier, searcher, answerer: what
each must emit, its projection and the verifier's verdict) and its format rules (those roles as
`workflows.rules.FormatRule` objects) with what they read off replies and episodes: each reply's env
action and verdict, and per episode the env's steps (from its own record, ``extra["env"]``, else
from the actors' texts), for compliance, the viewer and search_route's effects."""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any, Mapping

from drmas_bench.records import RecordView
from drmas_bench.suites.search.env import env_query
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.rules import Folded, FormatRule, Verdicts, format_rule

# the names the reference gives this suite's agents (its team context, its checkpoints' agent ids)
AGENT_NAMES = {"verifier": "Verifier Agent", "searcher": "Search Agent", "answerer": "Answer Agent"}
ACTION_TAGS = {"searcher": "search", "answerer": "answer"}  # each looks for its own tag only
ROLES = ("search_verifier", *ACTION_TAGS)  # the suite's protocol roles


def _role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown search protocol role {role!r}; roles: {', '.join(ROLES)}")
    return role


def project(role: str, text: str) -> str:
    """What the reference keeps of `role`'s response (team context; the env action for the searcher
    and answerer): the verifier's spliced, the searcher's / answerer's tag action."""
    if _role(role) == "search_verifier":
        return proto.verify_splice(text)
    return proto.tag_action(text, ACTION_TAGS[role])


def reasons(role: str, text: str) -> list[str]:
    """Every reason `role`'s response fails its validity rule (REFERENCE §2b "Validity"; invalid
    costs the row c_inv); empty: valid.

    - search_verifier: missing_verify_tag (``<verify>`` or ``</verify>`` absent), cjk;
    - searcher / answerer: missing_action_tag (its own pair, ``<search>`` / ``<answer>``, absent),
      think_count (``<think>`` or ``</think>`` not exactly once), think_order (each once, closing
      first), cjk (where the action sits is not checked)."""
    if _role(role) == "search_verifier":
        return proto.verify_reasons(text)
    tag = ACTION_TAGS[role]
    out = [] if f"<{tag}>" in text and f"</{tag}>" in text else ["missing_action_tag"]
    out += proto.think_reasons(text)
    return out + (["cjk"] if proto.has_cjk(text) else [])


def valid(role: str, text: str) -> bool:
    """Whether `role`'s response passes its validity rule: `reasons` finds none."""
    return not reasons(role, text)


def search_verdict(text: str) -> str:
    """'answer' | 'search' of a search verifier's raw response: the spliced response lower-cased,
    then yes -> answer, else no -> search, else answer (the splice is case-sensitive, the test is
    not: ``<VERIFY>no</VERIFY>`` searches, ``<VERIFY> no </VERIFY>`` answers)."""
    low = proto.verify_splice(text).lower()
    if "<verify>yes</verify>" in low:
        return "answer"
    if "<verify>no</verify>" in low:
        return "search"
    return "answer"


ACTION_KINDS = ("search", "answer", "empty")
ACTORS = ("searcher", "answerer")  # the format rules of agents whose responses are search env actions


def action_kind(role: str, text: str) -> str:
    """What the search env makes of a searcher's / answerer's response: 'answer' (its projected
    action holds ``<answer>`` and ``</answer>``: the episode ends), 'search' (a query), or 'empty'
    (neither: the step passes). For records without the env's own account (``extra["env"]``)."""
    action = project(role, text)
    if "<answer>" in action and "</answer>" in action:
        return "answer"
    return "search" if env_query(action) is not None else "empty"


def step_kind(step: Mapping[str, Any]) -> str:
    """An env step's kind from the env's record (`env.SearchEnv.record`)."""
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


class SearchEpisodes:
    """The per-episode figures of a search_route run (compliance's ``episodes`` block), one episode at a
    time: env steps, searches, empty steps per episode, the share that ended on a tagged answer and
    its complement, and episodes by number of searches."""

    def __init__(self) -> None:
        self.episodes = self.steps = self.searches = self.empty = self.answered = 0
        self.by_searches: Counter = Counter()

    def add(self, r: RecordView) -> None:
        kinds = search_steps(r)
        searches = kinds.count("search")
        self.episodes += 1
        self.steps += len(r.env_steps) if r.env_steps is not None else len(r.agent_turns("verifier"))
        self.searches += searches
        self.empty += kinds.count("empty")
        self.answered += r.final_answer is not None
        self.by_searches[searches] += 1

    def result(self) -> dict[str, Any]:
        n = self.episodes
        answer_rate = self.answered / n if n else None
        return {"steps_per_episode": self.steps / n if n else None,
                "searches_per_episode": self.searches / n if n else None,
                "empty_steps_per_episode": self.empty / n if n else None, "answer_tag_rate": answer_rate,
                "no_answer_rate": None if answer_rate is None else 1.0 - answer_rate,
                "searches_distribution": {str(k): v for k, v in sorted(self.by_searches.items())}}


search_episode_figures = Folded(SearchEpisodes)


class ActorActions:
    """A searcher's / answerer's replies, one at a time: the env action each would be (``actions``:
    search / answer / empty) and the share that ended the episode on a tagged answer."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.kinds: Counter = Counter()

    def add(self, text: str) -> None:
        self.kinds[action_kind(self.role, text)] += 1

    def result(self) -> dict[str, Any]:
        n = sum(self.kinds.values())
        return {"actions": {k: self.kinds[k] for k in ACTION_KINDS},
                "answer_tag_rate": self.kinds["answer"] / n if n else None}


def actor_figures(role: str) -> Folded:
    """The per-agent figures of a searcher's / answerer's replies (`ActorActions`)."""
    return Folded(partial(ActorActions, role))


verifier_figures = Folded(partial(Verdicts, search_verdict))  # the search verifier's verdicts (answer / search)


def verifier_parse(text: str) -> tuple[str | None, str | None]:
    """(the spliced reply where the splice changed it, the verdict)."""
    spliced = proto.verify_splice(text)
    return (spliced if spliced != text else None), search_verdict(text)


ACTION_REASONS = ("missing_action_tag", "think_count", "think_order", "cjk")
REASON_LABELS = {"missing_verify_tag": "no <verify> tag", "missing_action_tag": "no search/answer tag",
                 "think_count": "not one <think>", "think_order": "<think> not first", "cjk": "CJK characters"}
EPISODE_LABELS = {"answer_tag_rate": "ended on a tagged answer (%)", "steps_per_episode": "env steps per episode",
                  "searches_per_episode": "searches per episode", "empty_steps_per_episode": "empty steps per episode",
                  "no_answer_rate": "no answer (%)", "searches_distribution": "episodes by number of searches"}

SEARCH_VERIFIER = format_rule(FormatRule(
    "search_verifier", partial(reasons, "search_verifier"), ("missing_verify_tag", "cjk"), verifier_parse,
    agent_figures=verifier_figures, labels={**REASON_LABELS, "verdicts": "verdicts"}))


def actor_parse(role: str) -> Any:
    """The parse of a searcher's / answerer's reply: its projected env action ("" for an empty step)."""

    def parse(text: str) -> tuple[str | None, str | None]:
        return proto.tag_action(text, ACTION_TAGS[role]), None

    return parse


def actor_rule(role: str) -> FormatRule:
    """The searcher's or the answerer's format rule (their own action tag, the think block, no CJK)."""
    return format_rule(FormatRule(role, partial(reasons, role), ACTION_REASONS, actor_parse(role),
                                  agent_figures=actor_figures(role), episode_figures=search_episode_figures,
                                  labels={**REASON_LABELS, **EPISODE_LABELS, "actions": "actions"}))


SEARCHER, ANSWERER = actor_rule("searcher"), actor_rule("answerer")
