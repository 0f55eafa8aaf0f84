"""Corpus files: read them (streaming), write them, and build one from QA datasets' paragraphs.

A corpus is JSON lines, one passage per line, with a string (or integer) ``id`` and either

* ``contents`` in the reference form ``"Title"\\ntext`` (wiki-18, FlashRAG, Search-R1), or
* ``title`` and ``text`` (``title`` may be absent: empty title).

Other fields (e.g. ``sources``) are ignored. ``.jsonl.gz`` files are read transparently. A line
that is not a JSON object, or lacks the fields, raises ``RetrievalError`` naming ``file:line``.

``build_corpus`` turns the paragraph lists that multi-hop QA datasets ship with their questions
into such a corpus (deduplicated), so a small genuine corpus can be indexed without wiki-18.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from drmas_retrieval.base import Passage, RetrievalError, parse_contents


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def passage_from_record(rec: Any, where: str) -> Passage:
    """One corpus record -> ``Passage``; ``where`` (``file:line``) goes into the error message."""
    if not isinstance(rec, dict):
        raise RetrievalError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if "id" not in rec or rec["id"] is None or isinstance(rec["id"], (dict, list, bool)):
        raise RetrievalError(f"{where}: missing or invalid 'id'")
    pid = str(rec["id"])
    if "contents" in rec:
        if not isinstance(rec["contents"], str):
            raise RetrievalError(f"{where}: 'contents' must be a string")
        title, text = parse_contents(rec["contents"])
        return Passage(pid, title, text)
    if "text" in rec:
        title, text = rec.get("title") or "", rec["text"]
        if not isinstance(text, str) or not isinstance(title, str):
            raise RetrievalError(f"{where}: 'title' and 'text' must be strings")
        return Passage(pid, title, text)
    raise RetrievalError(f"{where}: needs 'contents' or 'title' + 'text' (found keys: {', '.join(sorted(rec)) or 'none'})")


def read_corpus(path: str | os.PathLike[str], limit: int | None = None) -> Iterator[Passage]:
    """Stream the passages of a corpus file, in file order.

    Options: ``limit`` stops after that many passages (None = all). Blank lines are skipped.
    Raises ``RetrievalError`` naming the file (missing) or ``file:line`` (malformed line)."""
    p = require_corpus(path)
    n = 0
    with _open_text(p) as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and n >= limit:
                return
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise RetrievalError(f"{p}:{lineno}: not valid JSON ({e.msg})") from None
            yield passage_from_record(rec, f"{p}:{lineno}")
            n += 1


def require_corpus(path: str | os.PathLike[str]) -> Path:
    """The corpus path, or RetrievalError naming it when it is not a file."""
    p = Path(path)
    if not p.is_file():
        raise RetrievalError(f"corpus file not found: {p}")
    return p


def count_passages(path: str | os.PathLike[str]) -> int:
    """Number of non-blank lines of a corpus file (a cheap count for progress bars)."""
    with _open_text(require_corpus(path)) as f:
        return sum(1 for line in f if line.strip())


def write_corpus(passages: Iterable[Passage], path: str | os.PathLike[str], contents: bool = False) -> int:
    """Write passages as a corpus jsonl (atomically: temp file + rename); return the count.

    Options: ``contents`` writes the reference form ``{"id", "contents"}`` instead of
    ``{"id", "title", "text"}``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for ps in passages:
            if contents:
                f.write(json.dumps({"id": ps.id, "contents": ps.contents}, ensure_ascii=False) + "\n")
            else:
                f.write(ps.to_json() + "\n")
            n += 1
    os.replace(tmp, p)
    return n


# ---------------------------------------------------------------- building from QA paragraph files


def _clean(s: str) -> str:
    return " ".join(str(s).split())


def _sentences(x: Any) -> str:
    return _clean(" ".join(x)) if isinstance(x, list) else _clean(x)


