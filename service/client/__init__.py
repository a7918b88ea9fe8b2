"""The Python client of the v1 HTTP contract: ``DygserveClient`` (blocking) and
``AsyncDygserveClient``, on httpx, reading answers into the server's own models
(``service/schemas.py``).

    from service.client import ClientConfig, DygserveClient

    with DygserveClient(ClientConfig(url="http://127.0.0.1:8000", api_key="...")) as client:
        result = client.ingest(events)            # any number: cut under the limits
        client.score("alice", "carol", t=150.0)   # ScoreDetail

What it promises:

* **Exactly once.** An event sent without ``event_id`` gets a random 128-bit one before
  the first attempt; every retry sends the same bytes, so the service logs each event
  once and answers the resent ones as duplicates. ``IngestResult.event_ids`` returns the
  ids; ``event_id_from_key`` derives one from a key of yours (the same in any process).
* **Retries.** 502, 503, 504, timeouts, refused and dropped connections are retried with
  exponential backoff and full jitter, never earlier than ``Retry-After``, within a
  budget of attempts and seconds (``RetryPolicy``), then ``RetriesExhausted``. A 4xx is
  never retried: it raises its typed error with the service's detail (``errors``).
* **Batches and order.** ``ingest`` cuts the input into consecutive requests under the
  service's limits (events per request and body bytes: ``BatchLimits``, to be set to
  the service's values) and sends them in input order, one at a time (the async
  client's ``concurrency`` overlaps only batches that share no node). It never sorts,
  drops or resends an event on its own: give each node's events in time order. An
  event older than its node's last logged event is refused by the service as late
  (``DYGSERVE_LATE_POLICY=reject``); the client reports it in ``IngestResult.rejected``
  with its index in your input and the service's reason, and goes on with the rest.
  Sending it again would be refused again; nothing of it was logged (its id is not
  remembered either).
* **Failures mid-ingest.** Every exception out of ``ingest`` carries ``progress``: the
  answers so far and the unanswered events with their ids, to resend exactly once.
"""

from .aio import AsyncDygserveClient
from .batching import event_id_from_key, prepare_events
from .config import BatchLimits, ClientConfig, RetryPolicy
from .errors import (
    ApiError,
    BadRequest,
    ClientError,
    DeliveryUnknown,
    DygserveError,
    Forbidden,
    InvalidResponse,
    NotFound,
    PayloadTooLarge,
    RetriesExhausted,
    ServerError,
    Unauthorized,
    ValidationFailed,
)
from .results import Attempt, IngestProgress, IngestResult
from .sync import DygserveClient

__all__ = [
    "ApiError",
    "AsyncDygserveClient",
    "Attempt",
    "BadRequest",
    "BatchLimits",
    "ClientConfig",
    "ClientError",
    "DeliveryUnknown",
    "DygserveClient",
    "DygserveError",
    "Forbidden",
    "IngestProgress",
    "IngestResult",
    "InvalidResponse",
    "NotFound",
    "PayloadTooLarge",
    "RetriesExhausted",
    "RetryPolicy",
    "ServerError",
    "Unauthorized",
    "ValidationFailed",
    "event_id_from_key",
    "prepare_events",
]
