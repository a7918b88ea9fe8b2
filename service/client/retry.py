"""One request's attempts: what is retried, how long to pause, when to give up.

Shared by the blocking and the async client, which differ only in how they send and
sleep. Retried: 502, 503 and 504 answers, timeouts, refused and dropped connections.
Never a 4xx. A request that may have been applied before it failed (a timeout or a
dropped connection after it was sent, or a 503 from a store that failed mid-call) is
resent only when it is idempotent: reads, and events that all carry ids (the service
answers the resent ones as duplicates). Failures that prove nothing was sent (refused
connection, connect timeout, no pooled connection free) are retried for every request.
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from .config import RETRY_STATUSES, RetryPolicy
from .errors import DeliveryUnknown, RetriesExhausted, detail_text
from .results import Attempt, AttemptHook

# Failures after which the service may have run the request, and those before it was sent.
MAYBE_DELIVERED = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date (RFC 9110)."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


class RetryLoop:
    """The attempts of one request. ``answered``/``failed`` return the pause before the
    next attempt, None when the answer is final, or raise when the request is given up."""

    def __init__(
        self,
        policy: RetryPolicy,
        method: str,
        path: str,
        *,
        resendable: bool,
        retry: bool,
        request_bytes: int,
        items: int | None,
        hook: AttemptHook | None,
        rng: random.Random,
    ) -> None:
        self.policy = policy
        self.method = method
        self.path = path
        self.resendable = resendable
        self.retry = retry
        self.request_bytes = request_bytes
        self.items = items
        self.hook = hook
        self.rng = rng
        self.number = 0
        self.first = time.monotonic()
        self._sent = 0.0

    def begin(self) -> None:
        self.number += 1
        self._sent = time.perf_counter()

    def answered(self, response: httpx.Response) -> float | None:
        latency = time.perf_counter() - self._sent
        status = response.status_code
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        if status not in RETRY_STATUSES or not self.retry:
            self._report(
                status, None, None if status < 300 else response.text, latency, None, retry_after
            )
            return None
        detail = detail_text(response)
        if not self.resendable:
            self._report(status, None, detail, latency, None, retry_after)
            raise DeliveryUnknown(
                f"HTTP {status} ({detail}) to a request holding events without ids: "
                "it may have been logged, so it is not resent"
            )
        return self._pause_or_give_up(status, None, detail, latency, retry_after, None)

    def failed(self, exc: httpx.TransportError) -> float:
        latency = time.perf_counter() - self._sent
        name, detail = type(exc).__name__, str(exc) or type(exc).__name__
        if not isinstance(exc, MAYBE_DELIVERED) or not self.retry:
            self._report(None, name, detail, latency, None, None)
            raise exc
        if not self.resendable and not isinstance(exc, NOT_SENT):
            self._report(None, name, detail, latency, None, None)
            raise DeliveryUnknown(
                f"{name} ({detail}) after sending events without ids: they may have been "
                "logged, so they are not resent"
            ) from exc
        pause = self._pause_or_give_up(None, name, detail, latency, None, exc)
        assert pause is not None
        return pause

    def _pause_or_give_up(
        self,
        status: int | None,
        error: str | None,
        detail: str,
        latency: float,
        retry_after: float | None,
        exc: Exception | None,
    ) -> float:
        pause = self.policy.delay(self.number, retry_after, self.rng)
        elapsed = time.monotonic() - self.first
        if self.number >= self.policy.max_attempts or elapsed + pause > self.policy.budget_s:
            self._report(status, error, detail, latency, None, retry_after)
            raise RetriesExhausted(self.number, elapsed, status, detail) from exc
        self._report(status, error, detail, latency, pause, retry_after)
        return pause

    def _report(
        self,
        status: int | None,
        error: str | None,
        detail: str | None,
        latency: float,
        retry_in: float | None,
        retry_after: float | None,
    ) -> None:
        if self.hook is not None:
            self.hook(
                Attempt(
                    method=self.method,
                    path=self.path,
                    number=self.number,
                    status=status,
                    error=error,
                    detail=detail,
                    latency_s=latency,
                    request_bytes=self.request_bytes,
                    items=self.items,
                    retry_in_s=retry_in,
                    retry_after_s=retry_after,
                )
            )
