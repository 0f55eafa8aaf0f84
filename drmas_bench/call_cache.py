"""The call cache: a completion is reused only when it is the same call (docs/sweep.md).

    cache = CallCache.open("cache/")               # cache/calls.sqlite3, made when missing
    engines = CallChain(call_cache=cache).wrap(pool.views(), team, models)   # drmas_bench.calls: {wg: CachedEngine}
    ...
    cache.close()

Off unless asked (``--cache DIR``, ``EvalConfig.cache``, ``cache:`` in a team file). What makes two
calls the same (:func:`call_key`, sha256 of one canonical JSON):

- the worker group's model by content (``provenance.models_identity``: a hash of the folder's files,
  weights, config, tokenizer and chat template included; a model known only by name: its name), its
  engine kind and every engine option that can change a completion (``engines.output_options``:
  dtype, device kind, quantisation, chat template variables, a server's URL and served name...; not
  batching, ports, timeouts or keys), with ``"auto"`` resolved as it acts here;
- the exact prompt as the engine will build it: the messages, ``enable_thinking`` and the prompt
  limit and side. With the model's content fixed these determine the templated token ids, which
  is why the key need not template the prompt (a tokenizer load and a templating pass per lookup);
- the sampling (temperature, top_p, top_k, max new tokens, the per-call seed: every field of
  ``Sampling``, so a field added later joins the key), whether log-probs were asked for, and the
  sample's index, so two independent samples are never served one completion;
- the calling agent: an engine that serves LoRA adapters picks the adapter by the request's agent
  (one model folder, one adapter per agent), so the same prompt from two agents is two calls.

A store of the value (:class:`CallCache`): SQLite in WAL mode with a busy timeout, one transaction
per write, so several evals may share one directory and a kill -9 leaves either the whole entry or
none. Each row carries a checksum of its key and value, checked on every read: a row that does not
match is never served (it counts as a miss and is overwritten). A file that is not a cache of this
version is refused with one line when opened.

A hit returns the stored completion with ``cache_hit`` set; its ``latency_s`` is what the lookup
took and its dollars are $0 (``pricing.turn_cost``): what this run spent. The original call's latency
and dollars stay in ``cached_latency_s`` / ``cached_usd``, so latency and cost figures stay true and
the saving is counted (:func:`cache_summary`, summary.json's ``cache``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import time
import zlib
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterable

from drmas_bench.engines import output_options
from drmas_bench.files import model_identity
from drmas_bench.records import view
from drmas_bench.types import CACHE_FIELDS, Completion, Request, UserError

logger = logging.getLogger(__name__)

DB_NAME = "calls.sqlite3"
SCHEMA_VERSION = 1  # of the table; a key change bumps KEY_VERSION (old rows then simply never match)
KEY_VERSION = 2  # 2: the agent joined the key (per-agent adapters)
BUSY_TIMEOUT_MS = 60_000  # a writer waits this long for another process's transaction
_COMPLETION_FIELDS = tuple(f.name for f in fields(Completion) if f.name not in CACHE_FIELDS and f.name != "latency_s")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calls (
    key TEXT PRIMARY KEY,        -- call_key: sha256 of the canonical call
    model TEXT NOT NULL,         -- the worker group's model as named (alias, folder, hub id), for stats and prune
    content TEXT NOT NULL,       -- its content hash ('' for a model known by name)
    engine TEXT NOT NULL,
    created REAL NOT NULL,       -- unix time of the write
    bytes INTEGER NOT NULL,      -- len(value)
    checksum TEXT NOT NULL,      -- sha256(key, value): a row that does not match is never served
    value BLOB NOT NULL          -- zlib(JSON): the completion, its original latency and dollars
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS calls_created ON calls (created);
"""


def _canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8")


def _checksum(key: str, value: bytes) -> str:
    return hashlib.sha256(key.encode("ascii") + b"\0" + value).hexdigest()


