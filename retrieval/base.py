"""The records and the one interface every retriever implements.

``Hit``        one retrieved passage: id, title, text, score (higher is better).
``Retriever``  ``search(queries, k) -> list[list[Hit]]``: one ranked list per query, best first.
``RetrievalError``  a ValueError whose message names the file, directory or URL at fault.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any


class RetrievalError(ValueError):
    """A retrieval problem the user can fix (bad file, missing index, server unreachable).

    The message is one line and names the file, directory or URL involved."""


def first_line(e: BaseException) -> str:
    """The first non-empty line of an exception's message (errors stay one line)."""
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


def format_contents(title: str, text: str) -> str:
    """The reference corpus form of a passage: ``"Title"\\ntext`` (wiki-18 / FlashRAG)."""
    return f'"{title}"\n{text}'


def parse_contents(contents: str) -> tuple[str, str]:
    """Split a reference ``contents`` string into (title, text).

    ``"Title"\\ntext`` -> (Title, text). A first line without quotes is still taken as the title;
    a string with no newline is all text with an empty title."""
    head, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    head = head.strip()
    if len(head) >= 2 and head[0] == '"' and head[-1] == '"':
        head = head[1:-1]
    return head, rest


@dataclass
class Passage:
    """One corpus passage. ``id`` is a string unique within its corpus."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return format_contents(self.title, self.text)

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "title": self.title, "text": self.text}, ensure_ascii=False)


@dataclass
class Hit:
    """One retrieved passage with its score (BM25 score or inner product; higher is better)."""

    id: str
    title: str
    text: str
    score: float

    @property
    def contents(self) -> str:
        """``"Title"\\ntext``, the form the reference server returns."""
        return format_contents(self.title, self.text)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_reference(self, with_score: bool = True) -> dict[str, Any]:
        """The reference server's JSON for this hit: ``{"document": {"id", "contents"}, "score"}``,
        or the bare document ``{"id", "contents"}`` when ``with_score`` is False."""
        doc = {"id": self.id, "contents": self.contents}
        return {"document": doc, "score": float(self.score)} if with_score else doc


class Retriever(ABC):
    """Search a passage collection. Implementations: BM25 (bm25s), Lucene (pyserini), dense
    (sentence encoder + FAISS), all in-process, and ``HTTPRetriever`` (a /retrieve server).

    ``search`` is batched: one call with many queries is much faster than many calls with one.
    Fewer than ``k`` hits come back when fewer passages match (BM25 drops passages that share no
    term with the query; no retriever returns more passages than the corpus holds)."""

    kind: str = "?"

    @abstractmethod
    def search(self, queries: list[str], k: int = 3) -> list[list[Hit]]:
        """Top-``k`` hits for each query, best first; one list per query, in query order."""

    def search_one(self, query: str, k: int = 3) -> list[Hit]:
        """Top-``k`` hits for one query."""
        return self.search([query], k)[0]

    def info(self) -> dict[str, Any]:
        """What this retriever is (kind, passages, parameters): shown by ``GET /health``."""
        return {"kind": self.kind}

    def close(self) -> None:
        """Release files, threads or connections (a no-op unless overridden)."""

    def __enter__(self) -> "Retriever":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_search_args(queries: list[str], k: int) -> None:
    """Shared argument check: a list of strings and a positive int ``k``."""
    if isinstance(queries, str):
        raise TypeError("search() takes a list of queries; use search_one() for a single string")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    for q in queries:
        if not isinstance(q, str):
            raise TypeError(f"every query must be a string, got {type(q).__name__}")
