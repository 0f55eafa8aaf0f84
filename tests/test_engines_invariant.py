"""Batch invariance of the ``hf`` engine (``engines/invariant.py``): a request's
tokens and log-probs are the same alone and in batches of 4 and 32 beside requests of other
lengths, on real tiny models (Qwen2 and Llama), in float32 and bfloat16, with 1 and 2 threads.

The expected value of each request is that request generated alone (a batch of one: no neighbour,
its own row count), not a value the batched code computes."""

from __future__ import annotations

import asyncio
import random

import pytest

from drmas_bench.engines import EngineError, make_engine
from drmas_bench.types import Request, Sampling

torch = pytest.importorskip("torch")

WORDS = "the quick brown fox jumps over a lazy dog while seven tired cats sing in the rain".split()


def requests(n: int = 32) -> list[Request]:
    """``n`` requests with prompts of many lengths; greedy, top-p and top-k sampling mixed."""
    out = []
    for i in range(n):
        text = " ".join(WORDS[: 1 + (i * 7) % len(WORDS)])
        s = Sampling(max_new_tokens=6, seed=i, temperature=(0.0, 1.0, 0.7)[i % 3], top_p=(1.0, 0.9, 1.0)[i % 3],
                     top_k=(-1, -1, 20)[i % 3])
        out.append(Request(agent="a", messages=[{"role": "user", "content": f"{i}: {text}"}], sampling=s,
                           want_logprobs=True))
    return out


def outputs(completions) -> list[tuple[list[int], list[float]]]:
    return [(c.token_ids, c.logprobs) for c in completions]


@pytest.mark.parametrize("model, dtype, threads", [  # both models, both dtypes, 1 and 2 threads
    ("tiny-random", "float32", 1), ("tiny-random", "bfloat16", 2),
    ("tiny-random-llama", "float32", 2), ("tiny-random-llama", "bfloat16", 1),
])
def test_a_request_gives_the_same_tokens_and_logprobs_alone_and_in_batches(model, dtype, threads):
    reqs = requests()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    eng = make_engine("hf", model, device="cpu", dtype=dtype, max_batch=32, max_wait_ms=0)
    try:
        async def main():
            alone = [(await eng.generate([r]))[0] for r in reqs]
            largest_alone = eng.stats.largest
            together = await eng.generate(reqs)
            order = list(range(len(reqs)))
            random.Random(0).shuffle(order)  # other neighbours, other positions in the batch
            fours: dict[int, object] = {}
            for j in range(0, len(order), 4):
                idx = order[j : j + 4]
                for i, c in zip(idx, await eng.generate([reqs[i] for i in idx])):
                    fours[i] = c
            return alone, largest_alone, together, [fours[i] for i in range(len(reqs))]

        alone, largest_alone, together, fours = asyncio.run(main())
        assert largest_alone == 1 and eng.stats.largest == 32  # the batches really were 1 and 32 wide
        assert sum(len(c.token_ids) for c in alone) > 2 * len(reqs)  # not all stopped at once
        assert outputs(together) == outputs(alone)
        assert outputs(fours) == outputs(alone)
        assert eng.determinism() == {"batch_invariant": True, "why": eng.determinism()["why"], "dtype": dtype}
    finally:
        asyncio.run(eng.close())
        torch.set_num_threads(before)


def test_batch_invariant_false_is_the_padded_batch_and_says_so():
    """The opt-out is accepted, decodes the batch as one padded prefill (fewer forwards than one
    prefill per request), and its determinism says it is not invariant."""
    reqs = requests(8)
    counts = {}
    for inv in (True, False):
        eng = make_engine("hf", "tiny-random", device="cpu", max_batch=8, max_wait_ms=0, batch_invariant=inv)
        try:
            outs = asyncio.run(eng.generate(reqs))
            assert all(c.token_ids for c in outs)
            counts[inv] = eng.forward_calls
            d = eng.determinism()
            assert d["batch_invariant"] is inv and d["dtype"] == "float32"
            assert ("do not depend" in d["why"]) is inv
        finally:
            asyncio.run(eng.close())
    steps = max(r.sampling.max_new_tokens for r in reqs)
    assert counts[False] <= steps < len(reqs) + 1 <= counts[True]


@pytest.mark.parametrize("options, message", [
    ({"batch_invariant": "no"}, "batch_invariant must be true or false"),
    ({"attn_implementation": "eager"}, "cannot be honoured"),
])
def test_options_the_invariant_path_cannot_honour_are_refused(options, message):
    with pytest.raises(EngineError, match=message):
        make_engine("hf", "tiny-random", device="cpu", **options)


def test_eager_attention_is_allowed_with_the_opt_out():
    eng = make_engine("hf", "tiny-random", device="cpu", attn_implementation="eager", batch_invariant=False)
    try:
        assert asyncio.run(eng.generate(requests(1)))[0].token_ids
    finally:
        asyncio.run(eng.close())