# ------------------------------------------------------------------------------- the key


def group_identity(kind: str, model: str, model_id: dict[str, Any] | None, options: dict[str, Any], *,
                   here: bool = True) -> dict[str, Any]:
    """What a worker group contributes to every call's key: the engine kind, the model by content
    (``model_id``: provenance.models_identity's entry; None or a name-only entry: the name; the
    folder's path is left out, so a copy elsewhere is the same model) and the options that change
    outputs (``engines.output_options``; a local ``tokenizer`` folder by its content too).
    ``here``: the engine runs on this machine (not on Ray nodes), so ``"auto"`` options resolve here."""

    mid = model_id or {}
    model_part = {"content": mid["content"]} if mid.get("content") else {"name": str(mid.get("name") or model)}
    opts = output_options(kind, options, here=here)
    tok = opts.get("tokenizer")
    if isinstance(tok, str) and Path(tok).expanduser().is_dir():
        opts["tokenizer"] = {"content": model_identity(Path(tok).expanduser())["content"]}
    return {"engine": kind, "model": model_part, "options": opts}


def group_digest(identity: dict[str, Any]) -> str:
    """sha256 of a group identity: computed once per run, the part of the key every call shares."""
    return hashlib.sha256(_canonical({"v": KEY_VERSION, "group": identity})).hexdigest()


def call_key(group: str, request: Request) -> str:
    """The cache key of one call (module docstring): ``group`` is :func:`group_digest` of its worker
    group; the rest comes from the request. Pure and cheap (one JSON dump and one sha256)."""
    limit = request.max_prompt_tokens if request.max_prompt_tokens else None
    doc = {
        "group": group,
        "agent": request.agent,
        "messages": request.messages,
        "sampling": vars(request.sampling),  # its fields are scalars: no deep copy needed
        "logprobs": bool(request.want_logprobs),
        "limit": [limit, request.truncate if limit else None],
        "sample": request.sample_idx,
    }
    return hashlib.sha256(_canonical(doc)).hexdigest()


# ------------------------------------------------------------------------------- the store


def db_path(cache_dir: str | os.PathLike) -> Path:
    return Path(cache_dir).expanduser() / DB_NAME


def _refuse(path: Path, why: Any) -> UserError:
    return UserError(f"{path}: not a usable call cache ({str(why).splitlines()[0] if str(why) else type(why).__name__}); "
                     f"move it aside (or delete it) and the next run starts an empty cache there")


