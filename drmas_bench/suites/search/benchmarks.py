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

from drmas_bench.suite import Benchmark, HubSource, Sampled, Suite, Task, qa_task, register, register_suite
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


# The reference's validation set (its examples/data_preprocess/drmas_search.py: test_sampled.parquet):
# the first 30 rows of each data_source of its test mix, in the mix's order, 210 rows in its row
# layout. `drmas-bench data prepare --sampled` writes it from the local sources (extra_info.index is
# then the row's index in its source; the reference numbers rows across its whole test mix).
SYSTEM = "You are a helpful and harmless assistant."  # the reference's system message (REFERENCE.md §2b)
SAMPLED_SOURCES = (("nq", "nq"), ("triviaqa", "triviaqa"), ("popqa", "popqa"), ("hotpotqa", "hotpotqa"),
                   ("2wiki", "2wikimultihopqa"), ("musique", "musique"), ("bamboogle", "bamboogle"))


def search_row(t: Task, data_source: str, index: int) -> dict[str, Any]:
    """One task as the reference's search preparation writes a test row."""
    gold = {"target": list(t.answers)}
    kwargs = {"ground_truth": gold, "question": t.question, "data_source": data_source}
    return {"data_source": data_source,
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t.question}],
            "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": gold},
            "extra_info": {"index": index, "need_tools_kwargs": True, "question": t.question, "split": "test",
                           "tools_kwargs": {"search": {"create_kwargs": kwargs}}},
            "metadata": None, "env_kwargs": kwargs}


def _verl_qa_task(rec: dict[str, Any], i: int, bench: str) -> Task:
    """A row of the reference's search test file: the question is its user message (the reference
    keeps no question column), the id ``<data_source>_<extra_info.index>``."""
    if rec.get("question") is None:
        user = next((m["content"] for m in rec.get("prompt") or [] if m.get("role") == "user"), None)
        rec = {**rec, "question": (rec.get("extra_info") or {}).get("question") if user is None else user}
    if rec.get("id") is None:
        index = (rec.get("extra_info") or {}).get("index")
        rec = {**rec, "id": i if index is None else index}
    return qa_task(rec, i, bench)


register(Benchmark(
    "search_sampled", "search", "The reference's search validation set (test_sampled)", 210, _verl_qa_task,
    files=("qa/drmas_search/test_sampled.parquet",), split="val",
    sampled=Sampled(tuple((name, 30, source) for name, source in SAMPLED_SOURCES), search_row),
    note="built by `drmas-bench data prepare --sampled` (or the reference's own file)",
))
