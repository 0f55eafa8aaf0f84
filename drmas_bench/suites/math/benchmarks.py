"""The math suite (REFERENCE.md §3): AIME24, AIME25, AMC23, MATH500, Minerva, OlympiadBench, and
the training set DAPO-Math-17k (split ``train``: the math recipes' ``data.source``).

Hub ids are the ones the reference loads; local files are the layout of shared/data (MANIFEST.md).
Each record becomes Task(question=problem, answers=[gold answer as text]).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from drmas_bench.suite import (
    Benchmark,
    HubSource,
    Sampled,
    Suite,
    Task,
    answer_text,
    first_field,
    math_task,
    record_id,
    register,
    register_suite,
)
from drmas_bench.suites.math.rules import AGENT_NAMES

# the math suite: math_refine by default, long reasoning (4096 new tokens), graded as math
register_suite(Suite("math", workflow="math_refine", max_new_tokens=4096, family="math", agent_names=AGENT_NAMES))


def _olympiad_task(rec: dict[str, Any], i: int, bench: str) -> Task:
    # OlympiadBench keeps `final_answer` as a list (several parts for multi-answer problems) and
    # sometimes a unit; the gold is the parts joined by ", " as one answer string.
    fa = first_field(rec, "final_answer", "answer")
    if isinstance(fa, str) and fa.startswith("["):
        fa = ast.literal_eval(fa)  # literal only; never eval
    parts = [answer_text(x) for x in (fa if isinstance(fa, list) else [fa])]
    if not parts or not all(parts):
        raise ValueError("empty final_answer")
    question = first_field(rec, "question", "problem")
    meta: dict[str, Any] = {k: rec[k] for k in ("subfield", "answer_type", "unit", "is_multiple_answer") if k in rec}
    return Task(record_id(rec, i, "id"), bench, str(question), [", ".join(parts)], meta)


register(Benchmark(
    "aime24", "math", "AIME 2024", 30, math_task,
    files=("math/aime24/test.jsonl",), hub=HubSource("HuggingFaceH4/aime_2024", split="train"),
))
register(Benchmark(
    "aime25", "math", "AIME 2025", 30, math_task,
    files=("math/aime25/test.jsonl",), hub=HubSource("MathArena/aime_2025", split="train"),
    note="local file converted from MathArena's answers.csv + problem .tex (MANIFEST.md)",
))
register(Benchmark(
    "amc23", "math", "AMC 2023", 40, math_task,
    files=("math/amc23/test.jsonl",), hub=HubSource("knoveleng/AMC-23", split="train"),
))
register(Benchmark(
    "math500", "math", "MATH500", 500, math_task,
    files=("math/math500/test.jsonl",), hub=HubSource("HuggingFaceH4/MATH-500", split="test"),
))
register(Benchmark(
    "minerva", "math", "Minerva Math", 272, math_task,
    # the upstream file has no answer field; test_with_answer.jsonl adds the last \boxed{} of the solution
    files=("math/minerva_math/test_with_answer.jsonl",),
    hub=HubSource("zwhe99/simplerl-minerva-math", split="test"),
))
register(Benchmark(
    "olympiadbench", "math", "OlympiadBench", 675, _olympiad_task,
    files=("math/olympiadbench/test.jsonl",), hub=HubSource("realtreetune/olympiadbench", split="test"),
))


# DAPO-Math-17k rows are verl RL rows: {"prompt": [{"role": "user", "content": ...}], "reward_model":
# {"ground_truth": ...}, "extra_info": {"index": ...}}. The hub original wraps each problem in DAPO's
# "Answer: $Answer" instruction; our workflows bring their own (\boxed{}), so only the problem is kept.
_DAPO_HEAD = re.compile(r"^Solve the following math problem step by step\..*?\n\n", re.S)
_DAPO_TAIL = re.compile(r"\n\nRemember to put your answer on its own line after \"Answer:\"\.?\s*$")


def dapo_problem(text: str) -> str:
    """The bare problem of a DAPO prompt (DAPO's answer-format instruction removed, if present)."""
    return _DAPO_TAIL.sub("", _DAPO_HEAD.sub("", text.strip(), count=1)).strip()


def _dapo_task(rec: dict[str, Any], i: int, bench: str) -> Task:
    prompt = rec.get("prompt")
    if isinstance(prompt, list):  # chat messages: the (first) user turn holds the problem
        prompt = next(m["content"] for m in prompt if m.get("role", "user") == "user")
    question = dapo_problem(str(prompt if prompt is not None else first_field(rec, "problem", "question")))
    rm = rec.get("reward_model") or {}
    gold = answer_text(rm["ground_truth"] if rm.get("ground_truth") is not None else first_field(rec, "answer", "solution"))
    if not question:
        raise ValueError("empty problem")
    if not gold:
        raise ValueError("empty answer")
    extra = rec.get("extra_info") or {}
    rid = extra.get("index") if extra.get("index") not in (None, "") else record_id(rec, i, "id", "index")
    return Task(str(rid), bench, question, [gold], {"data_source": rec["data_source"]} if "data_source" in rec else {})


register(Benchmark(
    "dapo_math_17k", "math", "DAPO-Math-17k (training set)", 17917, _dapo_task,
    files=("math/dapo_math_17k/train.jsonl", "math/dapo_math_17k/train.parquet"),
    # the hub original repeats every prompt ~100 times (1.79M rows); repeats are dropped on load
    hub=HubSource("BytedTsinghua-SIA/DAPO-Math-17k", split="train", dedupe=True),
    split="train",
    note="local file: the deduplicated 17,917-prompt copy (MANIFEST.md); the reference itself trains on a "
         "filtered DAPO variant that is not public",
))


# The reference's validation set (its examples/data_preprocess/drmas_math.py: test_sampled.parquet):
# the first 50 rows of MATH500 (data_source math500_first50), then AIME24 and AIME25 whole, 110 rows
# in verl's row layout. `drmas-bench data prepare --sampled` writes it from the local sources; the
# reference's own file at the same path is read the same way.


def math_row(t: Task, data_source: str, index: int) -> dict[str, Any]:
    """One task as the reference's math preparation writes a test row."""
    gold = t.answers[0]
    return {"data_source": data_source, "ability": "math", "reward_model": {"style": "rule", "ground_truth": gold},
            "prompt": [{"role": "user", "content": t.question}],
            "extra_info": {"split": "test", "index": index, "answer": gold, "question": t.question},
            "env_kwargs": {"ground_truth": gold, "question": t.question, "data_source": data_source}}


def _verl_math_task(rec: dict[str, Any], i: int, bench: str) -> Task:
    """A verl test row (data_source, prompt, reward_model.ground_truth, extra_info.index) as a Task
    whose id is ``<data_source>-<index>`` and whose meta keeps the data_source."""
    source = str(rec["data_source"])
    question = next(m["content"] for m in rec["prompt"] if m.get("role", "user") == "user")
    gold = answer_text(str(rec["reward_model"]["ground_truth"]))
    if not str(question).strip() or not gold:
        raise ValueError("empty problem or answer")
    index = (rec.get("extra_info") or {}).get("index")
    return Task(f"{source}-{i if index is None else index}", bench, str(question), [gold], {"data_source": source})


register(Benchmark(
    "math_sampled", "math", "The reference's math validation set (test_sampled)", 110, _verl_math_task,
    files=("math/drmas_math/test_sampled.parquet",), split="val",
    sampled=Sampled((("math500", 50, "math500_first50"), ("aime24", None, "aime24"), ("aime25", None, "aime25")),
                    math_row),
    note="built by `drmas-bench data prepare --sampled` (or the reference's own file)",
))
