"""Question-answering grading (search suite, REFERENCE.md §2): SQuAD-normalised exact match, token
F1 and cover-EM against a list of gold answers.

- `normalize_qa(s)`: lower-case, drop punctuation, drop the articles a / an / the, collapse spaces
  (the SQuAD evaluation script's normalisation, which the reference's reward uses; it is
  `drmas_retrieval.text.normalize_squad`, the one the retrieval answer recall uses too).
- `grade_qa(answer, golds) -> QAScore(em, f1, cover_em)`, each the best over the golds:
  em: the normalised answer equals a normalised gold (the reference reward);
  f1: token-level F1 between normalised answer and gold (an extra column; not in the reference);
  cover_em: a normalised gold occurs in the normalised answer as a whole-token span.

A gold whose normalised text is empty (`The The`, `!!!`, `A+`, `*`: all articles or punctuation)
is never matched: it is left out of the golds, and a task with no other gold scores 0 on all three
whatever the answer (otherwise a blank or article-only answer, `<answer></answer>` included, would
score EM 1 against it, and EM is the RL reward). SQuAD's and the reference's functions do match
`""` against such a gold; on every other gold the three scores are theirs. `data check` lists the
tasks that hold such golds (`empty_golds`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from drmas_retrieval.text import normalize_squad


@dataclass(frozen=True)
class QAScore:
    """Scores of one answer against its golds, each in [0, 1] (em and cover_em are 0 or 1)."""

    em: float
    f1: float
    cover_em: float


# SQuAD normalisation: lower-case, strip punctuation and articles, collapse whitespace. One function,
# shared with retrieval's answer recall (drmas_retrieval.text), so `Jay-Z` is `jayz` in both.
normalize_qa = normalize_squad


def token_f1(pred: str, gold: str) -> float:
    """Token F1 of two already-normalised strings (both empty: 1.0; one empty: 0.0)."""
    p, g = pred.split(), gold.split()
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def matchable_golds(golds: list[str] | str) -> list[str]:
    """The normalised golds an answer can match: those whose normalised text is not empty."""
    if isinstance(golds, str):
        golds = [golds]
    return [g for g in (normalize_qa(x) for x in golds) if g]


def empty_golds(golds: list[str] | str) -> list[str]:
    """The golds (as written) that normalise to the empty string, so nothing ever matches them."""
    if isinstance(golds, str):
        golds = [golds]
    return [g for g in golds if not normalize_qa(g)]


def grade_qa(answer: str | None, golds: list[str] | str) -> QAScore:
    """Best EM, F1 and cover-EM of `answer` over `golds` (None, no golds, or only golds that
    normalise to empty -> all zero)."""
    normed = matchable_golds(golds)
    if answer is None or not normed:
        return QAScore(0.0, 0.0, 0.0)
    pred = normalize_qa(answer)
    em = float(any(pred == g for g in normed))
    f1 = max(token_f1(pred, g) for g in normed)
    cover = float(any(f" {g} " in f" {pred} " for g in normed))
    return QAScore(em, f1, cover)