def paragraphs_of(rec: Any) -> Iterator[tuple[str, str]]:
    """(title, text) pairs of one record, whatever its dataset's shape:

    * HotpotQA (Hugging Face): ``context = {"title": [...], "sentences": [[...], ...]}``
    * HotpotQA / 2Wiki (original): ``context = [[title, [sentence, ...]], ...]``
    * IRCoT processed data: ``contexts = [{"title", "paragraph_text"}, ...]``
    * MuSiQue / HippoRAG 2 PopQA: ``paragraphs = [{"title", "paragraph_text" | "text"}, ...]``
    * a corpus row itself: ``{"title", "text"}`` or ``{"contents"}``

    Sentences are joined with single spaces and whitespace is collapsed."""
    if not isinstance(rec, dict):
        return
    ctx = rec.get("context")
    if isinstance(ctx, dict) and "title" in ctx and "sentences" in ctx:
        for title, sents in zip(ctx["title"], ctx["sentences"]):
            yield _clean(title), _sentences(sents)
        return
    if isinstance(ctx, list):
        for item in ctx:
            if isinstance(item, (list, tuple)) and len(item) == 2:
                yield _clean(item[0]), _sentences(item[1])
        return
    for key in ("contexts", "paragraphs"):
        if isinstance(rec.get(key), list):
            for para in rec[key]:
                if isinstance(para, dict):
                    text = para.get("paragraph_text", para.get("text", ""))
                    yield _clean(para.get("title", "")), _sentences(text)
            return
    if "contents" in rec and isinstance(rec["contents"], str):
        title, text = parse_contents(rec["contents"])
        yield _clean(title), _clean(text)
    elif "text" in rec:
        yield _clean(rec.get("title") or ""), _sentences(rec["text"])


def _records(path: Path) -> Iterator[tuple[Any, str]]:
    """Records of a .json (list, or object holding one list) or .jsonl file, with ``file:line``."""
    if not path.is_file():
        raise RetrievalError(f"paragraph file not found: {path}")
    name = path.name[:-3] if path.suffix == ".gz" else path.name
    with _open_text(path) as f:
        if name.endswith(".json"):
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise RetrievalError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
            if isinstance(data, dict):
                lists = [v for v in data.values() if isinstance(v, list)]
                data = lists[0] if len(lists) == 1 else [data]
            for i, rec in enumerate(data):
                yield rec, f"{path}[{i}]"
            return
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line), f"{path}:{lineno}"
                except json.JSONDecodeError as e:
                    raise RetrievalError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None


def iter_built_passages(inputs: Iterable[str | os.PathLike[str]], dedupe: bool = True,
                        min_chars: int = 1) -> Iterator[Passage]:
    """The passages ``build_corpus`` writes, as a stream (ids ``"0"``, ``"1"``, ... in order)."""
    seen: set[tuple[str, str]] = set()
    n = 0
    for inp in inputs:
        path = Path(inp)
        found = 0
        for rec, _where in _records(path):
            for title, text in paragraphs_of(rec):
                found += 1
                if len(text) < min_chars:
                    continue
                if dedupe:
                    key = (title, text)
                    if key in seen:
                        continue
                    seen.add(key)
                yield Passage(str(n), title, text)
                n += 1
        if found == 0:
            raise RetrievalError(f"{path}: no paragraphs found (expected HotpotQA/2Wiki context, "
                                 "IRCoT contexts, MuSiQue/PopQA paragraphs, or title+text rows)")


def build_corpus(inputs: Iterable[str | os.PathLike[str]], out: str | os.PathLike[str],
                 dedupe: bool = True, min_chars: int = 1, contents: bool = False) -> int:
    """Build a corpus jsonl from QA datasets' paragraph files; return the number of passages.

    Options:
      ``inputs``     .json / .jsonl (optionally .gz) files in any shape ``paragraphs_of`` reads.
      ``out``        the corpus file to write (atomically).
      ``dedupe``     keep the first of identical (title, text) paragraphs (default True).
      ``min_chars``  drop paragraphs whose text is shorter (default 1: drop empty ones).
      ``contents``   write ``{"id", "contents"}`` rows instead of ``{"id", "title", "text"}``.
    Ids are assigned ``"0"``, ``"1"``, ... in input order."""
    return write_corpus(iter_built_passages(list(inputs), dedupe, min_chars), out, contents=contents)
