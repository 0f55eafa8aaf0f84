"""Eval-level batch invariance on the ``hf`` engine: the same toy eval of
tiny-random in bfloat16 (where the padded batch differed most) gives the same records at
``--max-batch 1`` and ``32``, ``--concurrency 3`` and ``--workers 2`` (clock fields and the run's
own names aside; tests/test_engines_invariant.py covers float32 and the Llama model per request). The reference
is the run at ``--max-batch 1`` (every request decoded alone); smollm2-135m-instruct's figures come
from ``scripts/bench_invariance.py`` (docs/engines.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from drmas_bench.api import EvalConfig, evaluate

pytestmark = pytest.mark.slow

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from check_identical_runs import first_difference, scrub  # noqa: E402

TOY = dict(model="tiny-random", suite="toy", n=2, limit=6, max_new_tokens=32, seed=0, progress=False)


def records(run: Path) -> dict[tuple, dict]:
    out = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("run", None)
        out[(r["task"]["benchmark"], r["task"]["id"], r["sample_idx"])] = scrub(r)
    return out


def test_toy_eval_records_do_not_depend_on_the_batching(tmp_path, dtype="bfloat16"):
    ref = tmp_path / "mb1"
    evaluate(EvalConfig(**TOY, engine_args={"dtype": dtype}, max_batch=1, out=str(ref)))
    want = records(ref)
    assert len(want) == 12
    for name, extra in {"mb32": {"max_batch": 32}, "c3": {"concurrency": 3}, "w2": {"workers": 2}}.items():
        evaluate(EvalConfig(**TOY, engine_args={"dtype": dtype}, **extra, out=str(tmp_path / name)))
        got = records(tmp_path / name)
        diff = [f"{k}: {first_difference(want[k], got.get(k))}" for k in want if got.get(k) != want[k]]
        assert diff == [], (name, len(diff), diff[:2])
