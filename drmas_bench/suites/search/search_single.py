"""Search, one agent: search and answer in one growing conversation (the single-agent baseline of
docs/eval.md, after Search-R1's protocol; REFERENCE §2b for everything the team shares).

    messages = [system, the agent's prompt]
    step t = 1..max_steps:
        the agent replies; its action is the first complete <search>q</search> or <answer>a</answer>
        of the reply (whichever closes first; `single_action`), else "" (an empty step)
        the env takes the action (`env.SearchEnv`, the team's env): done at the last step or
        when the action holds <answer> and </answer>; then reward = EM of the last answer match in
        the episode's actions and observations. Else a query (an empty one too) retrieves top-k
        passages and the next user message is `env.observation(...)` exactly; an empty step's
        next user message is the ``no_action`` prompt.
        messages += [the reply up to the end of its action, the next user message]

With search_route's defaults (4 steps, top-3) the agent searches at most 3 times, like the team: the
4th step ends the episode whatever the action. The conversation keeps each reply only up to its
action's closing tag, as Search-R1's generation stops there (text after it, e.g. an invented
``<information>``, is not shown back; the recorded turn keeps the whole reply).

Validity (our choice, for the c_inv penalty; the reference has no single agent): the searcher's and
answerer's rule with either tag: the reply has an action (`single_action` is not ""), no CJK, and
``<think>`` and ``</think>`` each exactly once, ``<think>`` first. A closing tag before its opening
tag is no action here (the team's projection keeps that quirk; a new protocol need not).

The final answer is what the env graded (None: no answer), so the qa grader's EM is the env's reward;
``extra["env"]`` keeps the env's account. Prompts: ``search_single.prompts.yaml`` (or ``--prompts``);
roles ``agent`` (placeholders question (required), max_steps, max_searches) and ``no_action`` (step,
max_steps). Options: max_steps (4), topk (3), prompts, protocol (prompt limit, default 4096 tokens cut
from the left, search_route's).
"""

from __future__ import annotations

import asyncio

from drmas_bench.suites.search.env import SearchEnv, observation
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.base import Episode, workflow
from drmas_bench.workflows.rules import FormatRule, format_rule

ACTIONS = ("search", "answer")


def single_action(text: str) -> tuple[str, int]:
    """(the env action of one reply, where the reply's action ends): of ``<search>...</search>`` and
    ``<answer>...</answer>`` (each: its first opening tag, then the first closing tag after it) the
    one that closes first, as ``<tag>`` + stripped content + ``</tag>``; ("", len(text)) if neither."""
    found = []
    for tag in ACTIONS:
        op, cl = f"<{tag}>", f"</{tag}>"
        start = text.find(op)
        end = text.find(cl, start + len(op)) if start >= 0 else -1
        if end >= 0:
            found.append((end + len(cl), tag, text[start + len(op):end]))
    if not found:
        return "", len(text)
    end, tag, inner = min(found)
    return f"<{tag}>{inner.strip()}</{tag}>", end


def single_reasons(text: str) -> list[str]:
    """The single agent's rule (module docstring): missing_action_tag (no complete search or answer
    pair, `single_action`), think_count / think_order (`protocol.think_reasons`), cjk."""
    out = [] if single_action(text)[0] else ["missing_action_tag"]
    out += proto.think_reasons(text)
    return out + ["cjk"] if proto.has_cjk(text) else out


SINGLE_ACTION = format_rule(FormatRule(
    "single_action", single_reasons, ("missing_action_tag", "think_count", "think_order", "cjk"),
    labels={"missing_action_tag": "no search/answer tag", "think_count": "not one <think>",
            "think_order": "<think> not first", "cjk": "CJK characters"}))


def single_valid(text: str) -> bool:
    """Whether a reply passes the single agent's rule (`single_reasons` finds none)."""
    return not single_reasons(text)


@workflow("search_single", agents=("agent",), family="qa", needs_retriever=True, rules={"agent": SINGLE_ACTION},
          title="single-agent search",
          placeholders={"agent": ({"question", "max_steps", "max_searches"}, {"question"}),
                        "no_action": ({"step", "max_steps"}, set())},
          prompt_limit=(4096, "left"))
async def search_single(ep: Episode, max_steps: int = 4, topk: int = 3, prompts: proto.Templates | None = None,
                        protocol: proto.ProtocolOptions | None = None) -> None:
    tpl = prompts or proto.default_templates("search_single")
    ep.limit_prompts(*(protocol or proto.ProtocolOptions()).resolve("search_single"))
    env = SearchEnv(list(ep.task.answers), max_steps)
    messages = proto.chat(tpl, "agent", question=ep.task.question, max_steps=max_steps, max_searches=max_steps - 1)
    for t in range(1, max_steps + 1):
        turn = await ep.agent(list(messages))
        response = turn.completion.text
        turn.valid = single_valid(response)
        action, end = single_action(response)
        st = env.act(action, response)
        if st.done:
            break
        if st.query is not None:  # the tool strips the query; an empty one is still sent
            results = await asyncio.to_thread(ep.retriever.search, [st.query.strip()], topk)
            env.observe(observation(results[0] if results else None))
            follow = env.steps[-1].observation
        else:
            follow = proto.render(tpl.roles["no_action"], step=t, max_steps=max_steps)
        messages += [{"role": "assistant", "content": response[:end]}, {"role": "user", "content": follow}]
    ep.final_answer = env.answer
    ep.traj.extra["env"] = env.record()
