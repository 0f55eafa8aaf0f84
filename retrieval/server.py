"""The ``/retrieve`` HTTP server (FastAPI + uvicorn) over any in-process retriever.

``POST /retrieve`` accepts both reference bodies:

* ``{"query": "...", "topk": 3, "return_scores": true}``            (one query)
* ``{"queries": ["...", "..."], "topk": 3, "return_scores": true}``  (Search-R1's batch body)

and answers ``{"result": [[hit, ...], ...]}``, one inner list per query (a single ``query`` gets a
list holding one list). With ``return_scores: true`` a hit is
``{"document": {"id", "contents"}, "score": float}`` where ``contents`` = ``"Title"\\ntext``;
without it (the default, as in the reference) a hit is the bare document ``{"id", "contents"}``.
``topk`` defaults to the server's ``default_topk`` (3, the reference's). A body that is not JSON,
has unknown keys, both or neither of ``query`` / ``queries``, a non-string query, or a ``topk``
outside 1..``max_topk`` gets HTTP 422 with ``{"detail": reason, "errors": [...]}``.

Size limits (:class:`Limits`; HTTP 413 with ``{"detail": reason}`` naming the limit and its flag):
the request body (default 1 MiB), the characters of one query (default 4,096) and the queries of
one request (default 256). Without them one 10 MB query held the server for about 7 s.

Fairness: a request's queries are searched in pieces (at most ``piece_queries`` queries and
``piece_chars`` characters each), one piece at a time in a worker thread, and waiting requests take
turns piece by piece in arrival order (a FIFO ``asyncio.Lock``). The event loop never searches, so
a small request waits for at most one piece of a big one instead of all of it.

``GET /health`` answers ``{"status": "ok", "kind", "n_passages", ...}``.

The server binds 127.0.0.1 unless told otherwise (the reference binds all interfaces).

Run it with ``drmas-bench retrieval serve --index DIR`` or ``python -m drmas_retrieval.server``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from drmas_retrieval.base import Retriever

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server.

    ``max_body_bytes``   request body size (default 1 MiB); more: 413.
    ``max_query_chars``  characters of one query (default 4,096); more: 413.
    ``max_batch``        queries in one request (default 256); more: 413.
    ``max_topk``         largest ``topk`` (default 1,000); more: 422, like any invalid field.
    ``piece_queries``, ``piece_chars``  a request is searched in pieces of at most this many queries
                         (default 16) and characters (default 16,384); requests take turns per piece.
    """

    max_body_bytes: int = 1 << 20
    max_query_chars: int = 4096
    max_batch: int = 256
    max_topk: int = 1000
    piece_queries: int = 16
    piece_chars: int = 16_384

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_query_chars", "max_batch", "max_topk", "piece_queries", "piece_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{LIMIT_FLAGS.get(name, name)} must be at least 1, got {getattr(self, name)}")


#: the command-line flag of each limit (named in the 413 reasons)
LIMIT_FLAGS = {"max_body_bytes": "--max-body-bytes", "max_query_chars": "--max-query-chars", "max_batch": "--max-batch"}


def split_pieces(queries: list[str], max_queries: int, max_chars: int) -> list[list[str]]:
    """Consecutive pieces of ``queries``, each at most ``max_queries`` long and ``max_chars``
    characters in total (a single longer query is a piece of its own)."""
    pieces: list[list[str]] = []
    cur: list[str] = []
    chars = 0
    for q in queries:
        if cur and (len(cur) >= max_queries or chars + len(q) > max_chars):
            pieces.append(cur)
            cur, chars = [], 0
        cur.append(q)
        chars += len(q)
    if cur:
        pieces.append(cur)
    return pieces


def too_large_reason(queries: list[str], limits: Limits) -> str | None:
    """Why a request's queries exceed ``limits`` (None when they do not)."""
    if len(queries) > limits.max_batch:
        return (f"{len(queries)} queries in one request; the limit is {limits.max_batch} "
                f"({LIMIT_FLAGS['max_batch']}): send them in smaller batches")
    for i, q in enumerate(queries):
        if len(q) > limits.max_query_chars:
            return (f"query {i} has {len(q)} characters; the limit is {limits.max_query_chars} "
                    f"({LIMIT_FLAGS['max_query_chars']})")
    return None


