"""``HTTPRetriever``: the ``Retriever`` interface over a ``/retrieve`` server (ours or the reference's).

Two request bodies exist (REFERENCE.md §4): the reference server accepts only the single-query
``{"query": q, "topk": k, "return_scores": true}``; Search-R1's variant (and ours) takes
``{"queries": [...], ...}``. With ``body="auto"`` (the default) the client works unchanged against
both: its first request sends the batched body; when the server rejects it (HTTP 400, 404, 405,
415 or 422, or a 200 answer without one result list per query) it asks again with the single-query
body for the first query, and when that works it remembers "one request per query" for this
server. Every later search uses the remembered body. ``body="queries"`` / ``"query"`` fix it.

Every request has a connect and a read timeout; connection failures, timeouts, HTTP 429 and 5xx are
retried with jittered exponential backoff, honouring ``Retry-After`` (``drmas_retrieval.retry``, the
project's one retry policy, shared with the OpenAI engine); then it raises one ``RetrievalError`` naming the URL. It never
waits longer than about ``(retries + 1) * timeout + sum of backoffs`` per request, so a dead server
cannot hang a run. Other 4xx answers are the caller's fault and are raised at once with the
server's reason.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from drmas_retrieval.base import Hit, RetrievalError, Retriever, first_line, check_search_args, parse_contents
from drmas_retrieval.retry import RetriesExhausted, RetryPolicy, send_with_retries


def endpoint_urls(url: str) -> tuple[str, str]:
    """(retrieve URL, health URL) from a server address: ``http://host:port`` gets ``/retrieve``;
    a URL with a path is used as the retrieve URL as is, and ``/health`` sits beside it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RetrievalError(f"not an http(s) retrieval server URL: {url!r}")
    path = parts.path.rstrip("/")
    retrieve_path = path if path else "/retrieve"
    base = retrieve_path.rsplit("/", 1)[0]
    mk = lambda p: urlunsplit((parts.scheme, parts.netloc, p, "", ""))  # noqa: E731
    return mk(retrieve_path), mk(base + "/health")


def hit_from_reference(item: Any, where: str) -> Hit:
    """One element of a ``result`` inner list -> Hit. Accepts ``{"document": doc, "score": s}`` and a
    bare document; a document has an ``id`` and ``contents`` (``"Title"\\ntext``) or ``title`` +
    ``text``; anything else is a ``RetrievalError`` naming the server."""
    if not isinstance(item, dict):
        raise RetrievalError(f"{where}: unexpected hit {str(item)[:80]!r}")
    doc, score = (item["document"], item.get("score", 0.0)) if "document" in item else (item, item.get("score", 0.0))
    if not isinstance(doc, dict):
        raise RetrievalError(f"{where}: unexpected document {str(doc)[:80]!r}")
    # a document without an id or without any text would reach the prompt as `Doc 1: ""`: refused
    doc_id = doc.get("id")
    if doc_id is None or isinstance(doc_id, (dict, list)) or str(doc_id) == "":
        raise RetrievalError(f"{where}: a document without an id: {str(doc)[:120]!r}")
    if isinstance(doc.get("contents"), str):
        title, text = parse_contents(doc["contents"])
    elif "contents" not in doc and isinstance(doc.get("text"), str):
        title, text = str(doc.get("title", "")), doc["text"]
    else:
        raise RetrievalError(f"{where}: document {str(doc_id)[:40]!r} has no text (a `contents` string, or "
                             f"`title` + `text`): {str(doc)[:120]!r}")
    return Hit(str(doc_id), title, text, float(score or 0.0))


BODIES = ("auto", "queries", "query")
# answers to the batched body that mean "this server does not take it" (pydantic's 422, a plain 400,
# no such route or method, wrong media type)
_REJECTED = (400, 404, 405, 415, 422)


class _Rejected(RetrievalError):
    """The server refused the request body (an HTTP status in _REJECTED)."""


class _BadShape(RetrievalError):
    """A 200 answer that is not ``{"result": [[...]] x n}``."""


