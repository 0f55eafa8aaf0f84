"""Every run states how reproducible its numbers are: summary.json's
``reproducibility`` block and summary.md's one line, a resume under other batching flagged where the
engine is not batch-invariant, and the openai engine's ``system_fingerprint`` kept per call.

Expected lines are written out here by hand; the engines' answers come from their declarations
(sglang: batch-invariant only with its deterministic inference; openai: not known)."""

from __future__ import annotations

import json

import pytest
import yaml

from drmas_bench.agents.team import TeamSpec, WorkerGroupSpec
from drmas_bench.api import EvalConfig, evaluate
from drmas_bench.engines.openai_wire import parse_response
from drmas_bench.report.labels import reproducibility_text
from drmas_bench.reproducibility import FingerprintTally, reproducibility_block
from drmas_bench.types import Completion, Request, Turn


def _team(groups):
    return TeamSpec("toy", {"solver": "a", "checker": "b"}, {wg: WorkerGroupSpec(name=wg, **g) for wg, g in groups.items()})


def test_block_and_line_for_a_deterministic_sglang_group_and_a_server():
    team = _team({"a": {"model": "tiny-random", "engine": "sglang", "options": {"deterministic": True, "dtype": "bfloat16"}},
                  "b": {"model": "gpt-x", "engine": "openai", "base_url": "http://127.0.0.1:9/v1"}})
    tally = FingerprintTally()
    tally.add({"turns": [{"agent": "checker", "wg": "b", "completion": {"text": "x", "system_fingerprint": "fp_2"}},
                         {"agent": "checker", "wg": "b", "completion": {"text": "y", "system_fingerprint": "fp_1"}},
                         {"agent": "solver", "wg": "a", "completion": {"text": "z"}}]})
    block = reproducibility_block(team, 7, None, tally.result(), [])
    assert block["reproducible"] is False and block["seed"] == 7
    assert block["groups"]["a"] == {"engine": "sglang", "model": "tiny-random", "dtype": "bfloat16", "batch_invariant": True,
                                    "why": "SGLang's deterministic inference (batch-invariant kernels) is on"}
    assert block["groups"]["b"]["batch_invariant"] is False and block["groups"]["b"]["fingerprints"] == ["fp_1", "fp_2"]
    assert reproducibility_text(block) == (
        "- reproducible: not guaranteed (seed 7): a request's batch may change its tokens, so --max-batch, "
        "--concurrency, --workers or a resume can change records; a (sglang, bfloat16): SGLang's deterministic "
        "inference (batch-invariant kernels) is on; b (openai, unknown (the server's)): the server's determinism "
        "is not known (its batching and kernels are its own); fingerprints fp_1, fp_2")
    only = _team({"a": {"model": "tiny-random", "engine": "sglang", "options": {"deterministic": True}},
                  "b": {"model": "tiny-random", "engine": "sglang", "options": {"deterministic": True}}})
    history = [{"concurrency": 256}, {"concurrency": 3}]
    both = reproducibility_block(only, 0, None, {}, history)
    assert both["reproducible"] is True and "batching_changed" not in both  # invariant: a new batching is fine
    assert reproducibility_text(both).startswith("- reproducible: yes: every engine is batch-invariant")


def test_openai_fingerprint_is_kept_per_call_and_only_when_given():
    body = {"choices": [{"text": "hi", "finish_reason": "stop"}], "usage": {"prompt_tokens": 2, "completion_tokens": 1},
            "system_fingerprint": "fp_abc"}
    assert parse_response(body, False).system_fingerprint == "fp_abc"
    assert parse_response({**body, "system_fingerprint": None}, False).system_fingerprint is None
    turn = Turn("solver", "g", 0, Request("solver", []), Completion("x"))
    assert "system_fingerprint" not in turn.to_dict()["completion"]  # records stay as they were without one
    turn.completion.system_fingerprint = "fp_abc"
    assert Turn.from_dict(json.loads(json.dumps(turn.to_dict()))).completion.system_fingerprint == "fp_abc"


def test_every_run_states_it_and_a_resume_under_other_batching_is_flagged(tmp_path):
    """The hf engine is batch-invariant by default: the run says so, and a resume at other batching is
    not flagged. With ``batch_invariant=false`` the same resume is flagged, in summary.json and summary.md."""
    common = dict(model="tiny-random", suite="toy", n=1, max_new_tokens=4, seed=0, progress=False)
    s = evaluate(EvalConfig(limit=2, out=str(tmp_path / "inv"), **common))
    block = s["reproducibility"]
    assert block["groups"]["shared"]["engine"] == "hf" and block["seed"] == 0
    assert block["groups"]["shared"]["batch_invariant"] is True and block["reproducible"] is True
    assert block["batching"]["concurrency"] == 256 and block["batching"]["max_batch"] == {"shared": {"max_batch": 32}}
    md = (tmp_path / "inv" / "summary.md").read_text()
    assert sum(line.startswith("- reproducible:") for line in md.splitlines()) == 1
    assert "batch-invariant" in next(line for line in md.splitlines() if line.startswith("- reproducible:"))
    s = evaluate(EvalConfig(limit=3, concurrency=3, out=str(tmp_path / "inv"), **common))
    assert "batching_changed" not in s["reproducibility"]

    padded = dict(common, engine_args={"batch_invariant": False}, out=str(tmp_path / "padded"))
    s = evaluate(EvalConfig(limit=2, **padded))
    assert s["reproducibility"]["groups"]["shared"]["batch_invariant"] is False and not s["reproducibility"]["reproducible"]
    s2 = evaluate(EvalConfig(limit=3, concurrency=3, **padded))
    assert s2["reproducibility"]["batching_changed"] == ["concurrency"]
    assert "samples were made under different concurrency" in (tmp_path / "padded" / "summary.md").read_text()


def test_a_resume_at_another_max_batch_is_refused_only_where_records_could_differ(tmp_path):
    """``batch_invariant=false``: another --max-batch is refused, naming it. The default (batch-invariant):
    the same resume is one experiment, its identity holds no max_batch, and the summary records the new
    batching."""
    from drmas_bench.types import UserError

    common = dict(model="tiny-random", suite="toy", n=1, limit=2, max_new_tokens=4, seed=0, progress=False)
    strict = dict(common, engine_args={"batch_invariant": False}, out=str(tmp_path / "strict"))
    evaluate(EvalConfig(max_batch=8, **strict))
    with pytest.raises(UserError, match="max_batch"):
        evaluate(EvalConfig(max_batch=2, **strict))

    evaluate(EvalConfig(out=str(tmp_path / "loose"), max_batch=8, **common))
    s = evaluate(EvalConfig(out=str(tmp_path / "loose"), max_batch=2, **{**common, "limit": 3}))
    assert s["micro"]["questions"] == 3 and s["run"]["episodes_resumed"] == 2
    ident = yaml.safe_load((tmp_path / "loose" / "config.yaml").read_text())["identity"]
    assert "max_batch" not in (ident["team"]["worker_groups"]["shared"].get("options") or {})
    assert s["reproducibility"]["batching"]["max_batch"] == {"shared": {"max_batch": 2}}
    assert "batching_changed" not in s["reproducibility"]
