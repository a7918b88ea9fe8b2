"""What one request's attempts come to: retried or not, the pause, giving up (no network:
answers are real ``httpx.Response`` objects, failures real httpx exceptions)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from service.client import Attempt, DeliveryUnknown, RetriesExhausted, RetryPolicy
from service.client.retry import RetryLoop, parse_retry_after

REQUEST = httpx.Request("POST", "http://svc/v1/events")


def answer(status: int, retry_after: str | None = None) -> httpx.Response:
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    return httpx.Response(status, json={"detail": "x"}, headers=headers, request=REQUEST)


def loop(policy: RetryPolicy | None = None, resendable: bool = True, seen: list | None = None):
    return RetryLoop(
        policy or RetryPolicy(),
        "POST",
        "/v1/events",
        resendable=resendable,
        retry=True,
        request_bytes=10,
        items=1,
        hook=None if seen is None else seen.append,
        rng=random.Random(0),
    )


def test_full_jitter_stays_under_its_ceiling_and_spreads():
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=1.0)
    rng = random.Random(1)
    for retry, ceiling in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)):
        pauses = [policy.delay(retry, None, rng) for _ in range(300)]
        assert 0.0 <= min(pauses) and max(pauses) <= ceiling
        assert max(pauses) > 0.8 * ceiling and min(pauses) < 0.2 * ceiling  # spread, not fixed


def test_retry_after_is_a_floor_and_is_capped():
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=0.5, max_retry_after_s=10.0)
    rng = random.Random(2)
    pauses = [policy.delay(3, 2.0, rng) for _ in range(200)]
    assert min(pauses) >= 2.0 and max(pauses) <= 2.4
    assert 10.0 <= policy.delay(1, 3600.0, rng) <= 10.1


def test_parse_retry_after():
    now = datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_retry_after("1") == 1.0 and parse_retry_after(" 2.5 ") == 2.5
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now) == 30.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=30), usegmt=True), now) == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("-3") == 0.0


def test_503_is_retried_after_retry_after_and_a_4xx_is_final():
    seen: list[Attempt] = []
    attempts = loop(seen=seen)
    attempts.begin()
    pause = attempts.answered(answer(503, "1"))
    assert pause is not None and pause >= 1.0
    attempts.begin()
    assert attempts.answered(answer(422)) is None  # final: the caller raises its error
    assert [(a.number, a.status, a.retry_after_s) for a in seen] == [(1, 503, 1.0), (2, 422, None)]
    assert seen[0].retry_in_s == pause and seen[1].retry_in_s is None
    for status in (400, 401, 403, 404, 409, 413, 422, 429, 500):
        fresh = loop()
        fresh.begin()
        assert fresh.answered(answer(status)) is None, status


def test_the_attempt_budget_and_the_time_budget():
    attempts = loop(RetryPolicy(max_attempts=3, base_delay_s=0.0))
    for _ in range(2):
        attempts.begin()
        assert attempts.answered(answer(502)) == 0.0
    attempts.begin()
    with pytest.raises(RetriesExhausted) as caught:
        attempts.answered(answer(504))
    assert caught.value.attempts == 3 and caught.value.last_status == 504
    # a retry that could not start within budget_s is not made
    slow = loop(RetryPolicy(budget_s=0.5, max_retry_after_s=60.0))
    slow.begin()
    with pytest.raises(RetriesExhausted):
        slow.answered(answer(503, "5"))


def test_transport_failures():
    dropped = httpx.RemoteProtocolError("Server disconnected", request=REQUEST)
    refused = httpx.ConnectError("refused", request=REQUEST)
    attempts = loop()
    attempts.begin()
    assert attempts.failed(dropped) >= 0.0
    # without ids: a failure after sending may have logged the events: not resent...
    unsafe = loop(resendable=False)
    unsafe.begin()
    with pytest.raises(DeliveryUnknown):
        unsafe.failed(httpx.ReadTimeout("slow", request=REQUEST))
    unsafe.begin()
    with pytest.raises(DeliveryUnknown):
        unsafe.answered(answer(503, "1"))
    # ...but a refused connection sent nothing: retried even then
    unsafe.begin()
    assert unsafe.failed(refused) >= 0.0
    # a mistake of the caller's (no such scheme) is not retried: it propagates
    odd = loop()
    odd.begin()
    with pytest.raises(httpx.UnsupportedProtocol):
        odd.failed(httpx.UnsupportedProtocol("ftp", request=REQUEST))
