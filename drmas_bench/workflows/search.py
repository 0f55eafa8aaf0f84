"""Search: verifier (router) -> searcher | answerer, at most `max_steps` env steps (REFERENCE.md §2b).

    step t = 1..max_steps (the team context starts empty every step):
        the verifier judges the history                  (always acts; its context is "")
        "search": t < max_steps -> the searcher acts      (its context: this step's verifier entry)
                  t = max_steps -> nobody acts, the action is ""
        "answer": the answerer acts                       (the same context; the packaged prompt
                                                           does not show it, as in the reference)
        the env takes the projected action (`protocol.SearchEnv`): done at the last step or when
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

from drmas_bench.types import UserError
import drmas_bench.workflows.protocol as P
from drmas_bench.workflows.base import Episode, workflow


@workflow("search_route", agents=("verifier", "searcher", "answerer"), grader="qa", needs_retriever=True,
          rules={"verifier": "search_verifier", "searcher": "searcher", "answerer": "answerer"},
          effects=("search", "search_effects"))
async def search_route(ep: Episode, max_steps: int = 4, topk: int = 3, prompts: P.Templates | None = None,
                       protocol: P.ProtocolOptions | None = None, last_step: str = "end") -> None:
    if last_step not in ("end", "answer"):
        raise UserError(f"search_route: last_step must be 'end' or 'answer', got {last_step!r}")
    tpl = prompts or P.default_templates("search_route")
    ep.limit_prompts(*(protocol or P.ProtocolOptions()).resolve("search_route"))
    env = P.SearchEnv(list(ep.task.answers), max_steps)
    for t in range(1, max_steps + 1):
        seen = dict(question=ep.task.question, history=P.history(tpl, env.steps), step=t, max_steps=max_steps,
                    prior_steps=t - 1)
        ver = await ep.verifier(P.chat(tpl, "verifier", team_context=P.team_context(tpl, []), **seen))
        ver.valid = P.valid("search_verifier", ver.completion.text)
        verdict = P.project("search_verifier", ver.completion.text)
        context = P.team_context(tpl, [("verifier", verdict)])
        route = P.search_verdict(ver.completion.text)
        if route == "search" and t == max_steps and last_step == "end":
            role = None  # nobody acts: the env takes an empty action and the episode ends
        else:
            role = "searcher" if route == "search" and t < max_steps else "answerer"
        response = ""
        if role is not None:
            turn = await ep.call(role, P.chat(tpl, role, team_context=context, verifier_output=verdict, **seen))
            response = turn.completion.text
            turn.valid = P.valid(role, response)
        st = env.act(P.project(role, response) if role else "", response)
        if st.done:
            break
        if st.query is not None:  # the tool strips the query; an empty one is still sent
            results = await asyncio.to_thread(ep.retriever.search, [st.query.strip()], topk)
            env.observe(P.observation(results[0] if results else None))
    ep.final_answer = env.answer
    ep.traj.extra["env"] = env.record()
