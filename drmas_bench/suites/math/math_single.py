"""Math, one agent: the solver alone, one call (the single-agent baseline of docs/eval.md, REFERENCE §2b).

The paper compares its teams with one model trained alone (single-agent GRPO). This is that model's
episode: the solver sees the question and nothing else (no team, no team context, no second round),
answers once, and its whole response is the final answer, graded like math_refine's. Validity
(`rules.valid("solver")`), chat layout (`protocol.chat`) and the prompt limit (8192 tokens, cut in
the middle) are math_refine's, so the two differ only in the team. Prompts:
``math_single.prompts.yaml`` (or ``--prompts``); placeholder: question. Options: prompts, protocol.
"""

from __future__ import annotations

import random

from drmas_bench.suites.arithmetic import near_miss, sum_question
from drmas_bench.suites.math.rules import SOLVER, valid
from drmas_bench.types import SFTExample
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.base import Episode, workflow


def math_single_sft_examples(agents: list[str], n: int, seed: int = 0, *, solver_accuracy: float = 0.5,
                             max_operand: int = 9, **_: float) -> list[SFTExample]:
    """``n`` examples for the single solver of ``math_single``: its packaged prompt on "What is a + b?"
    and the target ``\\boxed{N}``, N right with probability ``solver_accuracy`` (else a near miss).
    The toy team's checker and retry options have no meaning here and are ignored."""
    unknown = sorted(set(agents) - {"solver"})
    if unknown:
        raise ValueError(f"the math_single warm start knows the agent solver, not {', '.join(unknown)}")
    tpl = proto.default_templates("math_single")
    rng = random.Random(seed)
    out: list[SFTExample] = []
    for _example in range(n):
        q, right = sum_question(rng, max_operand)
        ans = right if rng.random() < solver_accuracy else near_miss(rng, right)
        out.append(SFTExample("solver", proto.chat(tpl, "solver", question=q), f"\\boxed{{{ans}}}"))
    return out


@workflow("math_single", agents=("solver",), family="math", rules={"solver": SOLVER}, title="single-agent math",
          placeholders={"solver": ({"question"}, {"question"})}, prompt_limit=(8192, "middle"),
          sft=math_single_sft_examples)
async def math_single(ep: Episode, prompts: proto.Templates | None = None,
                      protocol: proto.ProtocolOptions | None = None) -> None:
    tpl = prompts or proto.default_templates("math_single")
    ep.limit_prompts(*(protocol or proto.ProtocolOptions()).resolve("math_single"))
    sol = await ep.solver(proto.chat(tpl, "solver", question=ep.task.question))
    sol.valid = valid("solver", sol.completion.text)
    ep.final_answer = sol.completion.text
