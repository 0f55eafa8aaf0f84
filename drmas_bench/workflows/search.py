"""Search: verifier (router) -> searcher | answerer, at most `max_steps` env steps (REFERENCE.md §2b).

    step t = 1..max_steps:
        the verifier judges the history            (always acts)
        "search": t < max_steps -> the searcher acts (it also sees the verifier's output of this step)
                  t = max_steps -> the episode ends with no answer (reward 0)
        "answer": the answerer acts (question and history only)
        the action goes to the environment: <search> retrieves top-k passages (an empty query is
        still sent), <answer> ends the episode, neither tag = an empty step (the episode goes on)
        history += "Step t:" + action + observation

Tags, verdict / validity rules, observation and history rendering come from `protocol`; the role
prompts from ``search_route.prompts.yaml`` (or ``--prompts``). Options: max_steps (4), topk (3),
prompts, protocol (prompt limit, default 4096 tokens cut from the left), last_step ("end": the
reference; "answer": the answerer answers at the last step whatever the verifier said, as this
project did before following §2b).
"""

from __future__ import annotations

import asyncio

from drmas_bench.types import UserError
from drmas_bench.workflows import protocol as P
from drmas_bench.workflows.base import Episode, workflow


@workflow("search_route", agents=("verifier", "searcher", "answerer"), grader="qa", needs_retriever=True)
async def search_route(ep: Episode, max_steps: int = 4, topk: int = 3, prompts: P.Templates | None = None,
                       protocol: P.ProtocolOptions | None = None, last_step: str = "end") -> None:
    if last_step not in ("end", "answer"):
        raise UserError(f"search_route: last_step must be 'end' or 'answer', got {last_step!r}")
    tpl = prompts or P.default_templates("search_route")
    ep.limit_prompts(*(protocol or P.ProtocolOptions()).resolve("search_route"))
    steps: list[P.Step] = []
    for t in range(1, max_steps + 1):
        seen = dict(question=ep.task.question, history=P.history(tpl, steps), step=t, max_steps=max_steps)
        ver = await ep.verifier(P.chat(tpl, "verifier", **seen))
        ver.valid = P.verify_valid(ver.completion.text)
        route = P.search_verdict(ver.completion.text)
        if route == "search" and t == max_steps and last_step == "end":
            return  # "search" at the last step: the episode ends with no answer
        if route == "search" and t < max_steps:
            turn = await ep.searcher(P.chat(tpl, "searcher", verifier_output=ver.completion.text, **seen))
        else:
            turn = await ep.answerer(P.chat(tpl, "answerer", **seen))
        turn.valid = P.action_valid(turn.completion.text)
        act = P.env_action(turn.completion.text)
        if act.kind == "answer":
            ep.final_answer = act.content
            return
        obs = ""
        if act.kind == "search":
            obs = P.observation((await asyncio.to_thread(ep.retriever.search, [act.content], topk))[0])
        steps.append(P.Step(t, act.text, obs, turn.completion.text))
