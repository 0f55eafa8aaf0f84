"""The ``sglang`` engine's ``deterministic`` option: it reaches SGLang's ``ServerArgs`` (through the FAKE
sglang API double, tests/fake_sglang), an incompatible combination is refused in one line, and
``determinism()`` says batch-invariant only with it.

The expected names come from the sglang 0.5.23 wheel's source (not from the engine's module):
``srt/arg_groups/fields/exec_.py`` declares ``enable_deterministic_inference`` (ExecDeterministic) and
``attention_backend``; ``srt/arg_groups/choices.py`` lists DETERMINISTIC_ATTENTION_BACKEND_CHOICES =
ascend, fa3, fa4, flashinfer, intel_xpu, triton; ``srt/arg_groups/overrides.py``
``_deterministic_attention_backend`` raises a ValueError for any other backend."""

from __future__ import annotations

import asyncio

import pytest

from drmas_bench.engines import EngineError, make_engine
from drmas_bench.types import Request, Sampling
from test_engines_fixtures import tiny_model_path
from test_engines_sglang import fake_sglang  # noqa: F401 - the fixture

SOURCE_BACKENDS = ["ascend", "fa3", "fa4", "flashinfer", "intel_xpu", "triton"]  # sglang 0.5.23 choices.py


def test_deterministic_reaches_the_server_args(fake_sglang, tmp_path):  # noqa: F811
    assert fake_sglang.DETERMINISTIC_ATTENTION_BACKEND_CHOICES == SOURCE_BACKENDS  # the double follows the source
    path = str(tiny_model_path(tmp_path))

    async def main():
        eng = make_engine("sglang", path, dtype="float32", deterministic=True)
        reqs = [Request("a", [{"role": "user", "content": "q"}], Sampling(max_new_tokens=3, seed=1))]
        await eng.generate(reqs)
        await eng.close()
        return eng

    eng = asyncio.run(main())
    started = [args for op, args in fake_sglang.CALLS if op == "Engine"]
    assert len(started) == 1
    assert started[0]["enable_deterministic_inference"] is True
    assert started[0]["attention_backend"] in SOURCE_BACKENDS and started[0]["attention_backend"] == "triton"
    assert eng.determinism() == {"batch_invariant": True, "dtype": "float32",
                                 "why": "SGLang's deterministic inference (batch-invariant kernels) is on"}


def test_without_the_option_nothing_is_added_and_it_is_not_invariant(tmp_path):
    eng = make_engine("sglang", str(tiny_model_path(tmp_path)), dtype="bfloat16")
    args = eng.server_args()
    assert "enable_deterministic_inference" not in args and "attention_backend" not in args
    d = eng.determinism()
    assert d["batch_invariant"] is False and d["dtype"] == "bfloat16" and "deterministic=true" in d["why"]


def test_a_chosen_supported_backend_is_kept(tmp_path):
    eng = make_engine("sglang", str(tiny_model_path(tmp_path)), deterministic=True,
                      engine_args={"attention_backend": "fa3"})
    assert eng.server_args()["attention_backend"] == "fa3"


@pytest.mark.parametrize("engine_args, says", [
    ({"attention_backend": "torch_native"}, "attention_backend=torch_native"),
    ({"sampling_backend": "flashinfer"}, "sampling_backend=flashinfer"),
    ({"enable_deterministic_inference": False}, "contradict"),
])
def test_incompatible_combinations_are_refused_in_one_line(tmp_path, engine_args, says):
    with pytest.raises(EngineError, match=says) as got:
        make_engine("sglang", str(tiny_model_path(tmp_path)), deterministic=True, engine_args=engine_args)
    assert "\n" not in str(got.value)


def test_the_double_refuses_what_sglang_refuses(fake_sglang, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="attention backends are supported for deterministic inference"):
        fake_sglang.Engine(model_path=str(tiny_model_path(tmp_path)), enable_deterministic_inference=True,
                           attention_backend="torch_native")
