"""Supervised warm starts (the ``sft:`` stage of the ``tiny`` and ``tiny_single`` recipes), one
example maker per workflow in `SFT_EXAMPLES`: the toy team (below) and ``math_single``, the solver
alone on the same "What is a + b?" questions, whose target is ``\\boxed{N}`` with the same deliberately
partial accuracy.

A randomly initialised model cannot discover the answer format from RL alone: it almost never
writes ``<answer>N</answer>``, so every reward is 0 and every advantage is 0. A short supervised
stage teaches both agents their formats, *deliberately partially*:

- **solver** (the toy workflow's prompts, both the first try and the "was rejected, try again"
  one): target ``<answer>N</answer>`` where N is the right sum with probability
  ``solver_accuracy`` and otherwise a near miss (sum +- 1..3, never negative, never the previous
  rejected answer); a ``retry_share`` of them use the retry prompt. The model learns the format and a spread-out belief about each sum, so a
  sampled answer is right only part of the time: RL has to sharpen it.
- **checker**: a proposed answer that is right half of the time; target
  ``<verdict>approve</verdict>`` when it is right and ``<verdict>reject</verdict>`` otherwise,
  with the verdict flipped with probability ``1 - checker_accuracy``.

Examples come from ``random.Random(seed)``, so a recipe's warm start is reproducible. The prompts
are the workflow's own (``drmas_bench.workflows.toy``), rendered by each worker group with its
chat template, so the warm-started model sees exactly what the rollouts will show it.
"""

from __future__ import annotations

import random

from drmas_bench.workflows.toy import checker_prompt, solver_prompt
from drmas_trainer.worker import SFTExample

__all__ = ["SFT_EXAMPLES", "math_single_sft_examples", "toy_sft_examples"]


def _near_miss(rng: random.Random, right: int, avoid: int | None = None) -> int:
    while True:
        v = right + rng.choice((-3, -2, -1, 1, 2, 3))
        if v >= 0 and v != avoid:
            return v


def toy_sft_examples(agents: list[str], n: int, seed: int = 0, *, solver_accuracy: float = 0.5,
                     checker_accuracy: float = 0.8, max_operand: int = 9, retry_share: float = 0.2) -> list[SFTExample]:
    """``n`` examples per agent in ``agents`` (``solver`` and/or ``checker``), interleaved.

    Args:
        agents: which agents' examples to make; others are an error.
        n: examples per agent.
        seed: generation seed.
        solver_accuracy: share of solver targets carrying the right sum.
        checker_accuracy: share of checker targets carrying the right verdict.
        max_operand: operands are drawn from 0..max_operand (as ``make_toy_tasks``).
        retry_share: share of solver examples that use the "previous answer was rejected" prompt.
    """
    unknown = sorted(set(agents) - {"solver", "checker"})
    if unknown:
        raise ValueError(f"the toy warm start knows the agents solver and checker, not {', '.join(unknown)}")
    rng = random.Random(seed)
    out: list[SFTExample] = []
    for _ in range(n):
        for agent in agents:
            a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
            q, right = f"What is {a} + {b}?", a + b
            if agent == "solver":
                previous = _near_miss(rng, right) if rng.random() < retry_share else None
                ans = right if rng.random() < solver_accuracy else _near_miss(rng, right, avoid=previous)
                msgs = solver_prompt(q, None if previous is None else str(previous))
                out.append(SFTExample("solver", msgs, f"<answer>{ans}</answer>"))
            else:
                proposed = right if rng.random() < 0.5 else _near_miss(rng, right)
                ok = proposed == right
                if rng.random() >= checker_accuracy:
                    ok = not ok
                out.append(SFTExample("checker", checker_prompt(q, str(proposed)),
                                      f"<verdict>{'approve' if ok else 'reject'}</verdict>"))
    return out


def math_single_sft_examples(agents: list[str], n: int, seed: int = 0, *, solver_accuracy: float = 0.5,
                             max_operand: int = 9, **_: float) -> list[SFTExample]:
    """``n`` examples for the single solver of ``math_single``: its packaged prompt on "What is a + b?"
    and the target ``\\boxed{N}``, N right with probability ``solver_accuracy`` (else a near miss).
    The toy team's checker and retry options have no meaning here and are ignored."""
    import drmas_bench.workflows.protocol as P

    unknown = sorted(set(agents) - {"solver"})
    if unknown:
        raise ValueError(f"the math_single warm start knows the agent solver, not {', '.join(unknown)}")
    tpl = P.default_templates("math_single")
    rng = random.Random(seed)
    out: list[SFTExample] = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        right = a + b
        ans = right if rng.random() < solver_accuracy else _near_miss(rng, right)
        out.append(SFTExample("solver", P.chat(tpl, "solver", question=f"What is {a} + {b}?"), f"\\boxed{{{ans}}}"))
    return out


#: workflow -> the example maker of its warm start (agents, n, seed, **the sft options)
SFT_EXAMPLES = {"toy": toy_sft_examples, "math_single": math_single_sft_examples}
