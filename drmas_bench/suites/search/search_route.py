"""Search: verifier (router) -> searcher | answerer, at most `max_steps` env steps (REFERENCE.md §2b).

    step t = 1..max_steps (the team context starts empty every step):
        the verifier judges the history                  (always acts; its context is "")
        "search": t < max_steps -> the searcher acts      (its context: this step's verifier entry)
                  t = max_steps -> nobody acts, the action is ""
        "answer": the answerer acts                       (the same context; the packaged prompt
                                                           does not show it, as in the reference)
        the env takes the projected action (`env.SearchEnv`): done at the last step or when
        the action holds <answer> and </answer>; then reward = EM of the last answer match in the
        episode's actions and observations. Else a <search> query (an empty one too) retrieves top-k
        passages; no query = an empty step. history += "Step t:" action observation

The trajectory's final answer is what the env graded (None: no answer, reward 0), so the qa grader's
EM is the env's reward; ``extra["env"]`` keeps the env's account of each step. Tags, projections,
verdict / validity rules, observation and history rendering come from `protocol`; the role prompts
from ``search_route.prompts.yaml`` (or ``--prompts``). Options: max_steps (4), topk (3), prompts,
protocol (prompt limit, default 4096 tokens cut from the left), last_step ("end": the reference;
"answer": the answerer acts at the last step whatever the verifier said, this project's earlier
behaviour: an episode the verifier would let run out still gets an answer).
"""

from __future__ import annotations

import asyncio
from typing import Any

from drmas_bench.figures import Effects, Figure
from drmas_bench.grading.qa import grade_qa
from drmas_bench.records import rate, view
from drmas_bench.suites.search.env import SearchEnv, observation, observation_passages
from drmas_bench.suites.search.rules import (
    AGENT_NAMES,
    ANSWERER,
    SEARCH_VERIFIER,
    SEARCHER,
    SearchEpisodes,
    project,
    search_steps,
    search_verdict,
    valid,
)
from drmas_bench.suites.search.search_sft import search_sft_examples
from drmas_bench.types import UserError
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.base import Episode, workflow
from drmas_bench.workflows.rules import Folded

# the per-episode figures of `compliance` the search effects block repeats (one definition:
# `rules.SearchEpisodes`)
SEARCH_EPISODE_KEYS = ("steps_per_episode", "searches_per_episode", "searches_distribution", "no_answer_rate")


def evidence_at_answer(r: Any) -> tuple[bool | None, bool | None]:
    """(evidence when the answerer was called, evidence anywhere in the episode) of one search_route
    episode: whether a gold answer occurs, SQuAD-normalised as a whole-token span (`grade_qa`'s
    cover-EM), in the passages (`env.observation_passages`) the env showed before the answerer's last call (the observations of
    the steps before its step; step t = the t-th verifier turn), resp. in every observation of the
    episode. First None: the answerer never acted; both None: no env record (``extra["env"]``,
    runs from before it). A compact record (``drmas_bench.compact``) carries both, computed when stored
    (`evidence_figures`)."""
    rec = view(r)
    if rec.env_steps is None:
        return None, None
    kept = (rec.raw.get("figures") or {}).get("evidence")  # computed when the record was stored (drmas_bench.compact)
    if isinstance(kept, list) and len(kept) == 2:
        return kept[0], kept[1]
    golds = list(rec.answers)
    obs = [observation_passages(str(s.get("observation") or "")) for s in rec.env_steps]
    step = answer_step = 0
    for t in rec.turns:
        if t.agent == "verifier":
            step += 1
        elif t.agent == "answerer":
            answer_step = step

    def seen(texts: list[str]) -> bool:
        return bool(grade_qa("\n".join(texts), golds).cover_em)

    return (seen(obs[:answer_step - 1]) if answer_step else None), seen(obs)


def evidence_figures(record: dict[str, Any]) -> dict[str, Any]:
    """The figure `evidence_at_answer` reads from the observations, kept in a compact record."""
    return {"evidence": list(evidence_at_answer(record))}


class SearchEffects:
    """What retrieval gave a search_route run's answerer, over E episodes (`evidence_at_answer`), one
    episode at a time:

    - env_recorded = episodes with the env's record (older runs have none: evidence figures None);
    - answerer_episodes = of those, episodes where the answerer acted; evidence_recall = share of
      them with a gold answer in the passages retrieved before its last call;
    - accuracy_with_evidence / accuracy_without_evidence = mean correctness (EM) of the answerer
      episodes with / without that evidence (with_evidence / without_evidence: their counts);
    - evidence_retrieved_rate = share of env_recorded episodes whose retrieved passages (all steps)
      contain a gold answer: what the searcher found, whether or not the answerer used it;
    - steps_per_episode, searches_per_episode, searches_distribution, no_answer_rate: `compliance`'s
      per-episode figures (the same definitions)."""

    def __init__(self) -> None:
        self.episodes = self.recorded = self.anywhere = 0
        self.with_ev = self.with_ev_right = self.without = self.without_right = 0
        self.steps = SearchEpisodes()

    def add(self, record: Any) -> None:
        r = view(record)
        self.episodes += 1
        self.steps.add(r)
        ev, ev_any = evidence_at_answer(r)
        if ev_any is None:
            return
        self.recorded += 1
        self.anywhere += ev_any
        if ev is None:
            return
        if ev:
            self.with_ev += 1
            self.with_ev_right += r.correct
        else:
            self.without += 1
            self.without_right += r.correct

    def result(self) -> dict[str, Any]:
        ep = self.steps.result()
        answered = self.with_ev + self.without
        return {
            "episodes": self.episodes, "env_recorded": self.recorded, "answerer_episodes": answered,
            "evidence_recall": rate(self.with_ev, answered),
            "with_evidence": self.with_ev, "without_evidence": self.without,
            "accuracy_with_evidence": rate(self.with_ev_right, self.with_ev),
            "accuracy_without_evidence": rate(self.without_right, self.without),
            "evidence_retrieved_rate": rate(self.anywhere, self.recorded),
            **{k: ep[k] for k in SEARCH_EPISODE_KEYS},
        }


