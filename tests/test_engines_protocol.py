"""The prompt protocol every engine shares (REFERENCE.md §2b): truncation of the templated prompt,
chat-template variables, request checks, local tokenizer lookup (``engines/base.py``)."""

from __future__ import annotations

import random

import pytest

from drmas_bench.engines import EngineError
from drmas_bench.engines.base import local_tokenizer_dir
from drmas_bench.engines.prompt import (
    TRUNCATE_SIDES,
    check_request,
    default_template_kwargs,
    encode_request,
    extra_template_kwargs,
    template_kwargs_for,
    truncate_ids,
)
from drmas_bench.types import Request, Sampling
from test_engines_fixtures import EMPTY_THINK, thinking_model_path, tiny_model_path


def plain_cut(ids: list[int], limit: int, side: str) -> list[int]:
    """A plain reference: drop one token at a time until the prompt fits. "left" drops the oldest,
    "right" the newest, "middle" the first token after the kept head of limit // 2 tokens."""
    x = list(ids)
    while len(x) > limit:
        del x[{"left": 0, "right": -1, "middle": limit // 2}[side]]
    return x


def test_truncate_ids_matches_plain_reference_on_random_inputs():
    rng = random.Random(0)
    for _ in range(2000):
        n, limit = rng.randint(0, 60), rng.randint(1, 70)
        ids = [rng.randint(0, 50) for _ in range(n)]
        for side in TRUNCATE_SIDES:
            got = truncate_ids(ids, limit, side)
            assert got == plain_cut(ids, limit, side), (ids, limit, side)
            assert len(got) == min(n, limit)
    assert truncate_ids([1, 2, 3], None, "middle") == [1, 2, 3]


def test_truncate_ids_sides_by_hand():
    ids = list(range(10))
    assert truncate_ids(ids, 4, "left") == [6, 7, 8, 9]  # search: keep the end
    assert truncate_ids(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate_ids(ids, 4, "middle") == [0, 1, 8, 9]  # math: head + tail
    assert truncate_ids(ids, 5, "middle") == [0, 1, 7, 8, 9]  # odd: the end gets the extra token (verl)
    assert truncate_ids(ids, 1, "middle") == [9]
    for bad_limit in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_prompt_tokens"):
            truncate_ids(ids, bad_limit, "left")
    with pytest.raises(ValueError, match="truncate side"):
        truncate_ids(ids, 4, "centre")


def test_template_variables_and_request_checks():
    assert template_kwargs_for(Request("a", []), {"x": 1}) == {"x": 1, "enable_thinking": False}
    assert template_kwargs_for(Request("a", [], Sampling(enable_thinking=True)), {})["enable_thinking"] is True
    assert extra_template_kwargs(None, kind="hf") == {}
    # outside a Request (trainer SFT): extra variables keep thinking off unless set explicitly
    assert default_template_kwargs({"x": 1}) == {"enable_thinking": False, "x": 1}
    assert default_template_kwargs({"enable_thinking": True})["enable_thinking"] is True
    with pytest.raises(EngineError, match="may not set enable_thinking.*--enable-thinking"):
        extra_template_kwargs({"enable_thinking": True}, kind="hf")
    check_request(Request("a", [], Sampling(top_k=40), max_prompt_tokens=8, truncate="middle"), kind="hf")
    with pytest.raises(EngineError, match="hf engine: top_k must be -1"):
        check_request(Request("a", [], Sampling(top_k=0)), kind="hf")
    with pytest.raises(EngineError, match="sglang engine: truncate side must be one of left, middle, right"):
        check_request(Request("a", [], max_prompt_tokens=8, truncate="both"), kind="sglang")
    with pytest.raises(EngineError, match="max_prompt_tokens must be a whole number >= 1"):
        check_request(Request("a", [], max_prompt_tokens=0), kind="openai")


def test_encode_request_cuts_the_templated_prompt(tmp_path):
    from transformers import AutoTokenizer

    path = thinking_model_path(tiny_model_path(tmp_path), tmp_path / "thinking")
    tok = AutoTokenizer.from_pretrained(path)
    msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "many words " * 30}]
    full, cut = encode_request(tok, Request("a", msgs), {}, model="m", kind="hf")
    assert not cut and tok.decode(full).endswith("assistant\n" + EMPTY_THINK)
    thinking, _ = encode_request(tok, Request("a", msgs, Sampling(enable_thinking=True)), {}, model="m", kind="hf")
    assert tok.decode(thinking).endswith("assistant\n") and thinking == full[: len(thinking)]
    for side in TRUNCATE_SIDES:
        ids, cut = encode_request(tok, Request("a", msgs, max_prompt_tokens=20, truncate=side), {}, model="m", kind="hf")
        assert cut and len(ids) == 20 and ids == plain_cut(full, 20, side)
    ids, cut = encode_request(tok, Request("a", msgs, max_prompt_tokens=len(full)), {}, model="m", kind="hf")
    assert not cut and ids == full


def test_local_tokenizer_dir_never_downloads(tmp_path, monkeypatch):
    tiny = tiny_model_path(tmp_path)
    assert local_tokenizer_dir(str(tiny)) == tiny
    assert local_tokenizer_dir("tiny-random") is not None  # prepared by tiny_model_path
    assert local_tokenizer_dir(str(tmp_path / "nowhere")) is None
    (tmp_path / "empty").mkdir()
    assert local_tokenizer_dir(str(tmp_path / "empty")) is None
    # a hub id is found only in the Hugging Face cache (a cache laid out here, read by huggingface_hub)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert local_tokenizer_dir("some-org/some-model") is None
    snap = tmp_path / "hub" / "models--some-org--some-model" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc123")
    (snap / "tokenizer_config.json").write_text("{}")
    assert local_tokenizer_dir("some-org/some-model") == snap
    assert local_tokenizer_dir("gpt-4o-mini") is None


def test_thinking_switch_reaches_the_sampling():
    import argparse

    from drmas_bench.agents.team import team_from_dict
    from drmas_bench.commands.eval import register, resolve_config
    from drmas_bench.types import UserError

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    for flags, want in (([], False), (["--enable-thinking"], True)):
        args = parser.parse_args(["eval", "--model", "tiny-random", "--suite", "toy", *flags])
        assert resolve_config(args)[4].enable_thinking is want
    team = {"sampling": {"enable_thinking": True}, "worker_groups": {"g": "tiny-random"},
            "agents": {"solver": "g", "checker": {"wg": "g", "sampling": {"enable_thinking": False}}}}
    spec = team_from_dict(team, ("solver", "checker"), "toy")
    assert spec.sampling_for("solver", Sampling()).enable_thinking is True
    assert spec.sampling_for("checker", Sampling()).enable_thinking is False
    team["sampling"] = {"enable_thinking": "yes"}
    with pytest.raises(UserError, match="sampling.enable_thinking: must be true or false"):
        team_from_dict(team, ("solver", "checker"), "toy")


@pytest.mark.slow
def test_eval_cuts_and_counts_on_the_hf_engine(data_dir, tmp_path):
    """End to end on real parts (math files, tiny-random on the hf engine): the limit reaches every
    call, the engine cuts the templated prompt in the middle, and the summary counts the cuts."""
    import json

    from drmas_bench.cli import main

    def run_eval(limit: str) -> tuple[dict, list[dict]]:
        out = tmp_path / f"run{limit}"
        assert main(["eval", "--model", "tiny-random", "--suite", "math", "--benchmarks", "aime24", "--n", "1",
                     "--limit", "2", "--max-new-tokens", "4", "--max-prompt-tokens", limit, "--no-progress",
                     "--data-dir", str(data_dir), "--out", str(out)]) == 0
        turns = [t for line in (out / "samples.jsonl").read_text().splitlines() for t in json.loads(line)["turns"]]
        return json.loads((out / "summary.json").read_text())["protocol"], turns

    proto, turns = run_eval("64")
    assert proto["prompt_truncated_calls"] == proto["calls"] == len(turns) > 0
    assert all(t["completion"]["prompt_truncated"] and t["completion"]["prompt_tokens"] == 64 for t in turns)
    assert all((t["request"]["max_prompt_tokens"], t["request"]["truncate"]) == (64, "middle") for t in turns)
    proto, turns = run_eval("0")  # no limit: nothing cut, the prompts are longer than 64
    assert proto["prompt_truncated_calls"] == 0 and all(t["completion"]["prompt_tokens"] > 64 for t in turns)
