"""Search: verifier (router) -> searcher -> answerer, at most `max_steps` steps (REFERENCE.md §2).

    each step: the verifier judges whether the evidence so far suffices
        yes (or unparsable) -> the answerer answers in <answer>, which ends the episode
        no                  -> the searcher writes one <search>query</search>; the retriever's
                               top-k passages come back as <information>Doc i: ...</information>
    the searcher may search only while step < max_steps (at most max_steps - 1 searches); at the
    last step the answerer answers whatever the verifier says.

Searcher / answerer valid iff their tag is present and exactly one <think> block precedes it.
The verifier is called at every step, as in the reference; its validity is its tag being present.
"""

from __future__ import annotations

import asyncio
import re

from drmas_bench.workflows.base import Episode, chat, workflow

VERIFIER_SYSTEM = (
    "You are the Verifier on a question-answering team that can search Wikipedia. Decide whether the "
    "information gathered so far is enough to answer the question. Reply <judgement>yes</judgement> if "
    "it is enough, or <judgement>no</judgement> if another search is needed."
)
SEARCHER_SYSTEM = (
    "You are the Searcher on a question-answering team. Think inside <think></think> about what is still "
    "missing, then write one search query inside <search></search>."
)
ANSWERER_SYSTEM = (
    "You are the Answerer on a question-answering team. Think inside <think></think>, then give a short "
    "final answer (a few words, no explanation) inside <answer></answer>."
)

JUDGEMENT = re.compile(r"<judgement>\s*(yes|no)\s*</judgement>", re.IGNORECASE)
THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def last_tag(text: str, tag: str) -> str | None:
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return found[-1].strip() if found else None


def tagged_after_one_think(text: str, tag: str) -> bool:
    """Valid action: exactly one think block, and the tag after it."""
    thinks = list(THINK.finditer(text))
    if len(thinks) != 1:
        return False
    return last_tag(text[thinks[0].end():], tag) is not None


def format_docs(hits) -> str:
    return "\n".join(f'Doc {i}: "{h.title}"\n{h.text}' for i, h in enumerate(hits, 1))


def history_text(history: list[tuple[str, str]]) -> str:
    if not history:
        return "No searches yet."
    return "\n\n".join(f"Search {i}: {q}\n<information>{docs}</information>" for i, (q, docs) in enumerate(history, 1))


def prompt(system: str, question: str, history: list[tuple[str, str]]) -> list[dict[str, str]]:
    return chat(system, f"Question: {question}\n\nSearch history:\n{history_text(history)}")


@workflow("search_route", agents=("verifier", "searcher", "answerer"), grader="qa", needs_retriever=True,
          max_steps=4, topk=3)
async def search_route(ep: Episode, max_steps: int = 4, topk: int = 3) -> None:
    history: list[tuple[str, str]] = []  # (query, formatted passages)
    for step in range(1, max_steps + 1):
        ver = await ep.verifier(prompt(VERIFIER_SYSTEM, ep.task.question, history))
        judgement = last_tag(ver.completion.text, "judgement")
        ver.valid = judgement is not None and judgement.lower() in ("yes", "no")
        if judgement is not None and judgement.lower() == "no" and step < max_steps:
            s = await ep.searcher(prompt(SEARCHER_SYSTEM, ep.task.question, history))
            s.valid = tagged_after_one_think(s.completion.text, "search")
            query = last_tag(s.completion.text, "search")
            if query:
                hits = (await asyncio.to_thread(ep.retriever.search, [query], topk))[0]
                history.append((query, format_docs(hits)))
            continue
        a = await ep.answerer(prompt(ANSWERER_SYSTEM, ep.task.question, history))
        a.valid = tagged_after_one_think(a.completion.text, "answer")
        ep.final_answer = last_tag(a.completion.text, "answer") or ""
        return
