"""The one HTTP retry policy of the project, shared by the retrieval client (sync) and the harness's
OpenAI-compatible engine (async). It lives here, the lowest layer, so both can import it
(drmas_retrieval imports nothing of drmas_bench).

What is retried: connection failures and timeouts (``httpx.TransportError``, which includes
``httpx.TimeoutException``, or a :class:`TransportFailure` that a caller on another HTTP client
raises for the same events), HTTP 429 and 5xx. Any other answer (2xx, other 4xx) is returned to the
caller at once: a 4xx is the caller's fault and retrying it cannot help. A response is anything
with ``status_code``, ``text`` and ``headers`` (an ``httpx.Response``, or the engine's own reply).

Waits: ``backoff_s``, ``2 backoff_s``, ``4 backoff_s``, ... capped at ``backoff_max_s``, each
multiplied by a jitter factor in ``[1 - jitter/2, 1 + jitter/2]`` (concurrent callers do not retry
in lockstep); a server's ``Retry-After`` (seconds) lengthens a wait, never beyond ``backoff_max_s``.
A dead server therefore costs at most ``(retries + 1) x timeout + the waits`` per request.

- `RetryPolicy(retries=3, backoff_s=0.5, backoff_max_s=8.0, jitter=0.5)`; ``retries`` = attempts
  after the first (0 = no retry).
- `send_with_retries(send, policy, on_attempt=None, check=None)` / `asend_with_retries(..., first=)`: call
  ``send()`` (returns a response) until it gives a non-retryable answer; raise
  `RetriesExhausted` (``attempts``, ``reason``: the last failure in one line) when every attempt
  failed. ``check(response)`` (optional) looks into a 2xx answer and returns a reason when its body
  is unusable (not JSON, an HTML error page, no choices): such an answer is retried like a 5xx, since
  an overloaded proxy or a restarting server produces them and the next attempt usually works.
  ``final(response)`` (optional) marks a retryable answer (a 5xx) as the server's considered reply
  when it comes twice in a row with the same body: it is returned then, not retried further (a
  server that reports a rejected request field as HTTP 500 answers the same way every time).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable


class TransportFailure(Exception):
    """A request that got no HTTP answer (refused or dropped connection, timeout), raised by a
    ``send()`` built on an HTTP client other than httpx; ``kind`` names the event (``ConnectError``,
    ``ReadTimeout``, ...), ``timeout`` says it was one."""

    def __init__(self, kind: str, detail: str = "", timeout: bool = False):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind, self.detail, self.timeout = kind, detail, timeout


class RetriesExhausted(Exception):
    """Every attempt failed with a retryable error; ``reason`` is the last one, in one line."""

    def __init__(self, attempts: int, reason: str):
        super().__init__(f"failed after {attempts} attempt(s): {reason}")
        self.attempts, self.reason = attempts, reason


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry (see the module docstring)."""

    retries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0 or self.backoff_max_s < 0 or not 0 <= self.jitter <= 1:
            raise ValueError(f"retry policy needs retries >= 0, backoffs >= 0 and 0 <= jitter <= 1, got {self}")

    @property
    def attempts(self) -> int:
        return self.retries + 1

    def wait_s(self, retry: int, retry_after: str | None = None) -> float:
        """The wait before retry number ``retry`` (0 = the first retry)."""
        wait = min(self.backoff_max_s, self.backoff_s * (2**retry))
        wait *= 1 - self.jitter / 2 + self.jitter * random.random()
        if retry_after:
            try:
                wait = max(wait, float(retry_after))
            except ValueError:  # an HTTP date: keep our own wait
                pass
        return min(wait, self.backoff_max_s)


def retryable_status(code: int) -> bool:
    """HTTP 429 (too many requests) and 5xx are worth another attempt; other answers are final."""
    return code == 429 or code >= 500


def _is_response(outcome: Any) -> bool:
    return not isinstance(outcome, BaseException) and hasattr(outcome, "status_code")


