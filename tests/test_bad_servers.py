"""Bad servers, untrusted usage, incomparable tables and out-of-range settings, one table per concern in the style of tests/test_bad_inputs.py.

The LLM server is the real local HTTP server of tests/test_engines_openai.py (FastAPI + uvicorn on
127.0.0.1) in its bad modes; the retriever documents go through the client's own parser; the tables
are built from run directories written here (config.yaml + samples.jsonl, the format `eval` writes).
Each case names what must come back: the value, the one error line, what is kept on disk.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
import yaml

from drmas_bench.engines import EngineError, make_engine
from drmas_bench.engines.openai import response_cap, settle_usage, usage_slack
from drmas_bench.types import Completion, Request, Sampling, UserError

pytest.importorskip("fastapi")
from test_engines_openai import FakeServer, fake_tokens  # noqa: E402  (the repo's OpenAI-compatible test server)


def run(coro):
    return asyncio.run(coro)


def fast(**kw):
    return {"backoff_s": 0.01, "backoff_max_s": 0.05, "max_retries": 2, **kw}


def req(text: str, n: int = 8, limit: int | None = None, side: str = "left") -> Request:
    return Request("a", [{"role": "user", "content": text}], Sampling(max_new_tokens=n, seed=1),
                   max_prompt_tokens=limit, truncate=side)


@pytest.fixture(scope="module")
def server():
    s = FakeServer()
    yield s
    s.stop()


# ------------------------------------------------------------------------------ replies and usage

# (case, server mode, what the one reply must be): usage source, tokens, notes, text length
REPLY_CASES = [
    ("usage-from-server", "ok", {"usage": "server", "prompt_tokens": 4, "completion_tokens": 3, "notes": 0}),
    ("usage-missing-unknown", "nousage", {"usage": "unknown", "prompt_tokens": 0, "completion_tokens": 0, "notes": 0}),
    ("html-twice-then-ok", "html", {"usage": "server", "completion_tokens": 3, "hits": 3}),
    ("no-choices-twice-then-ok", "nochoices", {"usage": "server", "completion_tokens": 3, "hits": 3}),
    ("reply-5MB-cut", "huge", {"usage": "server", "completion_tokens": 1_250_000, "notes": 2,
                               "text_len": response_cap(8, None), "finish": "length"}),
]


@pytest.mark.parametrize("mode,expect", [c[1:] for c in REPLY_CASES], ids=[c[0] for c in REPLY_CASES])
def test_reply_is_checked(server, mode, expect):
    eng = make_engine("openai", "api-model", base_url=server.url(mode), **fast())
    prompt = f"q {mode}"
    [c] = run(eng.generate([req(prompt)]))
    for key in ("usage", "prompt_tokens", "completion_tokens", "finish"):
        if key in expect:
            assert getattr(c, key) == expect[key], (key, getattr(c, key))
    if "notes" in expect:
        assert len(c.notes) == expect["notes"], c.notes
    if "text_len" in expect:
        assert len(c.text) == expect["text_len"] < 5_000_000
        assert any("cut to" in n for n in c.notes) and any("1250000 completion tokens" in n for n in c.notes)
    if "hits" in expect:
        assert server.hits[(mode, prompt)] == expect["hits"]  # retried under the shared policy, then used


# (case, server mode, text the one EngineError line must hold, HTTP attempts made)
FAIL_CASES = [
    ("negative-usage", "negusage", "returned impossible usage: usage.completion_tokens is negative: -3", 1),
    ("always-html", "alwayshtml", "failed after 3 attempts: a 200 answer that is not JSON (text/html", 3),
    ("always-empty-choices", "alwaysnochoices", "failed after 3 attempts: a 200 answer without choices", 3),
]


@pytest.mark.parametrize("mode,expected,attempts", [c[1:] for c in FAIL_CASES], ids=[c[0] for c in FAIL_CASES])
def test_bad_reply_is_one_line(server, mode, expected, attempts):
    eng = make_engine("openai", "api-model", base_url=server.url(mode), **fast())
    with pytest.raises(EngineError) as err:
        run(eng.generate([req(f"q {mode}")]))
    assert "\n" not in str(err.value) and expected in str(err.value), str(err.value)
    assert server.url(mode) in str(err.value)
    assert eng.attempts == attempts


def test_missing_usage_counted_with_the_local_tokenizer(server, tmp_path):
    """Token mode (a tokenizer here) against a server that sends no usage: counted, not unknown."""
    from test_engines_fixtures import thinking_model_path, tiny_model_path

    tok = thinking_model_path(tiny_model_path(tmp_path), tmp_path / "thinking")
    eng = make_engine("openai", "served", base_url=server.url("toknousage"), tokenizer=str(tok), **fast())
    [c] = run(eng.generate([req("words " * 10)]))
    assert c.usage == "counted" and c.prompt_tokens == len(c.prompt_ids) > 10
    assert c.completion_tokens == eng._count_tokens(c.text) > 0


SETTLE_CASES = [  # (case, completion tokens reported, max_new_tokens, flagged?)
    ("at-limit", 800, 800, False),
    ("a-few-over", 800 + usage_slack(800), 800, False),
    ("far-over", 1_250_000, 800, True),
]


@pytest.mark.parametrize("reported,limit,flagged", [c[1:] for c in SETTLE_CASES], ids=[c[0] for c in SETTLE_CASES])
def test_completion_far_above_the_limit_is_flagged(reported, limit, flagged):
    c = settle_usage(Completion("ok", completion_tokens=reported, prompt_tokens=5), req("x", n=limit), cap=10**6)
    assert bool(c.notes) is flagged and c.completion_tokens == reported  # kept (it is what was billed), flagged


# ------------------------------------------------------------------------------ prompt limits without a tokenizer

# (case, server mode, limit, /tokenize used?, unenforced?, prompt ids sent)
LIMIT_CASES = [
    ("vllm-tokenize-cuts-exactly", "tok", 5, True, False, 5),
    ("vllm-tokenize-fits", "tok", 500, True, False, None),
    ("paid-api-no-tokenize", "ok", 5, False, True, None),
    ("sglang-text-only-tokenize", "sgl", 5, False, True, None),
    ("llama-cpp-tokenize-empty-list", "emptytok", 5, False, True, None),  # a 200, not a tokenizer's answer:
    ("tokenize-200-without-tokens", "counttok", 5, False, True, None),  # "no /tokenize", asked once, not retried
    ("no-limit-no-question", "tok2", None, False, False, None),  # --max-prompt-tokens 0: no limit, nothing asked
]


@pytest.mark.parametrize("mode,limit,tokenized,unenforced,sent", [c[1:] for c in LIMIT_CASES],
                         ids=[c[0] for c in LIMIT_CASES])
def test_prompt_limit_without_a_local_tokenizer(server, caplog, mode, limit, tokenized, unenforced, sent):
    eng = make_engine("openai", "hub/model-not-here", base_url=server.url(mode), **fast())
    text = " ".join(f"w{i}" for i in range(40))
    n_tok, n_body = len(server.tokenize_bodies), len(server.bodies)
    with caplog.at_level(logging.WARNING, logger="drmas_bench"):
        outs = run(eng.generate([req(text, limit=limit), req(text + " again", limit=limit)]))
    asked = server.tokenize_bodies[n_tok:]
    bodies = server.bodies[n_body:]
    assert all(c.prompt_limit_unenforced is unenforced for c in outs)
    warned = [r for r in caplog.records if "not enforced" in r.getMessage()]
    assert len(warned) == (1 if unenforced else 0)  # once per engine, not once per call
    if limit is None:
        assert not asked and all("messages" in b for b in bodies)
        return
    assert asked and asked[0][1]["messages"][0]["content"] == text and asked[0][1]["add_generation_prompt"] is True
    assert asked[0][1]["chat_template_kwargs"] == {"enable_thinking": False}
    if not tokenized:
        assert len(asked) == 1  # asked once; then the chat goes out unchanged
        assert [b["messages"][0]["content"] for b in bodies] == [text, text + " again"]
        return
    full = fake_tokens([{"role": "user", "content": text}])
    first = next(b for b in bodies if outs[0].prompt_ids == b["prompt"])
    if sent is None:
        assert first["prompt"] == full and not outs[0].prompt_truncated
    else:
        assert first["prompt"] == full[-sent:] and outs[0].prompt_truncated and outs[0].prompt_tokens == sent


# ------------------------------------------------------------------------------ retriever documents

DOC_CASES = [  # (case, hit as a server sends it, error text or None)
    ("good", {"document": {"id": "7", "contents": '"T"\nbody'}, "score": 1.0}, None),
    ("title-text", {"document": {"id": "7", "title": "T", "text": "body"}}, None),
    ("no-id", {"document": {"contents": '"T"\nbody'}}, "a document without an id"),
    ("empty-id", {"document": {"id": "", "contents": '"T"\nbody'}}, "a document without an id"),
    ("no-contents", {"document": {"id": "7"}}, "document '7' has no text"),
    ("contents-not-text", {"document": {"id": "7", "contents": None}}, "document '7' has no text"),
]


@pytest.mark.parametrize("item,error", [c[1:] for c in DOC_CASES], ids=[c[0] for c in DOC_CASES])
def test_retriever_document_needs_id_and_text(item, error):
    from drmas_retrieval.base import RetrievalError
    from drmas_retrieval.client import hit_from_reference

    if error is None:
        hit = hit_from_reference(item, "http://127.0.0.1:1/retrieve")
        assert hit.id == "7" and hit.text == "body"
        return
    with pytest.raises(RetrievalError, match=error):
        hit_from_reference(item, "http://127.0.0.1:1/retrieve")


# ------------------------------------------------------------------------------ prices


def test_price_sheet_reads_yaml11_exponents(tmp_path):
    from drmas_bench.pricing import load_prices

    p = tmp_path / "prices.yaml"
    p.write_text("models:\n  m: {input_per_1m: 3e-1, output_per_1m: 1.5e+0}\n")
    assert load_prices(p).cost("m", 1_000_000, 1_000_000) == pytest.approx(1.8)
    p.write_text("models:\n  m: {input_per_1m: cheap}\n")
    with pytest.raises(UserError, match="input_per_1m"):
        load_prices(p)


def test_checkpoint_groups_priced_by_their_base_model(tmp_path):
    from drmas_bench.agents.team import team_from_dict

    d = {"worker_groups": {"solver": {"model": "models/solver"}, "checker": {"model": "models/checker", "price": "own"}},
         "agents": {"solver": "solver", "checker": "checker"},
         "trained": {"base_models": {"solver": "Qwen/Qwen3-4B", "checker": "Qwen/Qwen3-1.7B"}}}
    team = team_from_dict(d, ("solver", "checker"), "toy")
    assert team.worker_groups["solver"].price_key == "Qwen3-4B"  # not "solver", the folder name
    assert team.worker_groups["checker"].price_key == "own"  # an explicit price wins
    # a run dir of a checkpoint evaluated before the price was recorded: the reports find the base model too
    from drmas_bench import report

    path = write_run(tmp_path / "ckpt-run")
    cfg = yaml.safe_load((path / "config.yaml").read_text())
    cfg["identity"]["team"]["worker_groups"] = {"g": {"model": str(tmp_path / "ckpt" / "models" / "g")}}
    cfg["identity"]["team"]["trained"] = {"step": 3, "estimator": "drmas", "base_models": {"g": "Qwen/Qwen3-4B"}}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert report.load_run(path).price_key("g") == "Qwen3-4B"


# ------------------------------------------------------------------------------ tables over run dirs


def write_run(path: Path, *, n: int = 2, ids=("t0", "t1", "t2"), grader=("math_default", "1"), prompts="a" * 64,
              limit: int | None = 4096, temperature: float = 0.6, usage: str = "server") -> Path:
    """A run directory as `eval` writes one (config.yaml + samples.jsonl), with two agents."""
    path.mkdir(parents=True)
    team = {"workflow": "math_refine", "agents": {"solver": "g", "verifier": "g"},
            "worker_groups": {"g": {"model": "tiny-random"}}, "sampling": {}, "workflow_options": {}}
    sampling = {a: {"temperature": temperature, "top_p": 0.95, "max_new_tokens": 64} for a in ("solver", "verifier")}
    ident = {"team": team, "sampling": sampling, "seed": 0,
             "protocol": {"prompts_sha256": prompts, "max_prompt_tokens": limit, "truncate": "left"},
             "grader": {"name": grader[0], "version": grader[1]}}
    cfg = {"identity": ident, "suite": "math", "workflow": "math_refine", "benchmarks": ["aime24"], "n": n,
           "provenance": {"grader": {"family": "math", "name": grader[0], "version": grader[1]}}}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    lines = []
    for i, tid in enumerate(ids):
        for k in range(n):
            turns = [{"agent": a, "wg": "g", "step": j,
                      "request": {"agent": a, "messages": [], "sampling": sampling[a]},
                      "completion": {"text": "x", "prompt_tokens": 100, "completion_tokens": 10, "latency_s": 0.1,
                                     "usage": usage if a == "solver" else "server", "notes": []}}
                     for j, a in enumerate(("solver", "verifier"))]
            lines.append(json.dumps({"task": {"benchmark": "aime24", "id": tid, "question": f"q{tid}"}, "sample_idx": k,
                                     "turns": turns, "correct": (i + k) % 2 == 0, "reward": float((i + k) % 2 == 0),
                                     "wall_s": 1.0}))
    (path / "samples.jsonl").write_text("\n".join(lines) + "\n")
    return path


# (case, what run B changes, the phrase the leaderboard and cost notes show, the one compare shows)
TABLE_CASES = [
    ("grader", {"grader": ("math_verify", "1")}, "grader math_verify@1", "grader differs (A math_default@1, B math_verify@1)"),
    ("grader-version", {"grader": ("math_default", "2")}, "grader math_default@2", "grader differs (A math_default@1, B math_default@2)"),
    ("question-set", {"ids": ("t0", "t1", "t9")}, "question set", "1 questions only in A, 1 only in B"),
    ("prompts", {"prompts": "b" * 64}, "prompts bbbbbbbbbbbb", "prompts differs (A aaaaaaaaaaaa, B bbbbbbbbbbbb)"),
    ("n", {"n": 3}, "n=3", "n differs (A 2, B 3)"),
    ("protocol", {"limit": 1024}, "protocol max_prompt_tokens=1024", "protocol differs (A max_prompt_tokens=4096"),
    ("sampling", {"temperature": 1.0}, "T=1", "sampling differs"),
]


@pytest.mark.parametrize("change,phrase,cmp_phrase", [c[1:] for c in TABLE_CASES], ids=[c[0] for c in TABLE_CASES])
def test_tables_flag_what_differs(tmp_path, change, phrase, cmp_phrase):
    from drmas_bench import report

    a = report.load_run(write_run(tmp_path / "A"))
    b = report.load_run(write_run(tmp_path / "B", **change))
    c = report.load_run(write_run(tmp_path / "C"))  # a third, like A: the table's usual setting is A's
    tables = report.build_leaderboard([a, b, c], report.parse_metrics("avg@n"))
    notes = {r.label: "; ".join(r.notes) for r in tables[0].rows}
    assert (phrase if phrase != "T=1" else "temperature 1 (table: 0.6)") in notes["B"], notes["B"]
    assert not notes["A"] and not notes["C"]
    cmp_notes = "; ".join(report.compare_runs(a, b, n_boot=50).notes)
    assert cmp_phrase in cmp_notes, cmp_notes
    cost = report.cost_notes(report.cost_study([a, b], _zero_prices()))
    assert any(phrase in n for n in cost), cost


def test_comparable_runs_carry_no_flags(tmp_path):
    from drmas_bench import report

    a, b = (report.load_run(write_run(tmp_path / x)) for x in "AB")
    tables = report.build_leaderboard([a, b], report.parse_metrics("avg@n"))
    assert all(not r.notes for r in tables[0].rows)
    assert not report.compare_runs(a, b, n_boot=50).notes
    assert not report.cost_notes(report.cost_study([a, b], _zero_prices()))


def _zero_prices(price: float = 1.0):
    from drmas_bench.pricing import PriceSheet

    return PriceSheet.from_dict({"models": {"tiny-random": {"input_per_1m": price, "output_per_1m": price}}})


def test_unknown_usage_is_never_zero_dollars(tmp_path):
    """A run whose solver calls came back without usage: the cost table says unknown (never $0, never
    -100% against a known team), the summary block has no dollar figure."""
    from drmas_bench import metrics, report
    from drmas_bench.report.markdown import cost_markdown, format_summary_markdown

    known = report.load_run(write_run(tmp_path / "known"))
    blind = report.load_run(write_run(tmp_path / "blind", usage="unknown"))
    costs = report.cost_study([known, blind], _zero_prices())
    assert costs[0].usd_per_1k > 0 and costs[1].usd_per_1k is None
    assert costs[1].agents["solver"].unknown_calls == 6 and costs[1].agents["verifier"].known
    md = cost_markdown(costs)
    team_row = next(line for line in md.splitlines() if line.startswith("| blind"))
    assert "unknown" in team_row and "-100" not in team_row
    assert "6 calls came back without token usage" in md
    csv_text = report.cost_csv(costs)
    assert "unknown" in csv_text.splitlines()[-1]
    s = metrics.summarize(blind.records, prices=_zero_prices().with_aliases({"g": "tiny-random"}))  # as eval prices turns
    assert s["micro"]["usd_total"] is None and s["micro"]["usage"]["unknown"] == 6
    assert s["micro"]["agents"]["solver"]["usd_per_question"] is None
    assert s["micro"]["agents"]["verifier"]["usd_per_question"] > 0
    text = format_summary_markdown(s)
    assert "unknown (6 calls without usage)" in text and "6 of 12 calls came back without token usage" in text


# ------------------------------------------------------------------------------ ranges (one schema)

TRAIN = ["train", "--recipe", "tiny", "--out", "run", "--local", "--set"]

# (case, --set override, text the one error line must hold)
RANGE_CASES = [
    ("temperature-negative", "rollout.temperature=-1", "rollout.temperature: must be greater than or equal to 0"),
    ("top-p-zero", "rollout.top_p=0", "rollout.top_p: must be greater than 0"),
    ("top-p-five", "rollout.top_p=5", "rollout.top_p: must be less than or equal to 1"),
    ("clip-low-negative", "algo.clip_low=-0.5", "algo.clip_low: must be greater than or equal to 0"),
    ("grad-clip-nan", "agent_defaults.grad_clip=.nan", "agent_defaults.grad_clip: must be a finite number"),
    ("mini-batches-1000", "algo.mini_batches=1000", "algo.mini_batches 1000 is more than the"),
    ("sft-batch-zero", "sft.batch_size=0", "sft.batch_size: must be greater than or equal to 1"),
    ("concurrency-zero", "rollout.concurrency=0", "rollout.concurrency: must be greater than or equal to 1"),
    ("save-every-negative", "save_every=-1", "save_every: must be greater than or equal to 0"),
    ("keep-last-negative", "keep_last=-1", "keep_last: must be greater than or equal to 0"),
    ("c-inv-nan", "algo.c_inv=.nan", "algo.c_inv: must be a finite number"),
    ("betas-out-of-range", "agent_defaults.betas=[2,3]", "agent_defaults.betas.0: must be less than 1"),
]


@pytest.mark.parametrize("override,expected", [c[1:] for c in RANGE_CASES], ids=[c[0] for c in RANGE_CASES])
def test_trainer_refuses_out_of_range_before_anything_runs(tmp_path, monkeypatch, capsys, override, expected):
    from drmas_bench.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(TRAIN + [override]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("drmas-bench: error:")]
    assert len(err) == 1 and expected in err[0], err
    assert "--resume" not in err[0]
    assert not (tmp_path / "run").exists()  # refused before the run directory (and the warm start)


def test_eval_and_trainer_share_one_range_table():
    from drmas_bench import plan
    from drmas_bench.schema import RANGES, TrainSamplingSchema
    from drmas_trainer.config.train import RolloutConfig

    for name in plan.RANGED_FIELDS:
        assert name in RANGES
    for schema in (TrainSamplingSchema, RolloutConfig):
        meta = {type(m).__name__: m for m in schema.model_fields["top_p"].metadata}
        assert meta["Gt"].gt == RANGES["top_p"].gt and meta["Le"].le == RANGES["top_p"].le


def test_resume_hint_only_with_a_checkpoint(tmp_path):
    from drmas_bench.commands.train import _resume_hint
    from drmas_trainer.config.train import load_config

    from drmas_trainer.checkpoint import MARKER

    cfg = load_config("tiny")
    assert _resume_hint(tmp_path / "run", cfg) is None  # nothing to resume: no hint
    (tmp_path / "run" / "ckpt" / "step_3").mkdir(parents=True)
    assert _resume_hint(tmp_path / "run", cfg) is None  # a step without its marker is not a checkpoint
    (tmp_path / "run" / "ckpt" / "step_3" / MARKER).write_text("")
    assert "--resume" in _resume_hint(tmp_path / "run", cfg) and "step 3" in _resume_hint(tmp_path / "run", cfg)


# ------------------------------------------------------------------------------ end to end: summary.json


@pytest.mark.parametrize("mode,unenforced", [("ok", 1), ("tok", 0)], ids=["paid-api-counted", "vllm-tokenize-enforced"])
def test_eval_with_an_api_model_under_the_default_limit(server, data_dir, tmp_path, monkeypatch, mode, unenforced):
    """An API team with no local tokenizer runs under the suite's default prompt limit;
    summary.json says how many calls went out with the limit not enforced (0 with vLLM's /tokenize)."""
    from drmas_bench.cli import main

    monkeypatch.chdir(tmp_path)
    rc = main(["eval", "--engine", "openai", "--model", "hub/model-not-here", "--base-url", server.url(mode),
               "--benchmarks", "aime24", "--data-dir", str(data_dir), "--limit", "1", "--n", "1", "--no-progress",
               "--engine-args", "backoff_s=0.01,max_retries=1", "--out", "run"])
    assert rc == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    p = s["protocol"]
    assert p["max_prompt_tokens"] and p["calls"] >= 1
    assert p["prompt_limit_unenforced_calls"] == unenforced * p["calls"]
    assert s["micro"]["usage"]["unknown"] == 0  # the fake server reports usage


def test_a_server_that_turns_bad_mid_run_loses_no_finished_work(server, data_dir, tmp_path, monkeypatch, capsys):
    """The first episode(s) (4 calls) finish; then the server reports negative usage: one error
    line naming it and the kept samples; the finished episode stays in samples.jsonl."""
    from drmas_bench.cli import main

    monkeypatch.chdir(tmp_path)
    rc = main(["eval", "--engine", "openai", "--model", "hub/model-not-here", "--base-url", server.url("late"),
               "--benchmarks", "aime24", "--data-dir", str(data_dir), "--limit", "3", "--n", "1", "--no-progress",
               "--concurrency", "1", "--flush-every", "1", "--engine-args", "backoff_s=0.01,max_retries=1", "--out", "run"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("drmas-bench: error:")]
    assert rc == 2 and len(errors) == 1, errors
    assert "impossible usage: usage.completion_tokens is negative" in errors[0] and "samples.jsonl" in errors[0]
    kept = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines() if x.strip()]
    assert 1 <= len(kept) < 3 and all(k["task"]["benchmark"] == "aime24" for k in kept)
