"""The ``openai`` engine's HTTP client: one ``aiohttp`` session per event loop, its connection
pool as large as the engine's concurrency, keep-alive, a per-attempt timeout.

aiohttp parses HTTP in C and does little per request; the engine's cost per call is then its own
work (the body, the reply's checks), which ``scripts/bench_openai.py`` measures against a raw
aiohttp client. A reply is read whole into a :class:`Reply` (status, headers, text, JSON parsed
once however often it is asked for). A request that gets no answer (refused or dropped
connection, timeout) is a :class:`drmas_retrieval.retry.TransportFailure`, which the project's
retry policy retries.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any, AsyncGenerator
from urllib.parse import urlsplit

import aiohttp

from drmas_retrieval.retry import TransportFailure

_UNREAD = object()


class Reply:
    """One HTTP answer, read whole: ``status_code``, ``headers`` (case-insensitive), ``text``,
    ``json()`` (parsed on first use and kept; a body that is not JSON raises ``ValueError``)."""

    __slots__ = ("status_code", "headers", "content", "_text", "_json")

    def __init__(self, status_code: int, headers: Any, content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content
        self._text: str | None = None
        self._json: Any = _UNREAD

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self.content.decode("utf-8", errors="replace")
        return self._text

    def json(self) -> Any:
        if self._json is _UNREAD:
            self._json = json.loads(self.content)  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return self._json


def _failure(exc: BaseException) -> TransportFailure:
    """An aiohttp / asyncio failure as the retry policy's TransportFailure (one line)."""
    detail = " ".join(str(exc).split())
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return TransportFailure(type(exc).__name__, detail, timeout=True)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return TransportFailure("ConnectError", detail)
    return TransportFailure(type(exc).__name__, detail)


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTP_PROXY`` / ``HTTPS_PROXY``, unless
    ``NO_PROXY`` covers its host), looked up once per client rather than on every request."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not proxies or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxies.get(parts.scheme)


class HttpClient:
    """An aiohttp session bound to the running event loop (made with ``await HttpClient.open(...)``).

    ``max_connections``: the pool's size; ``timeout_s``: the whole of one attempt (connect, send,
    wait for and read the answer); ``headers``: sent with every request (``Authorization``);
    ``base_url``: the server, whose proxy (``HTTP(S)_PROXY`` / ``NO_PROXY``) is looked up once. The
    session closes with its loop: ``asyncio.run`` ends by closing the loop's async generators, and
    one of them (``_closer``) closes the session, so a caller that runs one loop per call leaves no
    sockets open."""

    def __init__(self, max_connections: int, timeout_s: float, headers: dict[str, str], base_url: str) -> None:
        connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=max_connections, ttl_dns_cache=300)
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.loop = asyncio.get_running_loop()
        self.session = aiohttp.ClientSession(connector=connector, headers=headers, timeout=self.timeout,
                                             proxy=env_proxy(base_url))
        self._guard = self._closer()

    @classmethod
    async def open(cls, max_connections: int, timeout_s: float, headers: dict[str, str], base_url: str) -> "HttpClient":
        client = cls(max_connections, timeout_s, headers, base_url)
        await client._guard.__anext__()  # now the loop knows it and closes it at its end
        return client

    async def _closer(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await self.session.close()

    async def request(self, method: str, url: str, body: Any = None, timeout_s: float | None = None) -> Reply:
        """One attempt: the answer read whole, or a TransportFailure."""
        try:
            if timeout_s is None:  # the session's timeout
                async with self.session.request(method, url, json=body) as resp:
                    return Reply(resp.status, resp.headers, await resp.read())
            async with self.session.request(method, url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                return Reply(resp.status, resp.headers, await resp.read())
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise _failure(exc) from None

    async def post(self, url: str, body: Any) -> Reply:
        return await self.request("POST", url, body)

    async def get(self, url: str, timeout_s: float | None = None) -> Reply:
        return await self.request("GET", url, None, timeout_s)

    async def close(self) -> None:
        await self._guard.aclose()  # runs _closer's finally: the session closes