def _failure(outcome: Any, check: Callable[[Any], str | None] | None = None) -> tuple[str, str | None] | None:
    """(reason, Retry-After) when ``outcome`` (a response or an exception) is retryable, else None."""
    if _is_response(outcome):
        code = outcome.status_code
        if check is not None and 200 <= code < 300:
            bad = check(outcome)
            if bad:
                return " ".join(str(bad).split())[:300], None
        if retryable_status(code):
            snippet = " ".join(outcome.text.split())[:200]
            return f"HTTP {code}: {snippet}".rstrip(": "), outcome.headers.get("retry-after")
        return None
    if isinstance(outcome, TransportFailure):
        if outcome.timeout:
            return f"timeout ({outcome.kind})", None
        text = next((ln.strip() for ln in outcome.detail.splitlines() if ln.strip()), "")
        return f"{outcome.kind}: {text}".rstrip(": "), None
    import httpx

    if isinstance(outcome, httpx.TimeoutException):
        return f"timeout ({type(outcome).__name__})", None
    if isinstance(outcome, httpx.TransportError):
        text = next((ln.strip() for ln in str(outcome).splitlines() if ln.strip()), "")
        return f"{type(outcome).__name__}: {text}".rstrip(": "), None
    return None


def _call(send: Callable[[], Any]) -> Any:
    import httpx

    try:
        return send()
    except (httpx.TransportError, TransportFailure) as e:
        return e


def send_with_retries(send: Callable[[], Any], policy: RetryPolicy,
                      on_attempt: Callable[[], None] | None = None,
                      check: Callable[[Any], str | None] | None = None) -> Any:
    """``send()`` under ``policy`` (blocking waits); the first non-retryable response."""
    reason = ""
    for attempt in range(policy.attempts):
        if on_attempt:
            on_attempt()
        outcome = _call(send)
        fail = _failure(outcome, check)
        if fail is None:
            return outcome
        reason, retry_after = fail
        if attempt < policy.retries:
            time.sleep(policy.wait_s(attempt, retry_after))
    raise RetriesExhausted(policy.attempts, reason)


def _repeated_final(outcome: Any, previous: str | None, final: Callable[[Any], bool] | None) -> tuple[bool, str | None]:
    """(return it now?, its body for the next comparison): a retryable response that ``final``
    accepts and whose body equals the previous attempt's is the server's considered answer."""
    if final is None or not _is_response(outcome):
        return False, None
    body = outcome.text
    return (previous is not None and body == previous and final(outcome)), body


_NOT_YET = object()


async def asend_with_retries(send: Callable[[], Awaitable[Any]], policy: RetryPolicy,
                             on_attempt: Callable[[], None] | None = None,
                             check: Callable[[Any], str | None] | None = None,
                             final: Callable[[Any], bool] | None = None,
                             first: Any = _NOT_YET) -> Any:
    """``await send()`` under ``policy`` (asyncio waits); the first non-retryable response (or a
    repeated one ``final`` accepts). ``first``: the outcome (response or TransportFailure) of a
    first attempt the caller already made and counted itself (a caller that tries once inline and
    comes here only when that answer is not a plain success); the attempts then go on from the second."""
    import httpx

    reason = ""
    previous: str | None = None
    for attempt in range(policy.attempts):
        if attempt == 0 and first is not _NOT_YET:
            outcome = first
        else:
            if on_attempt:
                on_attempt()
            try:
                outcome = await send()
            except (httpx.TransportError, TransportFailure) as e:
                outcome = e
        fail = _failure(outcome, check)
        if fail is None:
            return outcome
        done, previous = _repeated_final(outcome, previous, final)
        if done:
            return outcome
        reason, retry_after = fail
        if attempt < policy.retries:
            await asyncio.sleep(policy.wait_s(attempt, retry_after))
    raise RetriesExhausted(policy.attempts, reason)
