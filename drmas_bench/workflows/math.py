"""Math: solver / verifier refinement loop (REFERENCE.md §2, §2b), at most `rounds` solver turns.

    round r: the solver solves; on the last round stop; else the verifier reviews: approve? stop

Final answer = the last solver output. Tags, verdict and validity rules, team context and chat
layout come from `protocol`; the role prompts from ``math_refine.prompts.yaml`` (or ``--prompts``).
Options: rounds (2), prompts (Templates; None = packaged), protocol (ProtocolOptions: prompt limit,
default 8192 tokens cut in the middle).
"""

from __future__ import annotations

from drmas_bench.workflows import protocol as P
from drmas_bench.workflows.base import Episode, workflow


@workflow("math_refine", agents=("solver", "verifier"), grader="math")
async def math_refine(ep: Episode, rounds: int = 2, prompts: P.Templates | None = None,
                      protocol: P.ProtocolOptions | None = None) -> None:
    tpl = prompts or P.default_templates("math_refine")
    ep.limit_prompts(*(protocol or P.ProtocolOptions()).resolve("math_refine"))

    def prompt(role: str, r: int) -> list[dict[str, str]]:
        context = P.team_context(tpl, [(t.agent, t.completion.text) for t in ep.turns])
        return P.chat(tpl, role, question=ep.task.question, team_context=context, round=r + 1, rounds=rounds)

    for r in range(rounds):
        sol = await ep.solver(prompt("solver", r))
        sol.valid = P.solver_valid(sol.completion.text)
        ep.final_answer = sol.completion.text
        if r == rounds - 1:
            break
        ver = await ep.verifier(prompt("verifier", r))
        ver.valid = P.verify_valid(ver.completion.text)
        if P.math_verdict(ver.completion.text) == "approve":
            break
