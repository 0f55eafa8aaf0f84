"""Text normalisation shared by retrieval evaluation and the harness's QA grading (the harness
imports it from here: retrieval depends on nothing of drmas_bench).

- `normalize_squad(s)`: the SQuAD evaluation script's answer normalisation, which the reference's
  exact-match reward uses (REFERENCE.md §2): lower-case, remove punctuation characters (so
  ``Jay-Z`` -> ``jayz``), remove the articles a / an / the, collapse whitespace.
"""

from __future__ import annotations

import re
import string

_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_squad(s: str) -> str:
    """SQuAD normalisation: lower-case, strip punctuation and articles, collapse whitespace."""
    s = str(s).lower().translate(_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())
