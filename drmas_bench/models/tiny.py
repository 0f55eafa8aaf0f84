"""``tiny-random``: a ~1.6M-parameter Qwen2 with random weights and a byte-level BPE tokenizer trained
on a built-in text; deterministic from a seed, built in seconds (tests, CI)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drmas_bench.models.model_cache import CHATML_TEMPLATE, progress

TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_DEFAULT_SEED = 0

_AGENT_PHRASES = [
    "You are a helpful assistant.", "You are the solver.", "You are the verifier.",
    "Solve the problem step by step.", "Please reason step by step, and put your final answer within \\boxed{}.",
    "Check the solution carefully.", "If the solution is correct, reply approve; otherwise reply reject.",
    "Verdict: approve", "Verdict: reject", "The answer is", "Final answer:", "Question:", "Answer:",
    "Previous solution:", "Feedback:", "Let me think.", "First, add the numbers.", "So the answer is",
    "<think>", "</think>", "<answer>", "</answer>", "<search>", "</search>", "<information>", "</information>",
    "You can search the web with <search> query </search> and answer with <answer> answer </answer>.",
    "Route the question to the search agent or the answer agent.", "Decide whether more information is needed.",
    "Doc 1 (Title: Paris)", "Doc 2 (Title: France)", "The capital of France is Paris.",
]
_SUBJECTS = ["the solver", "the verifier", "an agent", "the model", "the team", "a student", "the teacher",
             "the router", "the searcher", "my friend", "the cat", "a small robot", "the worker"]
_VERBS = ["reads", "checks", "writes", "answers", "solves", "finds", "counts", "adds", "explains", "likes",
          "asks", "searches", "verifies", "approves", "rejects", "learns"]
_OBJECTS = ["the question", "the answer", "a number", "the problem", "the document", "a short note",
            "the final result", "every step", "the sum", "the evidence", "a new idea", "the title"]
_WORDS = """
time year people way day man woman child world life hand part place case week company system program
question work government number night point home water room mother area money story fact month lot right
study book eye job word business issue side kind head house service friend father power hour game line
end member law car city community name president team minute idea kid body information back parent face
others level office door health person art war history party result change morning reason research girl
guy moment air teacher force education foot boy age policy music market sense nation plan college interest
death experience effect class control care field development role effort rate heart drug show leader light
voice wife police mind price report decision son view relationship town road arm difference value building
action model season society tax director position player record paper space ground form event official
matter center couple site project activity star table need court oil situation cost industry figure street
image phone data picture practice piece land product doctor wall patient worker news test movie north love
support technology step baby computer type attention film tree source organization hair window evidence
population truth song energy stage animal chance fire bank river paris france london england germany berlin
italy rome spain madrid japan tokyo china beijing india delhi canada ottawa brazil egypt cairo africa europe
asia america ocean mountain island desert forest lake valley planet moon sun earth mars science physics
chemistry biology mathematics algebra geometry equation function variable answer solution problem
proof theorem example method formula total sum quotient fraction decimal percent
square root prime factor multiple divisor integer digit zero one two three four five six seven eight nine
ten eleven twelve twenty thirty forty fifty hundred thousand million first second third last next half
double triple plus minus times divided equals greater less than equal odd even positive negative count
add subtract multiply divide compute calculate simplify solve check verify approve reject correct wrong
true false yes no maybe because therefore since however although unless while before after during until
about above across against along among around behind below beneath beside between beyond inside outside
through toward under within without always never often sometimes usually rarely again already also just
only still quite very really almost enough perhaps probably certainly clearly simply exactly finally
good new great small large little big high old important young early bad able public real
best better sure free strong whole special clear recent late full hard easy simple short main
available likely human local national possible social major open political economic similar wide natural
happy ready serious medical black white red blue green yellow dark bright hot cold warm cool fast slow
quick quiet loud rich poor heavy soft deep empty famous final general single common modern useful
say make go take come see know get give find think tell become leave feel put bring begin keep hold
write stand hear let mean set meet run pay sit speak lie lead read grow lose fall send build understand
draw break spend cut rise drive buy wear choose seek throw catch deal win forget teach learn listen walk
talk play move live believe happen include continue follow stop create allow appear offer remember
consider suggest expect serve die reach kill remain raise pass sell require decide return explain
hope develop carry describe agree receive accept search retrieve route respond summarize
document title passage paragraph sentence query context wikipedia article author date
reward score accuracy metric agent solver verifier router searcher planner critic judge manager
round turn episode trajectory gradient advantage baseline group batch token prompt response
""".split()  # noqa: SIM905 - a small English word bank for the tokenizer text
_ENDINGS = [".", " today.", " again.", " carefully.", " quickly.", " with care.", " step by step.", "!"]


def tiny_corpus() -> list[str]:
    """The built-in text the tiny tokenizer is trained on (fixed: independent of the model seed)."""
    rng = random.Random(20240501)
    lines: list[str] = list(_AGENT_PHRASES) * 4
    for a in range(21):
        for b in range(21):
            lines.append(f"What is {a} + {b}?")
            lines.append(f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}.")
            if a >= b:
                lines.append(f"What is {a} - {b}? {a} - {b} = {a - b}.")
            if a <= 12 and b <= 12:
                lines.append(f"What is {a} * {b}? {a} * {b} = {a * b}.")
    lines += [" ".join(str(i) for i in range(j, j + 50)) for j in range(0, 1000, 50)]
    for _ in range(1500):
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_ENDINGS)}"
        lines.append(s[0].upper() + s[1:])
    for _ in range(4000):
        s = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 12)))
        lines.append(s[0].upper() + s[1:] + rng.choice(_ENDINGS))
    for _ in range(300):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        lines.append(f"<|im_start|>system\n{rng.choice(_AGENT_PHRASES)}<|im_end|>\n"
                     f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n"
                     f"<|im_start|>assistant\n{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}.<|im_end|>\n")
    return lines


def train_tiny_tokenizer(vocab_size: int = 4096, special_tokens: list[str] | None = None,
                         corpus: list[str] | None = None) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``corpus`` (:func:`tiny_corpus` by
    default; digits split one by one, the special tokens first: by default ChatML's,
    ``<|endoftext|>`` = 0, ``<|im_start|>`` = 1, ``<|im_end|>`` = 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=TINY_SPECIAL_TOKENS if special_tokens is None else special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(tiny_corpus() if corpus is None else corpus, trainer=trainer)
    return tok


def build_tiny_random(dest: Path, seed: int = TINY_DEFAULT_SEED, log: Callable[[str], None] = progress,
                      hidden_size: int = 128, num_layers: int = 4) -> dict[str, Any]:
    """Write a random Qwen2ForCausalLM + its tokenizer into ``dest``; byte-identical for the same seed
    (with the same transformers / tokenizers / torch versions)."""
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from drmas_bench.models.tiny_build import save_tiny, seeded_random_model

    dest.mkdir(parents=True, exist_ok=True)
    log(f"tiny-random: training a byte-level BPE tokenizer and building a Qwen2 model (seed {seed})")
    raw = train_tiny_tokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  model_max_length=8192)
    tok.chat_template = CHATML_TEMPLATE
    tok.padding_side = "left"
    ids = {t: raw.token_to_id(t) for t in TINY_SPECIAL_TOKENS}
    config = Qwen2Config(
        vocab_size=raw.get_vocab_size(), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=8192, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        use_sliding_window=False, dtype="float32",
    )
    model = seeded_random_model(Qwen2ForCausalLM, config, seed)
    saved = save_tiny(dest, model, tok, {"bos_token_id": ids["<|endoftext|>"],
                                         "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                                         "pad_token_id": ids["<|endoftext|>"]})
    return {"seed": seed, "parameters": saved.pop("parameters"), "vocab_size": config.vocab_size, "dtype": "float32",
            **saved}