class HTTPRetriever(Retriever):
    """Search through a /retrieve server.

    Options:
      ``url``              server address, e.g. ``http://127.0.0.1:8000`` (``/retrieve`` is added).
      ``timeout``          seconds to wait for an answer (read timeout, default 30).
      ``connect_timeout``  seconds to wait for a connection (default 5).
      ``retries``          extra attempts after a failure (default 3).
      ``backoff``          first wait between attempts in seconds, doubled each time (default 0.5).
      ``max_backoff``      cap of one wait (default 8).
      ``batch_size``       queries per request with the batched body (default 64).
      ``body``             "auto" (default: batched, falling back to one request per query when
                           the server rejects the batched body; see the module docstring),
                           "queries" (always batched, Search-R1's body) or "query" (always one
                           request per query: the reference server's single-query body).
    The body chosen by "auto" is in ``info()["body"]`` once the first search has run.
    """

    kind = "http"

    def __init__(self, url: str, timeout: float = 30.0, connect_timeout: float = 5.0, retries: int = 3,
                 backoff: float = 0.5, max_backoff: float = 8.0, batch_size: int = 64, body: str = "auto"):
        import httpx

        if body not in BODIES:
            raise RetrievalError(f"body must be one of {', '.join(BODIES)}, got {body!r}")
        if retries < 0 or batch_size < 1:
            raise RetrievalError("retries must be >= 0 and batch_size >= 1")
        self.url, self.health_url = endpoint_urls(url)
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.retry_policy = RetryPolicy(retries=retries, backoff_s=backoff, backoff_max_s=max_backoff)
        self.batch_size, self.body = batch_size, body
        self._chosen: str | None = None if body == "auto" else body  # "auto": decided by the first search
        self._client = httpx.Client(timeout=httpx.Timeout(timeout, connect=connect_timeout))

    def _post(self, payload: dict[str, Any]) -> Any:
        try:
            r = send_with_retries(lambda: self._client.post(self.url, json=payload), self.retry_policy)
        except RetriesExhausted as e:
            raise RetrievalError(f"retrieval server {self.url} failed after {e.attempts} attempt(s): {e.reason}") from None
        if r.status_code >= 400:
            kind = _Rejected if r.status_code in _REJECTED else RetrievalError
            raise kind(f"retrieval server {self.url} rejected the request: HTTP {r.status_code} {r.text[:300]}")
        try:
            return r.json()
        except ValueError:
            raise RetrievalError(f"retrieval server {self.url} answered with non-JSON: {r.text[:200]!r}") from None

    def _results(self, data: Any, n: int) -> list[list[Hit]]:
        res = data.get("result") if isinstance(data, dict) else None
        if not isinstance(res, list) or len(res) != n or not all(isinstance(x, list) for x in res):
            raise _BadShape(f"retrieval server {self.url}: expected {{'result': [[...]] x {n}}}, got {str(data)[:200]!r}")
        return [[hit_from_reference(item, self.url) for item in inner] for inner in res]

    def _search_single(self, queries: list[str], k: int) -> list[list[Hit]]:
        out: list[list[Hit]] = []
        for q in queries:
            out.extend(self._results(self._post({"query": q, "topk": k, "return_scores": True}), 1))
        return out

    def _search_batched(self, queries: list[str], k: int) -> list[list[Hit]]:
        out: list[list[Hit]] = []
        for a in range(0, len(queries), self.batch_size):
            batch = list(queries[a:a + self.batch_size])
            out.extend(self._results(self._post({"queries": batch, "topk": k, "return_scores": True}), len(batch)))
        return out

    def _detect(self, queries: list[str], k: int) -> list[list[Hit]]:
        """First search with body "auto": batched; on a rejection, single-query; remember which."""
        try:
            first = self._search_batched(queries[:1], k)
            self._chosen = "queries"
            return first + self._search_batched(queries[1:], k) if len(queries) > 1 else first
        except (_Rejected, _BadShape) as batched_error:
            try:
                first = self._search_single(queries[:1], k)
            except RetrievalError as single_error:
                raise RetrievalError(f"retrieval server {self.url} refused both request bodies: batched {{'queries'}}: "
                                     f"{first_line(batched_error)}; single {{'query'}}: {first_line(single_error)}") from None
            self._chosen = "query"
            return first + self._search_single(queries[1:], k)

    def search(self, queries: list[str], k: int = 3) -> list[list[Hit]]:
        check_search_args(queries, k)
        queries = list(queries)
        if not queries:
            return []
        if self._chosen is None:
            return self._detect(queries, k)
        if self._chosen == "query":
            return self._search_single(queries, k)
        return self._search_batched(queries, k)

    def health(self) -> dict[str, Any]:
        """``GET /health`` once (no retries); RetrievalError naming the URL when unreachable."""
        import httpx

        try:
            r = self._client.get(self.health_url)
            r.raise_for_status()
            return r.json()
        except (httpx.HTTPError, ValueError) as e:
            raise RetrievalError(f"retrieval server {self.health_url} is not healthy: {type(e).__name__}: {first_line(e)}") from None

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "body": self._chosen or self.body}

    def close(self) -> None:
        self._client.close()