search_effects = Folded(SearchEffects)  # over a list of records (`metrics.effects` folds it as it reads)


# each role prompt's placeholders: (those it may use, those it must use). team_context is this
# step's context: "" for the verifier (the reference's verifier template has no slot), the
# verifier's entry for the searcher (required) and the answerer (the reference passes it to the
# answerer but its template has no slot, so the packaged answerer prompt leaves it out);
# verifier_output is the verifier's projected response of this step; prior_steps = step - 1.
SEEN = {"question", "history", "step", "max_steps", "prior_steps", "team_context"}
PLACEHOLDERS = {"verifier": (SEEN, {"question", "history"}),
                "searcher": (SEEN | {"verifier_output"}, {"question", "history", "team_context"}),
                "answerer": (SEEN | {"verifier_output"}, {"question", "history"})}


# what retrieval gave the answerer, as every report shows it (`drmas_bench.figures`)
SEARCH_EFFECTS = Effects(
    "search", search_effects,
    figures=(Figure("evidence_recall", "evidence recall", "share"),
             Figure("accuracy_with_evidence", "accuracy with evidence", "share"),
             Figure("accuracy_without_evidence", "accuracy without evidence", "share"),
             Figure("evidence_retrieved_rate", "gold retrieved at all", "share"),
             Figure("searches_per_episode", "searches per episode", "number"),
             Figure("steps_per_episode", "env steps per episode", "number"), Figure("no_answer_rate", "no answer", "share"),
             Figure("episodes", "episodes", "count"), Figure("env_recorded", "episodes with an env record", "count"),
             Figure("answerer_episodes", "episodes where the answerer acted", "count"),
             Figure("with_evidence", "answered with evidence", "count"),
             Figure("without_evidence", "answered without evidence", "count"),
             Figure("searches_distribution", "episodes by number of searches", "counts")),
    phrase=("evidence recall {evidence_recall}; acc with / without evidence "
            "{accuracy_with_evidence} / {accuracy_without_evidence}"),
    note=("Evidence recall: episodes where a gold answer (SQuAD-normalised) was in the passages retrieved before "
          "the answerer's last call, of those where the answerer acted."))


@workflow("search_route", agents=("verifier", "searcher", "answerer"), family="qa", needs_retriever=True,
          rules={"verifier": SEARCH_VERIFIER, "searcher": SEARCHER, "answerer": ANSWERER},
          effects=SEARCH_EFFECTS, placeholders=PLACEHOLDERS, title="search",
          prompt_limit=(4096, "left"), sft=search_sft_examples, env_step_agent="verifier",
          env_step_kinds=search_steps, record_figures=evidence_figures)  # REFERENCE §2b / §3
async def search_route(ep: Episode, max_steps: int = 4, topk: int = 3, prompts: proto.Templates | None = None,
                       protocol: proto.ProtocolOptions | None = None, last_step: str = "end") -> None:
    if last_step not in ("end", "answer"):
        raise UserError(f"search_route: last_step must be 'end' or 'answer', got {last_step!r}")
    tpl = prompts or proto.default_templates("search_route")
    ep.limit_prompts(*(protocol or proto.ProtocolOptions()).resolve("search_route"))
    env = SearchEnv(list(ep.task.answers), max_steps)
    for t in range(1, max_steps + 1):
        seen = dict(question=ep.task.question, history=proto.history(tpl, env.steps), step=t, max_steps=max_steps,
                    prior_steps=t - 1)
        ver = await ep.verifier(proto.chat(tpl, "verifier", team_context=proto.team_context(tpl, [], AGENT_NAMES), **seen))
        ver.valid = valid("search_verifier", ver.completion.text)
        verdict = project("search_verifier", ver.completion.text)
        context = proto.team_context(tpl, [("verifier", verdict)], AGENT_NAMES)
        route = search_verdict(ver.completion.text)
        if route == "search" and t == max_steps and last_step == "end":
            role = None  # nobody acts: the env takes an empty action and the episode ends
        else:
            role = "searcher" if route == "search" and t < max_steps else "answerer"
        response = ""
        if role is not None:
            turn = await ep.call(role, proto.chat(tpl, role, team_context=context, verifier_output=verdict, **seen))
            response = turn.completion.text
            turn.valid = valid(role, response)
        st = env.act(project(role, response) if role else "", response)
        if st.done:
            break
        if st.query is not None:  # the tool strips the query; an empty one is still sent
            results = await asyncio.to_thread(ep.retriever.search, [st.query.strip()], topk)
            env.observe(observation(results[0] if results else None))
    ep.final_answer = env.answer
    ep.traj.extra["env"] = env.record()
