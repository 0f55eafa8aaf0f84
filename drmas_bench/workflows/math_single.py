"""Math, one agent: the solver alone, one call (the single-agent baseline of issue 25, REFERENCE §2b).

The paper compares its teams with one model trained alone (single-agent GRPO). This is that model's
episode: the solver sees the question and nothing else (no team, no team context, no second round),
answers once, and its whole response is the final answer, graded like math_refine's. Validity
(`protocol.valid("solver")`), chat layout (`protocol.chat`) and the prompt limit (8192 tokens, cut in
the middle) are math_refine's, so the two differ only in the team. Prompts:
``math_single.prompts.yaml`` (or ``--prompts``); placeholder: question. Options: prompts, protocol.
"""

from __future__ import annotations

import drmas_bench.workflows.protocol as P
from drmas_bench.workflows.base import Episode, workflow


@workflow("math_single", agents=("solver",), grader="math", rules={"solver": "solver"},
          placeholders={"solver": ({"question"}, {"question"})}, prompt_limit=(8192, "middle"))
async def math_single(ep: Episode, prompts: P.Templates | None = None,
                      protocol: P.ProtocolOptions | None = None) -> None:
    tpl = prompts or P.default_templates("math_single")
    ep.limit_prompts(*(protocol or P.ProtocolOptions()).resolve("math_single"))
    sol = await ep.solver(P.chat(tpl, "solver", question=ep.task.question))
    sol.valid = P.valid("solver", sol.completion.text)
    ep.final_answer = sol.completion.text
