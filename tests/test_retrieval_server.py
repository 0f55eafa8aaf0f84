"""The /retrieve server (real uvicorn in a subprocess) and the HTTP client: both body forms, identical
hits to the in-process retriever, 422 on malformed bodies, 413 beyond the size limits, a big request
that does not starve small ones, and a clear error (no hang) when the server dies or stops answering."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from drmas_retrieval import RetrievalError, load_retriever
from drmas_retrieval.bm25 import build_bm25
from drmas_retrieval.client import HTTPRetriever, endpoint_urls

DATA = Path(__file__).parent / "data"
CORPUS = DATA / "retrieval_corpus.jsonl"
QUERIES = ["Who designed the Amber Lighthouse?", "carnivorous plants with sticky droplets",
           "When did the railway viaduct open?", "zzzz nothing matches"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(index: Path, port: int) -> subprocess.Popen:
    log = tempfile.TemporaryFile()  # not a pipe: a chatty server can never block on a full pipe
    proc = subprocess.Popen([sys.executable, "-m", "drmas_retrieval.server", "--index", str(index),
                             "--port", str(port), "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"server exited: {log.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not come up within 60 s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("srv") / "bm25"
    build_bm25(CORPUS, out, progress=False)
    return out


@pytest.fixture(scope="module")
def server(index):
    port = free_port()
    proc = start_server(index, port)
    yield f"http://127.0.0.1:{port}"
    stop(proc)


def test_both_bodies_and_client_match_in_process(index, server):
    local = load_retriever(index).search(QUERIES, 3)
    expected = [[{"document": {"id": h.id, "contents": h.contents}, "score": h.score} for h in row] for row in local]

    r = httpx.post(server + "/retrieve", json={"queries": QUERIES, "topk": 3, "return_scores": True})
    assert r.status_code == 200
    got = r.json()["result"]
    assert got == expected  # same ids, contents and (JSON round-tripped, exact) scores

    for q, exp in zip(QUERIES, expected):
        r = httpx.post(server + "/retrieve", json={"query": q, "topk": 3, "return_scores": True})
        assert r.status_code == 200 and len(r.json()["result"]) == 1
        assert [d["document"] for d in r.json()["result"][0]] == [d["document"] for d in exp]

    # without return_scores the reference answers bare documents; topk defaults to 3
    r = httpx.post(server + "/retrieve", json={"queries": QUERIES[:1]})
    assert r.json()["result"] == [[d["document"] for d in expected[0]]]
    assert httpx.post(server + "/retrieve", json={"queries": []}).json() == {"result": []}

    with HTTPRetriever(server, batch_size=2) as client:
        assert client.search(QUERIES, 3) == local  # two batches; scores survive the JSON round trip
        assert client.health()["kind"] == "bm25" and client.health()["n_passages"] == 24
    with HTTPRetriever(server + "/retrieve", body="query") as client:
        assert client.search(QUERIES, 3) == local
    assert load_retriever(server).search(QUERIES[:2], 2) == [row[:2] for row in local[:2]]


@pytest.mark.parametrize("body", [
    b'{"queries": ["a"], "topk": 3',              # not JSON
    b'["a", "b"]',                                 # not an object
    b'{"topk": 3}',                                # neither query nor queries
    b'{"query": "a", "queries": ["b"]}',           # both
    b'{"queries": "a single string"}',
    b'{"queries": ["ok", 5]}',
    b'{"query": "a", "topk": 0}',
    b'{"query": "a", "topk": "3"}',
    b'{"query": "a", "topk": 100000}',
    b'{"query": "a", "return_scores": "yes"}',
    b'{"query": "a", "unknown_key": 1}',
])
def test_malformed_bodies_get_422_with_a_reason(server, body):
    r = httpx.post(server + "/retrieve", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert isinstance(r.json()["detail"], str) and r.json()["detail"]


def test_client_rejects_4xx_at_once(server):
    with HTTPRetriever(server, retries=5, backoff=5.0) as client:
        t0 = time.monotonic()
        with pytest.raises(RetrievalError, match="rejected the request: HTTP 422"):
            client.search(["a"], 100000)
        assert time.monotonic() - t0 < 3  # no retries, no backoff


def test_killed_server_gives_one_clear_error_not_a_hang(index):
    port = free_port()
    proc = start_server(index, port)
    url = f"http://127.0.0.1:{port}"
    client = HTTPRetriever(url, timeout=2, connect_timeout=1, retries=2, backoff=0.05)
    try:
        assert client.search(QUERIES[:1], 2)[0][0].id in {"p0", "p2"}
        stop(proc)  # SIGKILL mid-run
        t0 = time.monotonic()
        with pytest.raises(RetrievalError) as e:
            client.search(QUERIES, 2)
        assert time.monotonic() - t0 < 8
        msg = str(e.value)
        assert f"{url}/retrieve" in msg and "after 3 attempt(s)" in msg and "\n" not in msg
        with pytest.raises(RetrievalError, match="not healthy"):
            client.health()
    finally:
        client.close()
        stop(proc)


def test_silent_server_times_out(tmp_path):
    # a socket that accepts connections but never answers: the read timeout must fire
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        client = HTTPRetriever(url, timeout=0.3, connect_timeout=0.3, retries=1, backoff=0.01)
        t0 = time.monotonic()
        with pytest.raises(RetrievalError, match=r"failed after 2 attempt\(s\): timeout"):
            client.search(["anything"], 3)
        assert time.monotonic() - t0 < 5
        client.close()


def test_endpoint_urls():
    assert endpoint_urls("http://h:1") == ("http://h:1/retrieve", "http://h:1/health")
    assert endpoint_urls("http://h:1/retrieve") == ("http://h:1/retrieve", "http://h:1/health")
    assert endpoint_urls("https://h/api/retrieve/") == ("https://h/api/retrieve", "https://h/api/health")
    with pytest.raises(RetrievalError, match="not an http"):
        endpoint_urls("ftp://h")


def test_server_binds_loopback_by_default():
    from drmas_retrieval.server import DEFAULT_HOST

    assert DEFAULT_HOST == "127.0.0.1"
    from drmas_bench.cli import build_parser

    args = build_parser().parse_args(["retrieval", "serve", "--index", "x"])
    assert args.host == "127.0.0.1" and args.port == 8000



# ------------------------------------------------------------------------------- size limits, fairness

def _post(server: str, body: bytes | dict):
    if isinstance(body, dict):
        return httpx.post(server + "/retrieve", json=body, timeout=60)
    return httpx.post(server + "/retrieve", content=body, headers={"content-type": "application/json"}, timeout=60)


def test_size_limits_get_413_with_the_reason(server):
    from drmas_retrieval.server import Limits

    lim = Limits()  # the server runs with the defaults
    long_q = "x" * (lim.max_query_chars + 1)
    cases = [
        ({"query": long_q}, "--max-query-chars"),
        ({"queries": ["ok", long_q]}, "query 1 has"),
        ({"queries": ["q"] * (lim.max_batch + 1)}, "--max-batch"),
        (b'{"query": "' + b"a" * lim.max_body_bytes + b'"}', "--max-body-bytes"),  # declared length too big
    ]
    for body, needle in cases:
        r = _post(server, body)
        assert r.status_code == 413, (needle, r.status_code, r.text[:200])
        assert needle in r.json()["detail"]
    # a chunked body (no content-length) is counted as it arrives
    chunks = (b'{"query": "' + b"a" * 65536 if i == 0 else b"a" * 65536 for i in range(lim.max_body_bytes // 65536 + 2))
    r = httpx.post(server + "/retrieve", content=chunks, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["detail"]
    # at the limits everything is served, both body forms
    assert _post(server, {"query": "y" * lim.max_query_chars}).status_code == 200
    r = _post(server, {"queries": [QUERIES[0]] * lim.max_batch, "topk": 1})
    assert r.status_code == 200 and len(r.json()["result"]) == lim.max_batch
    with HTTPRetriever(server, retries=3, backoff=5.0) as client, pytest.raises(RetrievalError, match="HTTP 413"):
        client.search([long_q], 3)  # rejected at once, no retries


def test_a_big_request_does_not_starve_small_ones(server):
    words = "lighthouse railway viaduct river mountain battle king album film city "
    big = [(words * 60)[i % 7:][:4000] for i in range(250)]  # allowed: ~1 MB, 250 queries of 4,000 chars
    small = {"query": QUERIES[0], "topk": 3}
    _post(server, small)
    done: dict[str, float] = {}

    def send_big() -> None:
        t0 = time.monotonic()
        r = _post(server, {"queries": big, "topk": 3})
        done["big"], done["big_s"] = time.monotonic(), time.monotonic() - t0
        done["big_ok"] = r.status_code == 200 and len(r.json()["result"]) == len(big)

    th = threading.Thread(target=send_big)
    th.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    r = _post(server, small)
    done["small"], small_s = time.monotonic(), time.monotonic() - t0
    th.join(timeout=120)
    assert r.status_code == 200 and done["big_ok"]
    # before: searches ran whole, one at a time, so the small one waited for all of the big one
    assert done["small"] < done["big"], done
    assert small_s < 0.5 * done["big_s"], (small_s, done["big_s"])


def test_split_pieces():
    from drmas_retrieval.server import split_pieces

    qs = ["a" * 5, "b" * 5, "c" * 20, "d", "e", "f"]
    assert split_pieces(qs, max_queries=2, max_chars=12) == [["aaaaa", "bbbbb"], ["c" * 20], ["d", "e"], ["f"]]
    assert split_pieces([], 4, 10) == []
    assert sum(split_pieces(qs, 16, 16_384), []) == qs


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cli_serve_stops_cleanly_on_a_stop_signal(index, sig):
    """`drmas-bench retrieval serve` (the CLI, a real subprocess) with a keep-alive client and a
    request answered: the signal shuts it down gracefully, exit 0, one line naming the signal, no
    traceback, and the port is free again."""
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "drmas_bench", "retrieval", "serve", "--index", str(index),
                             "--port", str(port), "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=5) as client:  # one connection, kept alive across the signal
            while True:
                assert proc.poll() is None and time.monotonic() < deadline, "the server did not come up"
                try:
                    if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            r = client.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": QUERIES[:1], "topk": 1})
            assert r.status_code == 200 and len(r.json()["result"][0]) == 1
            proc.send_signal(sig)
            assert proc.wait(timeout=30) == 0
    finally:
        stop(proc)
    log.seek(0)
    out = log.read().decode()
    assert f"stopped by {sig.name}: the server shut down cleanly" in out and "Traceback" not in out, out
    with socket.socket() as s:  # the listening socket is gone (SO_REUSEADDR: the closed connection's TIME_WAIT is not)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
