"""A QA gold of punctuation alone (`!!!`, the band; `*`; `+-*/`) matched when the answer wraps it in
quotes or brackets or ends it with sentence punctuation: the reference's em_check
(written plainly here: the SQuAD-normalised strings equal) pays 1 to each of the 12 cases, and so do we
now; other punctuation still scores 0 against such a gold."""

from __future__ import annotations

import pytest

from drmas_bench.grading import QAScore, grade_qa, normalize_qa

WRAPPED = ['"{}"', "({})", "{}.", "{}!?"]  # quotes, brackets, end punctuation around the gold


def reference_em(prediction: str, golds: list[str]) -> int:
    """The reference's em_check: the normalised prediction equals a normalised gold."""
    return int(any(normalize_qa(prediction) == normalize_qa(g) for g in golds))


@pytest.mark.parametrize("gold", ["!!!", "*", "+-*/"])
def test_a_punctuation_gold_wrapped_in_quotes_brackets_or_end_punctuation_matches(gold):
    for shape in WRAPPED:
        answer = shape.format(gold)
        assert reference_em(answer, [gold]) == 1
        assert grade_qa(answer, [gold]) == QAScore(1.0, 1.0, 0.0), (gold, answer)
    assert grade_qa('("' + gold + '").', [gold]).em == 1.0  # layers of wrapping
    for other in ("?", "!!", "()", '""', "!!?!"):
        assert grade_qa(other, [gold]).em == 0.0, (gold, other)
