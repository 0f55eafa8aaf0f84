"""Question-answering grading (search suite, REFERENCE.md §2): SQuAD-normalised exact match, token
F1 and cover-EM against a list of gold answers.

- `normalize_qa(s)`: lower-case, drop punctuation, drop the articles a / an / the, collapse spaces
  (the SQuAD evaluation script's normalisation, which the reference's reward uses; it is
  `drmas_retrieval.text.normalize_squad`, the one the retrieval answer recall uses too).
- `grade_qa(answer, golds) -> QAScore(em, f1, cover_em)`, each the best over the golds:
  em: the normalised answer equals a normalised gold (the reference reward);
  f1: token-level F1 between normalised answer and gold (an extra column; not in the reference);
  cover_em: a normalised gold occurs in the normalised answer as a whole-token span.

A gold whose normalised text is empty (`The The`, a band; `A+`; `!!!`: all articles or punctuation) is
matched by its own spelling: the answer and the gold compared lower-cased, without punctuation,
spaces collapsed, **articles kept** (`the the` == `The The!`); a gold of punctuation alone (`!!!`,
`*`, `+-*/`) by its characters, spaces aside (`!!!` == ` ! ! ! `), also when the answer wraps them in
quotes or brackets or ends them with sentence punctuation (`"!!!"`, `(!!!)`, `!!!.`, `!!!!?`: the gold's
characters followed by `.!?,;:` only). The reference's EM compares the
two normalised strings, so it matches such a gold with every answer that normalises to "" too; we
keep the correct answer's match (EM 1, as in the reference) and give 0 to a blank answer (nothing
left but spaces, `<answer></answer>` included), to other punctuation (`?` for `!!!`) and to an
answer of articles other than the gold's (`the`, `a`, `The The The` for `The The`): EM is the RL
reward, and those would teach an empty answer. Against such a gold F1 equals EM, and cover-EM is 0
(an article occurs in almost any text). `data check` lists the tasks that hold such golds
(`empty_golds`). On every other gold the three scores are SQuAD's and the reference's.
"""

from __future__ import annotations

import string
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
_PUNCT = str.maketrans("", "", string.punctuation)  # the punctuation normalize_squad removes


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


def spelling(s: str) -> str:
    """Lower-case, punctuation removed, spaces collapsed, articles kept: how a gold that normalises
    to "" (`The The`) is compared."""
    return " ".join(str(s).lower().translate(_PUNCT).split())


def characters(s: str) -> str:
    """The text without its spaces, punctuation kept: how a gold of punctuation alone (`!!!`) is compared."""
    return "".join(str(s).split())


_WRAPS = {'"': '"', "'": "'", "`": "`", "(": ")", "[": "]", "{": "}", "<": ">", "\u201c": "\u201d",
          "\u2018": "\u2019", "\u00ab": "\u00bb"}  # an opening quote or bracket -> its closing one
_END = ".!?,;:"  # sentence punctuation an answer may end with


def wrapped_characters(answer: str, gold: str) -> bool:
    """Whether ``answer``'s characters (:func:`characters`) are ``gold``'s, up to quotes or brackets
    around them and sentence punctuation after them (`"!!!"`, `(!!!).`, `!!!!?` for `!!!`)."""
    c = characters(answer)
    for _ in range(4):  # a few layers: `("!!!").`
        if c.startswith(gold) and all(ch in _END for ch in c[len(gold):]):
            return True
        c = c.rstrip(_END)
        if len(c) < 2 or _WRAPS.get(c[0]) != c[-1]:
            return False
        c = c[1:-1]
    return False


def _spelled_golds(golds: list[str]) -> tuple[list[str], list[str]]:
    """The golds that normalise to "", as compared: (spellings of those with a word left, `the the`;
    characters of those of punctuation alone, `!!!`). A blank gold is in neither."""
    empty = [g for g in golds if not normalize_qa(g)]
    worded = [w for w in (spelling(g) for g in empty) if w]
    punct = [c for c in (characters(g) for g in empty if not spelling(g)) if c]
    return worded, punct


def matchable_golds(golds: list[str] | str) -> list[str]:
    """The golds an answer can match, compared as they are: normalised, or, for a gold that
    normalises to "", spelled (:func:`spelling`: `The The` -> `the the`) or by its characters
    (:func:`characters`: `!!!`). Only a blank gold matches nothing."""
    if isinstance(golds, str):
        golds = [golds]
    worded, punct = _spelled_golds(golds)
    return [g for g in (normalize_qa(x) for x in golds) if g] + worded + punct


def empty_golds(golds: list[str] | str) -> list[str]:
    """The golds (as written) that normalise to the empty string (matched by their spelling only)."""
    if isinstance(golds, str):
        golds = [golds]
    return [g for g in golds if not normalize_qa(g)]


def grade_qa(answer: str | None, golds: list[str] | str) -> QAScore:
    """Best EM, F1 and cover-EM of `answer` over `golds` (None, no golds, or only golds nothing can
    match -> all zero). A gold that normalises to "" counts through its spelling or its characters
    (module docstring)."""
    if isinstance(golds, str):
        golds = [golds]
    normed = [g for g in (normalize_qa(x) for x in golds) if g]
    worded, punct = _spelled_golds(golds)
    if answer is None or not (normed or worded or punct):
        return QAScore(0.0, 0.0, 0.0)
    pred = normalize_qa(answer)
    by_spelling = float(spelling(answer) in worded or (not pred and any(wrapped_characters(answer, g) for g in punct)))
    em = max([float(pred == g) for g in normed] + [by_spelling])
    f1 = max([token_f1(pred, g) for g in normed] + [by_spelling])
    cover = float(any(f" {g} " in f" {pred} " for g in normed))
    return QAScore(em, f1, cover)