class BodyLimit:
    """ASGI middleware: reads a request body up to ``limit`` bytes before the app sees it; a longer
    body (declared or sent) gets 413 with a JSON reason. A body up to ``drain`` bytes is read to its
    end first, so that an ordinary client (which sends the whole body before reading) sees the
    answer; beyond that the connection is answered and closed at once."""

    def __init__(self, app: Any, limit: int, drain: int = 64 << 20) -> None:
        self.app, self.limit, self.drain = app, limit, max(drain, limit)

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        size = int(declared) if declared is not None and declared.isdigit() else None
        if size is not None and size > self.drain:
            await self._reject(send, size)
            return
        body, seen, more = bytearray(), 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away
                return
            chunk = msg.get("body", b"")
            seen += len(chunk)
            if seen <= self.limit:
                body += chunk
            elif seen > self.drain:
                break
            more = msg.get("more_body", False)
        if seen > self.limit:
            await self._reject(send, size if size is not None else seen)
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send: Callable[[dict], Awaitable[None]], size: int) -> None:
        reason = (f"request body of {size} bytes exceeds the limit of {self.limit} bytes "
                  f"({LIMIT_FLAGS['max_body_bytes']})")
        payload = json.dumps({"detail": reason}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


def create_app(retriever: Retriever, default_topk: int = 3, limits: Limits | None = None) -> Any:
    """A FastAPI app serving ``retriever``.

    Options: ``default_topk`` when a body has no ``topk`` (default 3); ``limits`` (:class:`Limits`:
    body size, query length, queries per request, topk, and the piece size of the fair schedule)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, model_validator

    lim = limits or Limits()
    max_topk = lim.max_topk

    class RetrieveRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")

        query: StrictStr | None = None
        queries: list[StrictStr] | None = None
        topk: StrictInt | None = None
        return_scores: StrictBool = False

        @model_validator(mode="after")
        def _one_form(self) -> "RetrieveRequest":
            if (self.query is None) == (self.queries is None):
                raise ValueError("give exactly one of 'query' (a string) or 'queries' (a list of strings)")
            if self.topk is not None and not 1 <= self.topk <= max_topk:
                raise ValueError(f"topk must be between 1 and {max_topk}")
            return self

    app = FastAPI(title="drmas-bench retrieval", version="1")
    app.add_middleware(BodyLimit, limit=lim.max_body_bytes)
    turn = asyncio.Lock()  # one piece searches at a time; waiters are served in arrival order

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        parts = []
        for e in errors:
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            parts.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
        return JSONResponse(status_code=422, content={"detail": "; ".join(parts) or "invalid request body",
                                                      "errors": [{"loc": list(e.get("loc", ())), "msg": e.get("msg"),
                                                                  "type": e.get("type")} for e in errors]})

    def health() -> dict[str, Any]:
        return {"status": "ok", **retriever.info()}

    async def retrieve(req):  # annotated below: the model is local, so a string annotation would not resolve
        queries = [req.query] if req.query is not None else list(req.queries or [])
        k = req.topk or default_topk
        reason = too_large_reason(queries, lim)
        if reason:
            return JSONResponse(status_code=413, content={"detail": reason})
        hits = []
        for piece in split_pieces(queries, lim.piece_queries, lim.piece_chars):
            async with turn:
                hits += await asyncio.to_thread(retriever.search, piece, k)
        return {"result": [[h.to_reference(req.return_scores) for h in row] for row in hits]}

    retrieve.__annotations__ = {"req": RetrieveRequest}
    health.__annotations__ = {}
    app.add_api_route("/health", health, methods=["GET"], response_model=None)
    app.add_api_route("/retrieve", retrieve, methods=["POST"], response_model=None)
    return app


def serve(retriever: Retriever, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, default_topk: int = 3,
          log_level: str = "info", limits: Limits | None = None) -> int | None:
    """Serve ``retriever`` until a stop signal. Options: ``host`` (default 127.0.0.1: this machine
    only; 0.0.0.0 exposes it to the network), ``port`` (default 8000), ``default_topk``,
    ``log_level``, ``limits`` (:class:`Limits`).

    SIGTERM or SIGINT shuts the server down gracefully (the requests in flight are answered, the
    port is released) and ``serve`` returns that signal's number (None when it ended otherwise).
    uvicorn raises the caught signal again once it has shut down; under an asyncio SIGINT handler
    that can surface as ``KeyboardInterrupt`` after the shutdown, which is the same clean stop."""
    import uvicorn

    class _Server(uvicorn.Server):
        stop_signal: int | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.stop_signal is None:
                self.stop_signal = sig
            super().handle_exit(sig, frame)

    config = uvicorn.Config(create_app(retriever, default_topk=default_topk, limits=limits), host=host, port=port,
                            log_level=log_level)
    server = _Server(config)
    try:
        server.run()
    except KeyboardInterrupt:
        if server.stop_signal is None:  # not a stop uvicorn handled: the caller's to report
            raise
    return server.stop_signal


def add_limit_arguments(ap: argparse.ArgumentParser) -> None:
    """The ``--max-body-bytes / --max-query-chars / --max-batch`` flags (shared with the CLI)."""
    d = Limits()
    ap.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                    help=f"largest request body in bytes; more gets HTTP 413 (default {d.max_body_bytes})")
    ap.add_argument("--max-query-chars", type=int, default=d.max_query_chars,
                    help=f"longest query in characters; more gets HTTP 413 (default {d.max_query_chars})")
    ap.add_argument("--max-batch", type=int, default=d.max_batch,
                    help=f"most queries per request; more gets HTTP 413 (default {d.max_batch})")


def limits_from_args(a: argparse.Namespace) -> Limits:
    """:class:`Limits` from the flags of :func:`add_limit_arguments` (ValueError names a bad one)."""
    return Limits(max_body_bytes=a.max_body_bytes, max_query_chars=a.max_query_chars, max_batch=a.max_batch)


def main(argv: list[str] | None = None) -> int:
    """``python -m drmas_retrieval.server --index SPEC [--host] [--port] [--topk] [limits]``."""
    from drmas_retrieval.loader import load_retriever

    ap = argparse.ArgumentParser(prog="python -m drmas_retrieval.server", description="Serve an index on POST /retrieve.")
    ap.add_argument("--index", required=True, help="index directory or kind:DIR (bm25:, dense:, lucene:)")
    ap.add_argument("--host", default=DEFAULT_HOST, help=f"interface to bind (default {DEFAULT_HOST})")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    ap.add_argument("--topk", type=int, default=3, help="topk when a request has none (default 3)")
    ap.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    add_limit_arguments(ap)
    a = ap.parse_args(argv)
    try:
        limits = limits_from_args(a)
    except ValueError as e:
        ap.error(str(e))
    serve(load_retriever(a.index), a.host, a.port, a.topk, a.log_level, limits)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
