"""The math team's loop, written once for every team of its shape, and the format rules of its two
optional roles (the reference's MathMultiAgentOrchestra: Solver -> Critic -> Refiner -> Verifier).

    loop r (0-based, at most `rounds`): the solver solves; on the last loop stop; else the critic
    reviews the current answer, the refiner rewrites it (its answer becomes the current one), the
    verifier reviews: approve (or no verdict tag) stops, reject goes round again

The critic and the refiner act iff they are among the team's agents: `math_refine` is this loop over
(solver, verifier), `math_4agent` over all four. Final answer = the last solver or refiner output,
whole (the math env grades it). One team context for the episode, entries named as the reference
names its agents (``Critic Agent``, ``Refiner Agent``: `rules.AGENT_NAMES`).

Rules of the two roles (checked on the reference's own outputs, tests/test_math_4agent.py):

- critic (`CRITIC`): valid iff ``<critique>`` and ``</critique>`` both occur (anywhere, in either
  order) and no character in U+4E00..U+9FFF; its team-context text is the whole response with the
  content of the first pair stripped at both ends (`critique_splice`, the verifiers' splice on other
  tags);
- refiner (`REFINER`): the solver's rule (the boxed extraction on the whole response finds an
  answer); its team-context text is the response unchanged.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

from drmas_bench.grading.extract import reference_boxed
from drmas_bench.suites.math.rules import AGENT_NAMES, MATH_VERIFIER, SOLVER, math_verdict, project, reasons
from drmas_bench.workflows import protocol as proto
from drmas_bench.workflows.base import Episode
from drmas_bench.workflows.rules import FormatRule, format_rule

CRITIQUE_OPEN, CRITIQUE_CLOSE = "<critique>", "</critique>"
ANSWERING = ("solver", "refiner")  # the agents whose output becomes the current answer


def splice(text: str, open_tag: str, close_tag: str) -> str:
    """The whole response with the content of the first (open_tag, close_tag) pair stripped at both
    ends; the two tags are found independently, so a closing tag first repeats the text between them
    (as `protocol.verify_splice`); unchanged when either tag is missing."""
    start, end = text.find(open_tag), text.find(close_tag)
    if start < 0 or end < 0:
        return text
    head = start + len(open_tag)
    return text[:head] + text[head:end].strip() + text[end:]


def critique_splice(text: str) -> str:
    """The critic's team-context text: `splice` on the critique tags."""
    return splice(text, CRITIQUE_OPEN, CRITIQUE_CLOSE)


def critic_reasons(text: str) -> list[str]:
    """Every reason a critic's response fails: missing_critique_tag (``<critique>`` or ``</critique>``
    absent), cjk (`protocol.has_cjk`)."""
    out = [] if CRITIQUE_OPEN in text and CRITIQUE_CLOSE in text else ["missing_critique_tag"]
    return out + (["cjk"] if proto.has_cjk(text) else [])


def critic_parse(text: str) -> tuple[str | None, None]:
    """(the spliced reply where the splice changed it, no verdict: the critic gives none)."""
    spliced = critique_splice(text)
    return (spliced if spliced != text else None), None


CRITIC = format_rule(FormatRule(
    "critic", critic_reasons, ("missing_critique_tag", "cjk"), critic_parse,
    labels={"missing_critique_tag": "no <critique> tag", "cjk": "CJK characters"}))
REFINER = format_rule(FormatRule(
    "refiner", partial(reasons, "solver"), ("missing_boxed", "unbalanced_boxed"),
    lambda text: (reference_boxed(text), None),  # its answer, read as the solver's
    labels={"missing_boxed": "no \\boxed{}", "unbalanced_boxed": "unbalanced \\boxed{}"}))

# agent -> (its format rule, what of its response enters the team context)
ROLES: dict[str, tuple[FormatRule, Callable[[str], str]]] = {
    "solver": (SOLVER, partial(project, "solver")), "critic": (CRITIC, critique_splice),
    "refiner": (REFINER, lambda text: text), "verifier": (MATH_VERIFIER, partial(project, "math_verifier"))}


async def refine_loop(ep: Episode, tpl: proto.Templates, rounds: int, agents: tuple[str, ...]) -> None:
    """The looped math team over ``agents`` (a subset of solver, critic, refiner, verifier; module
    docstring). Each call's validity is its agent's rule; the final answer is the last solver or
    refiner output."""
    said: list[tuple[str, str]] = []  # (agent, team-context text): one team context for the episode

    async def act(agent: str, r: int) -> str:
        msgs = proto.chat(tpl, agent, question=ep.task.question, team_context=proto.team_context(tpl, said, AGENT_NAMES),
                      round=r + 1, rounds=rounds)
        turn = await ep.call(agent, msgs)
        text = turn.completion.text
        rule, shown = ROLES[agent]
        turn.valid = not rule(text)
        said.append((agent, shown(text)))
        if agent in ANSWERING:
            ep.final_answer = text
        return text

    for r in range(rounds):
        if "solver" in agents:
            await act("solver", r)
        if r == rounds - 1:
            break
        for agent in ("critic", "refiner"):
            if agent in agents:
                await act(agent, r)
        if "verifier" in agents and math_verdict(await act("verifier", r)) == "approve":
            break
