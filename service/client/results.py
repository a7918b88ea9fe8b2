"""What the client hands back besides the service's own response models: the outcome
of an ingest cut into several requests, what is left of one that failed, and one record
per attempt for callers that measure (the load generators)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..schemas import Rejected


@dataclass
class IngestResult:
    """The sum of the answers to every request of one ``ingest`` call.

    ``rejected`` indexes the caller's input (not a request's). ``event_ids`` holds the id
    each input event was sent with, in input order (None only for an event sent without
    one, with ``assign_event_ids=False``): keep them to resend the same events later.
    After a retry, events that the lost attempt had logged come back as ``duplicates``:
    each event was still logged once."""

    accepted: int = 0
    duplicates: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    applied: bool = True  # every request answered applied=true (wait=true)
    event_ids: list[str | None] = field(default_factory=list)
    requests: int = 0  # requests answered (one per batch)


@dataclass
class IngestProgress:
    """Where an ``ingest`` stood when it raised: what was answered, and the events that
    were not, in input order with the ids they were sent with (``remaining_index`` are
    their positions in the input). ``client.ingest(progress.remaining)`` resends them
    exactly once: the ones an unanswered attempt did log come back as duplicates."""

    answered: IngestResult
    remaining: list[dict[str, Any]]
    remaining_index: list[int]


@dataclass(frozen=True)
class Attempt:
    """One HTTP attempt, as the ``on_attempt`` hook sees it."""

    method: str
    path: str  # the route, without the query
    number: int  # 1 for the first attempt of a request
    status: int | None  # None: no answer (the attempt failed in transport)
    error: str | None  # the transport exception's class name
    detail: str | None  # the body of a non-2xx answer, or the exception's message
    latency_s: float  # until the answer (or the failure)
    request_bytes: int
    items: int | None  # events or pairs in the request; None for other routes
    retry_in_s: float | None  # the pause before the next attempt; None: no retry follows
    retry_after_s: float | None  # what the service asked in Retry-After


AttemptHook = Callable[[Attempt], None]
