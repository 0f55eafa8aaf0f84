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

``GET /health`` answers ``{"status": "ok", "kind", "n_passages", ...}``.

The server binds 127.0.0.1 unless told otherwise (the reference binds all interfaces). Searches
run one at a time in a worker thread (each search is itself batched and may use several threads).

Run it with ``drmas-bench retrieval serve --index DIR`` or ``python -m drmas_retrieval.server``.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from drmas_retrieval.base import Retriever

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def create_app(retriever: Retriever, default_topk: int = 3, max_topk: int = 1000, max_queries: int = 4096) -> Any:
    """A FastAPI app serving ``retriever``.

    Options: ``default_topk`` when a body has no ``topk`` (default 3); ``max_topk`` and
    ``max_queries`` per request (larger values get 422)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, model_validator

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
            if self.queries is not None and len(self.queries) > max_queries:
                raise ValueError(f"at most {max_queries} queries per request")
            return self

    app = FastAPI(title="drmas-bench retrieval", version="1")
    lock = threading.Lock()

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

    def retrieve(req):  # annotated below: the model is local, so a string annotation would not resolve
        queries = [req.query] if req.query is not None else list(req.queries or [])
        k = req.topk or default_topk
        if not queries:
            return {"result": []}
        with lock:
            hits = retriever.search(queries, k)
        return {"result": [[h.to_reference(req.return_scores) for h in row] for row in hits]}

    retrieve.__annotations__ = {"req": RetrieveRequest}
    health.__annotations__ = {}
    app.add_api_route("/health", health, methods=["GET"], response_model=None)
    app.add_api_route("/retrieve", retrieve, methods=["POST"], response_model=None)
    return app


def serve(retriever: Retriever, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, default_topk: int = 3,
          log_level: str = "info") -> None:
    """Serve ``retriever`` until interrupted. Options: ``host`` (default 127.0.0.1: this machine only;
    0.0.0.0 exposes it to the network), ``port`` (default 8000), ``default_topk``, ``log_level``."""
    import uvicorn

    uvicorn.run(create_app(retriever, default_topk=default_topk), host=host, port=port, log_level=log_level)


def main(argv: list[str] | None = None) -> int:
    """``python -m drmas_retrieval.server --index SPEC [--host] [--port] [--topk]``."""
    from drmas_retrieval.loader import load_retriever

    ap = argparse.ArgumentParser(prog="python -m drmas_retrieval.server", description="Serve an index on POST /retrieve.")
    ap.add_argument("--index", required=True, help="index directory or kind:DIR (bm25:, dense:, lucene:)")
    ap.add_argument("--host", default=DEFAULT_HOST, help=f"interface to bind (default {DEFAULT_HOST})")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    ap.add_argument("--topk", type=int, default=3, help="topk when a request has none (default 3)")
    ap.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    a = ap.parse_args(argv)
    serve(load_retriever(a.index), a.host, a.port, a.topk, a.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
