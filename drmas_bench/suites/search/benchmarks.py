"""The search suite (REFERENCE.md §3): NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue, Bamboogle,
and the training set ``nq_hotpotqa_train`` (split ``train``: the reference's NQ + HotpotQA training
mix, PeterJinGo/nq_hotpotqa_train train.parquet; the search recipe's ``data.source``).

Gold answers come from FlashRAG's `golden_answers` list (what the reference's Search-R1 parquet
carries), else `answer` / `possible_answers`. The hub source is FlashRAG's dataset, the origin of
the reference's test mix (PeterJinGo/nq_hotpotqa_train test.parquet, filtered by `data_source`).
Questions are normalised as the reference's data is: stripped, "?" appended when missing.
"""

from __future__ import annotations

from typing import Any

from drmas_bench.suite import Benchmark, HubSource, Suite, qa_task, register, register_suite
from drmas_bench.suites.search.rules import AGENT_NAMES

# the search suite: search_route by default, 800 new tokens a call, graded by QA exact match
register_suite(Suite("search", workflow="search_route", max_new_tokens=800, family="qa", agent_names=AGENT_NAMES))

FLASHRAG = "RUC-NLPIR/FlashRAG_datasets"


def _qa(name: str, title: str, rows: int, rel: str, split: str, **kw: Any) -> Benchmark:
    return register(Benchmark(
        name, "search", title, rows, qa_task, files=(rel,) + kw.pop("more_files", ()),
        hub=HubSource(FLASHRAG, split=split, config=kw.pop("config", name)), **kw,
    ))


_qa("nq", "Natural Questions (test)", 3610, "qa/nq/test.jsonl", "test")
_qa("triviaqa", "TriviaQA (test)", 11313, "qa/triviaqa/test.jsonl", "test")
_qa(
    "popqa", "PopQA (test)", 14267, "qa/popqa/test.jsonl", "test",
    more_files=("qa/popqa/test_subset1000.jsonl",),
    partial_files={"qa/popqa/test_subset1000.jsonl": "PARTIAL: 1,000 of 14,267 rows (HippoRAG 2 subset)"},
)
_qa("hotpotqa", "HotpotQA (dev, distractor)", 7405, "qa/hotpotqa/dev.jsonl", "dev")
_qa("2wiki", "2WikiMultihopQA (dev)", 12576, "qa/2wikimultihopqa/dev.jsonl", "dev", config="2wikimultihopqa")
_qa("musique", "MuSiQue (dev, answerable)", 2417, "qa/musique/dev.jsonl", "dev")
_qa("bamboogle", "Bamboogle (test)", 125, "qa/bamboogle/test.jsonl", "test")

# The reference's search training data (Search-R1): NQ train + HotpotQA train, one row per question
# with `data_source`, `question`, `golden_answers` and reward_model.ground_truth.target. Hub only,
# unless a copy is saved under the data dir (the hub's train.parquet as is, or as JSON lines).
register(Benchmark(
    "nq_hotpotqa_train", "search", "NQ + HotpotQA training mix (Search-R1)", 169615, qa_task,
    files=("qa/nq_hotpotqa_train/train.parquet", "qa/nq_hotpotqa_train/train.jsonl"),
    hub=HubSource("PeterJinGo/nq_hotpotqa_train", split="train"), split="train",
))
