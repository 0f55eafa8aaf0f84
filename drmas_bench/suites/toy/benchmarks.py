"""The built-in `toy` suite: small arithmetic questions generated from a seed, no files needed.

Small enough for a tiny model to learn on a CPU (the trainer's `tiny` recipe), real enough to
exercise every part of the harness (workflow, grading, metrics, resume) in seconds.
"""

from __future__ import annotations

import random

from drmas_bench.suite import Benchmark, Suite, Task, register, register_suite

TOY_EVAL_SEED = 1234
TOY_EVAL_SIZE = 64


def make_toy_tasks(n: int = TOY_EVAL_SIZE, seed: int = TOY_EVAL_SEED, max_operand: int = 9, benchmark: str = "toy") -> list[Task]:
    """n questions "What is a + b?" with 0 <= a, b <= max_operand, identical for the same seed."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        tasks.append(Task(f"{benchmark}-{seed}-{i}", benchmark, f"What is {a} + {b}?", [str(a + b)], {"a": a, "b": b}))
    return tasks


# the toy suite: the toy workflow, 32 new tokens a call (an answer tag), graded by the toy's own check
register_suite(Suite("toy", workflow="toy", max_new_tokens=32, family="toy"))

register(Benchmark(
    "toy", "toy", "Toy addition (built-in)", TOY_EVAL_SIZE, to_task=lambda rec, i, b: Task.from_dict(rec),
    generate=make_toy_tasks, note=f"generated from seed {TOY_EVAL_SEED}",
))