class CallCache:
    """One cache database (``DIR/calls.sqlite3``), opened by :meth:`open`. One connection per process
    and thread of use; several processes may share the file (WAL mode, busy timeout)."""

    def __init__(self, path: Path, con: sqlite3.Connection) -> None:
        self.path = path
        self.con = con
        self.bad_rows = 0  # rows whose checksum did not match (never served)

    @classmethod
    def open(cls, cache_dir: str | os.PathLike, *, create: bool = True) -> "CallCache":
        """Open (``create``: or start) the cache in ``cache_dir``. A file that is not a SQLite database,
        or one of another schema, is one UserError; nothing is written to it."""
        d = Path(cache_dir).expanduser()
        path = d / DB_NAME
        if d.exists() and not d.is_dir():
            raise UserError(f"--cache {cache_dir}: not a directory")
        if not path.is_file():
            if not create:
                raise UserError(f"{path}: no call cache here (a cache directory holds {DB_NAME})")
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UserError(f"--cache {cache_dir}: cannot create the directory ({e.strerror or e})") from None
        try:
            con = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        except sqlite3.Error as e:
            raise _refuse(path, e) from None
        try:
            con.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}  # reads only
            if tables and not {"meta", "calls"} <= tables:
                raise _refuse(path, f"its tables are {', '.join(sorted(tables))}, not a call cache's")
            if con.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() != "wal":
                raise _refuse(path, "the file system does not support SQLite's WAL mode")
            con.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a committed write survives a killed process
            if not tables:  # one transaction: another process sees no tables or all of them
                try:
                    con.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}INSERT OR IGNORE INTO meta VALUES ('schema', "
                                      f"'{SCHEMA_VERSION}');COMMIT;")
                except BaseException:
                    if con.in_transaction:
                        con.execute("ROLLBACK")
                    raise
            row = con.execute("SELECT value FROM meta WHERE name='schema'").fetchone()
            if row is None or row[0] != str(SCHEMA_VERSION):
                raise _refuse(path, f"schema version {row[0] if row else 'missing'}, this version reads {SCHEMA_VERSION}")
            cols = [r[1] for r in con.execute("PRAGMA table_info(calls)")]
            if cols != ["key", "model", "content", "engine", "created", "bytes", "checksum", "value"]:
                raise _refuse(path, "its calls table has other columns")
        except sqlite3.DatabaseError as e:
            con.close()
            raise _refuse(path, e) from None
        except UserError:
            con.close()
            raise
        return cls(path, con)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> "CallCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---------------------------------------------------------------- entries

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored value of ``key`` ({"completion": {...}, "latency_s", "usd"}), or None. A row whose
        checksum does not match (a damaged page) is not served: None, and it is counted."""
        try:
            row = self.con.execute("SELECT value, checksum FROM calls WHERE key=?", (key,)).fetchone()
        except sqlite3.DatabaseError as e:
            raise _refuse(self.path, e) from None
        if row is None:
            return None
        value, checksum = row
        if _checksum(key, value) != checksum:
            self._bad(key, "its checksum does not match")
            return None
        try:
            return json.loads(zlib.decompress(value))
        except (zlib.error, ValueError) as e:
            self._bad(key, e)
            return None

    def _bad(self, key: str, why: Any) -> None:
        self.bad_rows += 1
        logger.warning(f"[cache] {self.path}: entry {key[:12]} is damaged ({why}); not served, computed again")

    def put_many(self, entries: Iterable[tuple[str, dict[str, Any], dict[str, Any]]]) -> int:
        """Write ``(key, value, labels)`` entries in one transaction (all or none survive a kill);
        ``labels``: model, content, engine. An existing key is replaced (a damaged row heals). -> count."""
        rows = []
        now = time.time()
        for key, value, labels in entries:
            blob = zlib.compress(_canonical(value), 1)
            rows.append((key, str(labels.get("model") or ""), str(labels.get("content") or ""),
                         str(labels.get("engine") or ""), now, len(blob), _checksum(key, blob), blob))
        if not rows:
            return 0
        try:
            with self.con:  # one transaction (isolation_level=None: BEGIN explicitly)
                self.con.execute("BEGIN IMMEDIATE")
                self.con.executemany("INSERT OR REPLACE INTO calls VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                logger.warning(f"[cache] {self.path}: busy for {BUSY_TIMEOUT_MS / 1000:.0f} s; {len(rows)} entries not "
                               "written (the run goes on; they are computed again next time)")
                return 0
            raise _refuse(self.path, e) from None
        except sqlite3.DatabaseError as e:
            raise _refuse(self.path, e) from None
        return len(rows)

    # ---------------------------------------------------------------- maintenance (drmas-bench cache)

    def check(self) -> None:
        """SQLite's own page check (``quick_check``): a damaged file is one UserError."""
        try:
            got = [r[0] for r in self.con.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as e:
            raise _refuse(self.path, e) from None
        if got != ["ok"]:
            raise _refuse(self.path, f"damaged: {got[0]}")

    def stats(self) -> dict[str, Any]:
        """Entries, bytes on disk (database + WAL), per model / engine counts, oldest and newest write."""
        q = self.con.execute
        n, value_bytes, oldest, newest = q("SELECT COUNT(*), COALESCE(SUM(bytes), 0), MIN(created), MAX(created) FROM calls").fetchone()
        groups = [{"model": m, "content": c, "engine": e, "entries": k, "value_bytes": b}
                  for m, c, e, k, b in q("SELECT model, content, engine, COUNT(*), SUM(bytes) FROM calls "
                                         "GROUP BY model, content, engine ORDER BY COUNT(*) DESC, model")]
        disk = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")) if p.is_file())
        return {"path": str(self.path), "entries": n, "value_bytes": value_bytes, "disk_bytes": disk,
                "oldest": oldest, "newest": newest, "models": groups}

    def prune(self, *, older_than_days: float | None = None, model: str | None = None,
              max_size_mb: float | None = None) -> int:
        """Delete entries written more than ``older_than_days`` ago, of ``model`` (its name as the runs
        named it, or a prefix of its content hash), then the oldest until the values fit in
        ``max_size_mb``; VACUUM afterwards (the file shrinks). -> entries deleted."""
        where: list[str] = []
        args: list[Any] = []
        if older_than_days is not None:
            where.append("created < ?")
            args.append(time.time() - older_than_days * 86400)
        if model is not None:
            where.append("(model = ? OR (content != '' AND content LIKE ?))")
            args += [model, f"{model}%"]
        deleted = 0
        with self.con:
            self.con.execute("BEGIN IMMEDIATE")
            if where:
                deleted += self.con.execute(f"DELETE FROM calls WHERE {' AND '.join(where)}", args).rowcount
            if max_size_mb is not None:
                budget = int(max_size_mb * 1024 * 1024)
                total = self.con.execute("SELECT COALESCE(SUM(bytes), 0) FROM calls").fetchone()[0]
                if total > budget:
                    cut, drop = 0, total - budget
                    keys = []
                    for key, size in self.con.execute("SELECT key, bytes FROM calls ORDER BY created, key"):
                        if cut >= drop:
                            break
                        keys.append((key,))
                        cut += size
                    self.con.executemany("DELETE FROM calls WHERE key=?", keys)
                    deleted += len(keys)
        self.con.execute("VACUUM")
        self.con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return deleted


# ------------------------------------------------------------------------------- at the call site


def completion_value(c: Completion, usd: float | None) -> dict[str, Any]:
    """What is stored for a computed call: the completion (not its cache fields), its latency and dollars."""
    # the fields read directly (dataclasses.asdict deep-copies every list: 5x the time of the rest of a miss)
    return {"completion": {k: getattr(c, k) for k in _COMPLETION_FIELDS}, "latency_s": float(c.latency_s), "usd": usd}


def served_completion(value: dict[str, Any], lookup_s: float,
                      price: Callable[[Completion], float | None] | None = None) -> Completion:
    """A stored value as this run's completion: ``cache_hit``, the lookup's own latency, the original
    latency and dollars (``price``: this run's price sheet on the original call; without one, or when
    it cannot price it, the dollars stored with the entry)."""
    c = Completion(**{k: v for k, v in value["completion"].items() if k in _COMPLETION_FIELDS})
    c.latency_s = float(value.get("latency_s") or 0.0)  # the original call, as the price sheet sees it
    usd = price(c) if price is not None else None
    c.cached_latency_s, c.latency_s = c.latency_s, lookup_s
    c.cache_hit = True
    c.cached_usd = usd if usd is not None else value.get("usd")
    return c


class CachedEngine:
    """One worker group's engine (a pool view) seen through the cache: ``await generate(requests)``
    serves the requests it has from the cache and sends the others to the engine in one call,
    writing their completions once the engine returns.

    Why here, around the pool's view of a worker group, and not inside each engine: this is where
    a request meets its worker group's model identity (computed once by the plan) on every path a
    call takes, whatever the engine or the pool; inside an engine it would be one copy per backend,
    and under a Ray pool a SQLite file written from actors on other machines.

    ``price(completion) -> $ | None``: this run's price of a call (None without a price sheet)."""

    def __init__(self, engine: Any, cache: CallCache, identity: dict[str, Any], labels: dict[str, str],
                 price: Callable[[Completion], float | None] | None = None) -> None:
        self.engine = engine
        self.cache = cache
        self.group = group_digest(identity)
        self.labels = labels
        self.price = price
        self.model = getattr(engine, "model", labels.get("model", ""))
        self.hits = 0
        self.misses = 0

    @property
    def name(self) -> str:
        return getattr(self.engine, "name", "engine")

    async def generate(self, requests: list[Request]) -> list[Completion]:
        t0 = time.perf_counter()
        keys = [call_key(self.group, r) for r in requests]
        found = [self.cache.get(k) for k in keys]
        lookup_s = (time.perf_counter() - t0) / max(1, len(requests))
        out: list[Completion | None] = [None] * len(requests)
        for i, v in enumerate(found):
            if v is not None:
                out[i] = served_completion(v, lookup_s, self.price)
        todo = [i for i, v in enumerate(found) if v is None]
        self.hits += len(requests) - len(todo)
        self.misses += len(todo)
        if todo:
            got = await self.engine.generate([requests[i] for i in todo])
            entries = []
            for i, c in zip(todo, got):
                out[i] = c
                entries.append((keys[i], completion_value(c, self.price(c) if self.price else None), self.labels))
            self.cache.put_many(entries)  # after the engine returned: only finished completions are stored
        return out  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:  # is_awake, footprint_bytes, close: the wrapped view's
        return getattr(self.engine, name)


# ------------------------------------------------------------------------------- what a run reports


def cache_summary(records: Iterable[Any], cache_dir: str | None) -> dict[str, Any] | None:
    """summary.json's ``cache``: ``{"dir", "hits", "misses", "agents": {agent: {"hits", "misses",
    "tokens_saved", "usd_saved", "seconds_saved"}}}`` over the run's records (a resumed run's earlier
    calls included); None when no cache was asked for and no recorded call was served by one.
    A miss is a call an engine computed; ``tokens_saved`` is prompt + completion tokens of the hits,
    ``usd_saved`` their original dollars (None when some are unknown), ``seconds_saved`` their
    original latency minus what the lookups took."""
    tally = CacheTally()
    for r in records:
        tally.add(r)
    return tally.result(cache_dir)


class CacheTally:
    """`cache_summary`'s sums, one record at a time (a fold a run's summary feeds as it reads)."""

    def __init__(self) -> None:
        self.agents: dict[str, dict[str, Any]] = {}
        self.any_hit = False

    def add(self, record: Any) -> None:
        for t in view(record).turns:
            c = t.call
            a = self.agents.setdefault(t.agent, {"hits": 0, "misses": 0, "tokens_saved": 0,
                                                 "usd_saved": 0.0, "seconds_saved": 0.0})
            if not c.cache_hit:
                a["misses"] += 1
                continue
            self.any_hit = True
            a["hits"] += 1
            a["tokens_saved"] += c.tokens
            usd = c.cached_usd
            a["usd_saved"] = None if usd is None or a["usd_saved"] is None else a["usd_saved"] + usd
            a["seconds_saved"] += (c.cached_latency_s or 0.0) - c.latency_s

    def result(self, cache_dir: str | None) -> dict[str, Any] | None:
        """``cache_summary``'s section (None when no cache was asked for and no call came from one)."""
        if cache_dir is None and not self.any_hit:
            return None
        agents = {name: dict(a) for name, a in self.agents.items()}
        for a in agents.values():
            a["seconds_saved"] = round(a["seconds_saved"], 3)
            if a["hits"] == 0:
                a["usd_saved"] = 0.0
        return {"dir": str(cache_dir) if cache_dir is not None else None,
                "hits": sum(a["hits"] for a in agents.values()), "misses": sum(a["misses"] for a in agents.values()),
                "agents": dict(sorted(agents.items()))}
