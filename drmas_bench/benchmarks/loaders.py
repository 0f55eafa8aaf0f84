"""The record loaders a benchmark may use as its ``to_task`` (``Benchmark(..., to_task=qa_task)``):
`qa_task` for question / golden-answers records (NQ, HotpotQA, Search-R1's files, or a suite's own
QA file), `math_task` for problem / answer records (MATH500, AIME, ...). A leaf below the suites,
so a suite of one's own reads the same records the same way (``drmas_bench.suite`` exports both).
"""

from __future__ import annotations

import ast
import json
from typing import Any

from drmas_bench.benchmarks.base import answer_text, first_field, record_id
from drmas_bench.types import Task


def as_list(v: Any) -> list:
    """A record's gold field as a list: a list, a JSON (or Python literal) list in a string,
    Search-R1's ``{"target": ...}``, or one value."""
    if isinstance(v, str) and v.startswith("["):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return ast.literal_eval(v)  # literal only; never eval
    if isinstance(v, dict) and "target" in v:  # Search-R1: reward_model.ground_truth.target
        return as_list(v["target"])
    return list(v) if isinstance(v, (list, tuple)) else [v]


def normalize_question(q: Any) -> str:
    """As the reference's test data (REFERENCE.md §2b): stripped, ending with "?"."""
    q = str(q).strip()
    return q if not q or q.endswith("?") else q + "?"


def qa_task(rec: dict[str, Any], i: int, bench: str) -> Task:
    """A QA record as a `Task`: ``question`` (stripped, ending with "?": `normalize_question`), the
    golds from ``golden_answers`` / ``answer`` / ``possible_answers`` (a list, a JSON or Python list
    literal, or one value) or Search-R1's ``reward_model.ground_truth.target``, the id from ``id`` /
    ``_id`` (prefixed with ``data_source`` in a mixed file, whose ids repeat across sources), and
    ``type``, ``dataset``, ``split``, ``data_source`` kept as meta. A record with no question or no
    gold is a ValueError (the loader names its file and line)."""
    question = normalize_question(first_field(rec, "question"))
    if rec.get("data_source") is not None and rec.get("id") is not None:  # a mixed file (Search-R1): ids
        rec = {**rec, "id": f"{rec['data_source']}_{rec['id']}"}  # repeat across sources, so prefix them
    if not question:
        raise ValueError("empty question")
    if "reward_model" in rec:
        golds = as_list(rec["reward_model"]["ground_truth"])
    else:
        golds = as_list(first_field(rec, "golden_answers", "answer", "possible_answers"))
    answers = [a for a in (answer_text(g) for g in golds) if a]
    if not answers:
        raise ValueError("no gold answer")
    meta: dict[str, Any] = {k: rec[k] for k in ("type", "dataset", "split", "data_source") if k in rec and rec[k] is not None}
    return Task(record_id(rec, i, "id", "_id"), bench, question, answers, meta)


def math_task(rec: dict[str, Any], i: int, bench: str) -> Task:
    """A math record as a `Task`: ``problem`` / ``question``, one gold from ``answer`` /
    ``final_answer`` (`answer_text`: 27.0 reads as 27), the id from ``id`` / ``unique_id`` / ``idx`` /
    ``problem_idx``, and ``subject``, ``level``, ``type``, ``url`` kept as meta. An empty problem or
    answer is a ValueError (the loader names its file and line)."""
    question = first_field(rec, "problem", "question")
    gold = answer_text(first_field(rec, "answer", "final_answer"))
    if not str(question).strip():
        raise ValueError("empty problem")
    if not gold:
        raise ValueError("empty answer")
    meta: dict[str, Any] = {k: rec[k] for k in ("subject", "level", "type", "url") if k in rec}
    return Task(record_id(rec, i, "id", "unique_id", "idx", "problem_idx"), bench, str(question), [gold], meta)
