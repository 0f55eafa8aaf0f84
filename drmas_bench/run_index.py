"""``RUN/samples.index``: what re-opening a run needs of samples.jsonl, without reading samples.jsonl.

One JSON line per samples.jsonl line, appended with it (``SampleIndex.add``):

    [benchmark, task id, sample index, line number, start offset, end offset, crc32 of the line, signature]

- the key is what a resumed run skips (``keys``);
- the signature is a hash of everything ``run_stamps.sample_mismatch`` reads of a record (the benchmark,
  each turn's agent, worker group and compared sampling keys, the run stamp: ``run_stamps.mismatch_signature``,
  given to the index as ``sign``), so checking that every kept sample belongs to the configuration
  needs one record per distinct signature (``representatives``), read at its offset;
- end offset and crc say which bytes of samples.jsonl the index covers. On open the index is trusted
  when samples.jsonl still holds the covered bytes (its size is at least the last end offset and the
  last covered line's crc matches); lines appended after that (a run killed between the two appends)
  are indexed from samples.jsonl; anything else (a repaired, truncated or replaced file, an
  unreadable index) rebuilds the index from samples.jsonl, once.

The index is a cache: deleting it costs one full read of samples.jsonl at the next open.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

INDEX = "samples.index"


def signature(doc: Any) -> str:
    """A short hash of ``doc`` (JSON-able): the index's signature of a record is this hash of what
    the store's resume check reads of it (``run_stamps.mismatch_signature``)."""
    return hashlib.blake2b(json.dumps(doc, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


def cut_partial_line(path: Path) -> None:
    """Truncate ``path`` after its last newline (a line cut short by a kill during an append goes; a
    file holding only a partial line is emptied), reading from the end a block at a time."""
    if not path.exists():
        return
    with open(path, "rb+") as f:
        end = pos = f.seek(0, os.SEEK_END)
        while pos > 0:
            start = max(0, pos - (1 << 16))
            f.seek(start)
            nl = f.read(pos - start).rfind(b"\n")
            if nl >= 0:
                if start + nl + 1 < end:
                    f.truncate(start + nl + 1)
                return
            pos = start
        f.truncate(0)


def _lines(data: bytes, start: int, first_lineno: int) -> Iterator[tuple[int, int, int, bytes]]:
    """(line number, start offset, end offset after the newline, line bytes) of each complete line."""
    pos, lineno = start, first_lineno
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return
        yield lineno, pos, nl + 1, data[pos:nl]
        pos, lineno = nl + 1, lineno + 1


class SampleIndex:
    """The index of one run directory's samples.jsonl (see the module docstring).

    ``parse(line, line number)``: a samples.jsonl line -> its record, or None to leave the line out
    (the store's raises its one-line error for an unreadable line). In memory it keeps the keys found when
    it was opened, the first line of each signature and the last entry: not a line per sample."""

    def __init__(self, run: str | os.PathLike, samples: str | os.PathLike, parse: Callable[[bytes, int], Any],
                 sign: Callable[[dict[str, Any]], str]) -> None:
        self.path = Path(run) / INDEX
        self.samples = Path(samples)
        self._parse = parse
        self._sign = sign
        self.count = 0
        self.last: list[Any] | None = None
        self.first_of: dict[str, list[Any]] = {}  # signature -> its first entry
        self.opened_keys: set[tuple[str, str, int]] = set()
        self.rebuilt = False  # whether opening it read the whole samples.jsonl
        self._opening = True  # keys are kept of the lines found while opening only

    # ------------------------------------------------------------------ open

    def load(self) -> "SampleIndex":
        """Read the index, bring it up to date with samples.jsonl (see the module docstring)."""
        size = self.samples.stat().st_size if self.samples.is_file() else 0
        if not self._read_index() or (self.last is not None and not self._covers(size)):
            self._reset()
            if self.path.exists():
                self.path.unlink()
            self.rebuilt = size > 0
        start = self.last[5] if self.last is not None else 0
        if size > start:
            self._index_tail(start, self.last[3] + 1 if self.last is not None else 1)
        self._opening = False
        return self

    def _reset(self) -> None:
        self.count, self.last, self.first_of, self.opened_keys = 0, None, {}, set()

    def _note(self, e: list[Any]) -> None:
        self.count += 1
        self.last = e
        self.first_of.setdefault(e[7], e)
        if self._opening:
            self.opened_keys.add((e[0], e[1], e[2]))

    def _read_index(self) -> bool:
        """Read the index file (False: unreadable, to be rebuilt); a cut-off last line is dropped."""
        if not self.path.is_file():
            return True
        try:
            with open(self.path, "rb") as f:
                for raw in f:
                    if not raw.endswith(b"\n"):
                        break  # cut off by a kill: the tail is indexed again from samples.jsonl
                    e = json.loads(raw)
                    if not (isinstance(e, list) and len(e) == 8):
                        return False
                    self._note(e)
        except (OSError, ValueError):
            return False
        return True

    def _covers(self, size: int) -> bool:
        assert self.last is not None
        start, end = int(self.last[4]), int(self.last[5])
        if size < end:
            return False
        with open(self.samples, "rb") as f:
            f.seek(start)
            line = f.read(end - start)
        return line.endswith(b"\n") and zlib.crc32(line[:-1]) == self.last[6]

    def _index_tail(self, start: int, lineno: int) -> None:
        with open(self.samples, "rb") as f:
            f.seek(start)
            data = f.read()
        new = []
        for n, s, e, raw in _lines(data, 0, lineno):
            if not raw.strip():
                continue
            rec = self._parse(raw, n)
            if rec is None:
                continue
            new.append(self.entry(rec, raw, n, start + s, start + e))
        self._append(new)

    # ------------------------------------------------------------------ use

    def entry(self, rec: dict[str, Any], raw: bytes, lineno: int, start: int, end: int) -> list[Any]:
        t = rec["task"]
        return [str(t["benchmark"]), str(t["id"]), int(rec["sample_idx"]), lineno, start, end, zlib.crc32(raw),
                self._sign(rec)]

    def add(self, recs: list[dict[str, Any]], lines: list[bytes], end: int) -> None:
        """Index records just appended to samples.jsonl (``lines`` without newlines), which now ends at
        offset ``end``."""
        lineno = self.last[3] + 1 if self.last is not None else 1
        pos = end - sum(len(raw) + 1 for raw in lines)
        new = []
        for i, (rec, raw) in enumerate(zip(recs, lines)):
            new.append(self.entry(rec, raw, lineno + i, pos, pos + len(raw) + 1))
            pos += len(raw) + 1
        self._append(new)

    def _append(self, new: list[list[Any]]) -> None:
        if not new:
            return
        for e in new:
            self._note(e)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(e, ensure_ascii=False, separators=(",", ":")) + "\n" for e in new))

    def __len__(self) -> int:
        return self.count

    def state(self) -> list[Any]:
        """What changes whenever samples.jsonl gains or loses a line: (lines, end offset, last crc)."""
        return [self.count, self.last[5], self.last[6]] if self.last is not None else [0, 0, 0]

    def representatives(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(line number, record) of the first line of each distinct signature, in file order."""
        firsts = sorted(self.first_of.values(), key=lambda e: e[3])
        if not firsts:
            return
        with open(self.samples, "rb") as f:
            for e in firsts:
                f.seek(e[4])
                rec = self._parse(f.read(e[5] - e[4]).rstrip(b"\n"), e[3])
                if rec is not None:
                    yield e[3], rec
