"""The HTTP retriever client works unchanged against both server kinds.

Two real FastAPI servers under uvicorn on 127.0.0.1 (free ports), both over the same real BM25
index of tests/data/retrieval_corpus.jsonl:

- a reference-style server written here that accepts ONLY the single-query body
  `{"query", "topk", "return_scores"}` (pydantic answers 422 to `{"queries": [...]}`) and answers
  `{"result": [[{"document": {"id", "contents"}, "score"}]]}`;
- the project's own server (`drmas_retrieval.server.create_app`), which takes both bodies.

The client (default body "auto") must give the in-process retriever's hits from both, from the
`--retriever http://...` spec (`load_retriever`), remember its choice per server, and the eval-time
probe (`search(["probe"], 1)`) must pass against both.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Optional

import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from drmas_retrieval import RetrievalError, load_retriever
from drmas_retrieval.bm25 import build_bm25
from drmas_retrieval.client import HTTPRetriever

DATA = Path(__file__).parent / "data"
CORPUS = DATA / "retrieval_corpus.jsonl"
QUERIES = ["Who designed the Amber Lighthouse?", "carnivorous plants with sticky droplets",
           "When did the railway viaduct open?", "zzzz nothing matches", ""]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class QueryRequest(BaseModel):
    """The reference server's body: one query (extra keys such as `queries` are ignored, so a
    batched body lacks `query` and gets 422)."""

    query: str
    topk: Optional[int] = None
    return_scores: bool = False


def single_query_app(retriever, log: list) -> FastAPI:
    """A reference-style /retrieve: `{"query", "topk", "return_scores"}` only (written for this test)."""
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(req: QueryRequest):
        log.append(req.query)
        hits = retriever.search([req.query], req.topk or 3)[0]
        docs = [{"id": h.id, "contents": h.contents} for h in hits]
        if req.return_scores:
            return {"result": [[{"document": d, "score": h.score} for d, h in zip(docs, hits)]]}
        return {"result": [docs]}

    return app


class Served:
    """An ASGI app under a real uvicorn server on 127.0.0.1 in a background thread."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "Served":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "bm25"
    build_bm25(CORPUS, out, progress=False)
    return load_retriever(out)


@pytest.fixture(scope="module")
def reference_server(local):
    log: list[str] = []
    with Served(single_query_app(local, log)) as s:
        s.log = log
        yield s


@pytest.fixture(scope="module")
def own_server(local):
    from drmas_retrieval.server import create_app

    with Served(create_app(local)) as s:
        yield s


def test_single_query_server_rejects_the_batched_body(reference_server):
    import httpx

    r = httpx.post(reference_server.url + "/retrieve", json={"queries": ["a"], "topk": 3, "return_scores": True})
    assert r.status_code == 422  # so a batched-only client could not work against it


def test_auto_client_against_single_query_server(local, reference_server):
    want = local.search(QUERIES, 3)
    reference_server.log.clear()
    with HTTPRetriever(reference_server.url, batch_size=2) as client:
        assert client.search(QUERIES, 3) == want
        assert client.info()["body"] == "query"
        assert reference_server.log == QUERIES  # one request per query, the empty one included
        assert client.search(QUERIES[:2], 2) == [row[:2] for row in want[:2]]  # the choice is remembered
    # the --retriever http://... spec, and the eval-time probe, work unchanged
    r = load_retriever(reference_server.url)
    assert r.search(["probe"], 1)[0] == local.search(["probe"], 1)[0]
    assert r.search(QUERIES[:3], 3) == want[:3]


def test_auto_client_against_own_server_stays_batched(local, own_server):
    want = local.search(QUERIES, 3)
    with HTTPRetriever(own_server.url, batch_size=2) as client:
        assert client.search(QUERIES, 3) == want
        assert client.info()["body"] == "queries"
    r = load_retriever(own_server.url)
    assert r.search(["probe"], 1) == local.search(["probe"], 1)


def test_fixed_bodies(local, reference_server, own_server):
    want = local.search(QUERIES[:2], 3)
    with HTTPRetriever(own_server.url, body="query") as c:
        assert c.search(QUERIES[:2], 3) == want
    with HTTPRetriever(reference_server.url, body="queries") as c:
        with pytest.raises(RetrievalError, match="HTTP 422"):
            c.search(QUERIES[:2], 3)
    with pytest.raises(RetrievalError, match="body must be one of auto, queries, query"):
        HTTPRetriever(own_server.url, body="batch")


def test_a_bad_request_fails_at_once_with_both_reasons(own_server):
    with HTTPRetriever(own_server.url, retries=5, backoff=5.0) as client:
        t0 = time.monotonic()
        with pytest.raises(RetrievalError, match="refused both request bodies.*HTTP 422.*HTTP 422"):
            client.search(["a"], 100000)
        assert time.monotonic() - t0 < 3
