"""Math: solver / verifier refinement loop (REFERENCE.md §2, §2b), at most `rounds` solver turns.

    round r: the solver solves; on the last round stop; else the verifier reviews: approve? stop

Final answer = the last solver output, whole (the math env grades it). One team context for the
episode: each agent sees the entries of every earlier call (solver: its response; verifier: the
spliced response). Tags, projection, verdict and validity rules and chat layout come from
`protocol`; the role prompts from ``math_refine.prompts.yaml`` (or ``--prompts``). Options: rounds (2), prompts (Templates; None = packaged), protocol (ProtocolOptions: prompt limit,
default 8192 tokens cut in the middle).
"""

from __future__ import annotations

import drmas_bench.workflows.protocol as P
from drmas_bench.workflows.base import Episode, workflow


@workflow("math_refine", agents=("solver", "verifier"), grader="math",
          rules={"solver": "solver", "verifier": "math_verifier"}, effects=("math", "math_effects"))
async def math_refine(ep: Episode, rounds: int = 2, prompts: P.Templates | None = None,
                      protocol: P.ProtocolOptions | None = None) -> None:
    tpl = prompts or P.default_templates("math_refine")
    ep.limit_prompts(*(protocol or P.ProtocolOptions()).resolve("math_refine"))
    said: list[tuple[str, str]] = []  # (agent, projected text): one team context for the episode

    def prompt(role: str, r: int) -> list[dict[str, str]]:
        return P.chat(tpl, role, question=ep.task.question, team_context=P.team_context(tpl, said),
                      round=r + 1, rounds=rounds)

    for r in range(rounds):
        sol = await ep.solver(prompt("solver", r))
        sol.valid = P.valid("solver", sol.completion.text)
        said.append(("solver", P.project("solver", sol.completion.text)))
        ep.final_answer = sol.completion.text
        if r == rounds - 1:
            break
        ver = await ep.verifier(prompt("verifier", r))
        ver.valid = P.valid("math_verifier", ver.completion.text)
        said.append(("verifier", P.project("math_verifier", ver.completion.text)))
        if P.math_verdict(ver.completion.text) == "approve":
            break
