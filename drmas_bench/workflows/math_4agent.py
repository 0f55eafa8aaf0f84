"""Math with four agents: Solver -> Critic -> Refiner -> Verifier, looped (the reference's 4-agent team).

    loop r (0-based, at most `rounds`): the solver solves; on the last loop stop; else the critic
    reviews the current answer, the refiner rewrites it (its answer becomes the current one), the
    verifier reviews: approve (or no verdict tag) stops, reject goes round again

The loop is `refine_loop`, written once for every team of this shape: the critic and the refiner act
iff they are among the team's agents, so with them absent it is math_refine's solver / verifier loop
(the 2-agent episodes of the reference vectors pass through it unchanged). Final answer = the last
solver or refiner output, whole (the math env grades it). One team context for the episode, entries
named as the reference names its agents (``Critic Agent``, ``Refiner Agent``).

Rules (checked on the reference's own outputs, tests/test_math_4agent.py):

- critic: valid iff ``<critique>`` and ``</critique>`` both occur (anywhere, in either order) and no
  character in U+4E00..U+9FFF; its team-context text is the whole response with the content of the
  first pair stripped at both ends (`critique_splice`, the verifiers' splice with other tags);
- refiner: the solver's rule (the boxed extraction on the whole response finds an answer); its
  team-context text is the response unchanged.

Prompts: ``math_4agent.prompts.yaml`` (our wording) or ``--prompts``. Options: rounds (2, the
reference scripts' max_loop_num), prompts, protocol (as math_refine: 8192 prompt tokens, cut in the
middle).
"""

from __future__ import annotations

from typing import Any, Iterable

import drmas_bench.workflows.protocol as P
from drmas_bench.records import mean_or_none, rate, views
from drmas_bench.types import Trajectory
from drmas_bench.workflows.base import Episode, format_rule, rule_reasons, workflow

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


@format_rule("critic")
def critic_reasons(text: str) -> list[str]:
    """Every reason a critic's response fails: missing_critique_tag (``<critique>`` or ``</critique>``
    absent), cjk (`protocol.has_cjk`)."""
    out = [] if CRITIQUE_OPEN in text and CRITIQUE_CLOSE in text else ["missing_critique_tag"]
    return out + (["cjk"] if P.has_cjk(text) else [])


@format_rule("refiner")
def refiner_reasons(text: str) -> list[str]:
    """The refiner's rule: the solver's (missing_boxed / unbalanced_boxed)."""
    return P.reasons("solver", text)


# agent -> (its format rule, what of its response enters the team context)
RULES = {"solver": ("solver", lambda t: P.project("solver", t)),
         "critic": ("critic", critique_splice),
         "refiner": ("refiner", lambda t: t),
         "verifier": ("math_verifier", lambda t: P.project("math_verifier", t))}


async def refine_loop(ep: Episode, tpl: P.Templates, rounds: int, agents: tuple[str, ...]) -> None:
    """The looped math team over ``agents`` (a subset of solver, critic, refiner, verifier, in that
    order; module docstring). Each call's validity is its agent's rule; the final answer is the last
    solver or refiner output."""
    said: list[tuple[str, str]] = []  # (agent, team-context text): one team context for the episode

    async def act(agent: str, r: int) -> str:
        msgs = P.chat(tpl, agent, question=ep.task.question, team_context=P.team_context(tpl, said),
                      round=r + 1, rounds=rounds)
        turn = await ep.call(agent, msgs)
        text = turn.completion.text
        rule, shown = RULES[agent]
        turn.valid = not rule_reasons(rule, text)
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
        if "verifier" in agents and P.math_verdict(await act("verifier", r)) == "approve":
            break


def round1_answer(traj: Trajectory) -> str | None:
    """The solver's first answer when a later solver or refiner output replaced it; None when it is final."""
    answers = [t.completion.text for t in traj.turns if t.agent in ANSWERING]
    return answers[0] if len(answers) > 1 else None


def math4_effects(records: Iterable[Any]) -> dict[str, Any]:
    """What the critic / refiner / verifier did to the score, over E episodes.

    - refined = episodes in which the refiner acted (refined_rate = refined / E); replaced = episodes
      whose first solver answer was replaced (by the refiner or a second solver turn);
    - flips {wrong_to_right, right_to_wrong, wrong_to_wrong, right_to_right}: over the replaced
      episodes with a recorded round-1 grade, (first answer right?) -> (final answer right?);
    - approve_rate = the verifier's first verdicts that approve / episodes with a verdict;
    - graded_episodes, round1_accuracy, final_accuracy, accuracy_change (final - round 1), over the
      episodes whose first answer's grade is known (the final grade when it was never replaced)."""
    recs = views(records)
    flips = dict.fromkeys(("wrong_to_right", "right_to_wrong", "wrong_to_wrong", "right_to_right"), 0)
    refined = replaced = approved = judged = 0
    graded: list[tuple[bool, bool]] = []
    for r in recs:
        answers = sum(len(r.agent_turns(a)) for a in ANSWERING)
        refined += bool(r.agent_turns("refiner"))
        r1 = r.correct if answers == 1 else r.round1_correct if answers > 1 else None
        if answers > 1:
            replaced += 1
            if r1 is not None:
                flips[f"{'right' if r1 else 'wrong'}_to_{'right' if r.correct else 'wrong'}"] += 1
        if r1 is not None:
            graded.append((r1, r.correct))
        verdicts = r.agent_turns("verifier")
        if verdicts:
            judged += 1
            approved += P.math_verdict(verdicts[0].text) == "approve"
    r1_acc = mean_or_none([float(a) for a, _ in graded])
    fin_acc = mean_or_none([float(b) for _, b in graded])
    return {"episodes": len(recs), "refined": refined, "refined_rate": rate(refined, len(recs)),
            "replaced": replaced, "flips": flips, "judged": judged, "approve_rate": rate(approved, judged),
            "graded_episodes": len(graded), "round1_accuracy": r1_acc, "final_accuracy": fin_acc,
            "accuracy_change": None if r1_acc is None or fin_acc is None else fin_acc - r1_acc}


SEEN = {"question", "team_context", "round", "rounds"}
PLACEHOLDERS = {a: (SEEN, {"question", "team_context"}) for a in ("solver", "critic", "refiner", "verifier")}
AGENTS = ("solver", "critic", "refiner", "verifier")


@workflow("math_4agent", agents=AGENTS, family="math",
          rules={a: RULES[a][0] for a in AGENTS}, effects=("math_4agent", math4_effects),
          placeholders=PLACEHOLDERS, prompt_limit=(8192, "middle"), round1_answer=round1_answer)
async def math_4agent(ep: Episode, rounds: int = 2, prompts: P.Templates | None = None,
                      protocol: P.ProtocolOptions | None = None) -> None:
    tpl = prompts or P.default_templates("math_4agent")
    ep.limit_prompts(*(protocol or P.ProtocolOptions()).resolve("math_4agent"))
    await refine_loop(ep, tpl, rounds, AGENTS)
