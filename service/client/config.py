"""What a client is told: where the service is, how long to wait, how to retry, and the
service's request limits that big calls are cut under.

Pure data (frozen pydantic models): the same config serves the blocking and the async
client, and the retry policy's arithmetic is testable without a network.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from ..schemas import DEFAULT_MAX_BATCH_EVENTS, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_SCORE_PAIRS

DEFAULT_URL = "http://127.0.0.1:8000"
# The answers a request is sent again after: overload or a store that cannot be reached
# (503, with Retry-After), and what a proxy in front answers for a service that is
# restarting or slow (502, 504). Never a 4xx: the same request would be refused again.
RETRY_STATUSES = frozenset({502, 503, 504})


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RetryPolicy(_Frozen):
    """Exponential backoff with full jitter, under a budget of attempts and of time.

    The pause before retry ``n`` (1, 2, ...) is uniform in
    ``[0, min(max_delay_s, base_delay_s * 2 ** (n - 1))]`` ("full jitter": clients that
    failed together do not come back together). When the service said ``Retry-After``,
    the pause is that many seconds (at most ``max_retry_after_s``) plus the same jitter:
    never earlier than asked, and spread after it. A retry that could not start before
    ``budget_s`` seconds from the first attempt is not made."""

    max_attempts: int = Field(6, ge=1, description="attempts per request, the first one included")
    budget_s: float = Field(
        30.0, gt=0, description="time from the first attempt after which no retry starts"
    )
    base_delay_s: float = Field(0.1, ge=0)
    max_delay_s: float = Field(5.0, ge=0)
    max_retry_after_s: float = Field(
        30.0, ge=0, description="the longest Retry-After honoured (a larger one is cut to this)"
    )

    def jitter(self, retry: int, rng: random.Random) -> float:
        """Full-jitter backoff before retry number ``retry`` (1-based)."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2.0 ** max(retry - 1, 0))
        return rng.uniform(0.0, ceiling)

    def delay(self, retry: int, retry_after_s: float | None, rng: random.Random) -> float:
        """The pause before retry number ``retry``, given what the service asked (or None)."""
        asked = 0.0 if retry_after_s is None else min(retry_after_s, self.max_retry_after_s)
        return asked + self.jitter(retry, rng)


class _SettingsLike(Protocol):
    max_batch_events: int
    max_body_bytes: int
    max_score_pairs: int
    max_classify_nodes: int


class BatchLimits(_Frozen):
    """The service's request limits (its ``DYGSERVE_MAX_BATCH_EVENTS``,
    ``DYGSERVE_MAX_BODY_BYTES``, ``DYGSERVE_MAX_SCORE_PAIRS``,
    ``DYGSERVE_MAX_CLASSIFY_NODES``). The client cuts ingests, score and classify calls
    into requests under them; set them to the service's values (a
    service with lower limits answers 413, raised as ``PayloadTooLarge``)."""

    max_batch_events: int = Field(DEFAULT_MAX_BATCH_EVENTS, ge=1)
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=64)
    max_score_pairs: int = Field(DEFAULT_MAX_SCORE_PAIRS, ge=1)
    # The service's default for DYGSERVE_MAX_CLASSIFY_NODES is the score-pair limit's.
    max_classify_nodes: int = Field(DEFAULT_MAX_SCORE_PAIRS, ge=1)

    @classmethod
    def from_settings(cls, settings: _SettingsLike) -> BatchLimits:
        """The limits of a service's ``Settings`` (for a client beside its service)."""
        return cls(
            max_batch_events=settings.max_batch_events,
            max_body_bytes=settings.max_body_bytes,
            max_score_pairs=settings.max_score_pairs,
            max_classify_nodes=settings.max_classify_nodes,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BatchLimits:
        """The limits from the variables the service reads (``DYGSERVE_MAX_BATCH_EVENTS``,
        ``DYGSERVE_MAX_BODY_BYTES``, ``DYGSERVE_MAX_SCORE_PAIRS``,
        ``DYGSERVE_MAX_CLASSIFY_NODES``), defaults where unset."""
        env = os.environ if environ is None else environ
        given = {
            field: env[f"DYGSERVE_{field.upper()}"]
            for field in cls.model_fields
            if f"DYGSERVE_{field.upper()}" in env
        }
        return cls.model_validate(given)


class ClientConfig(_Frozen):
    url: str = Field(DEFAULT_URL, description="the service's base URL")
    ingest_url: str | None = Field(
        None,
        description="where ingests (POST /v1/events) go when not to ``url``: replicas that "
        "take the writes, so that the replicas behind ``url`` serve reads without an apply "
        "in their process (docs/BENCHMARKS.md, 'Reads beside writes'); every replica shares "
        "the store, so reads see what the ingest replicas applied",
    )
    api_key: SecretStr | None = Field(
        None, description="sent as X-API-Key on every request (write, admin and, if set, reads)"
    )
    timeout_s: float = Field(30.0, gt=0, description="per attempt: read, write and pool timeout")
    connect_timeout_s: float = Field(5.0, gt=0)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    limits: BatchLimits = Field(default_factory=BatchLimits)
    assign_event_ids: bool = Field(
        True,
        description="give every event sent without an event_id a random one (128 bits), kept "
        "across retries; with False such events go without one and their requests are resent "
        "only after failures that prove they were not delivered",
    )
    validate_requests: bool = Field(
        True,
        description="check events and score pairs against the shared request models before "
        "sending (about 1.3 us per event); with False mappings are sent as given, the service "
        "still checks them",
    )
    max_connections: int = Field(16, ge=1)
    trust_env: bool = Field(True, description="use proxy settings from the environment (httpx)")

    @model_validator(mode="after")
    def _http_url(self) -> ClientConfig:
        for name, url in (("url", self.url), ("ingest_url", self.ingest_url)):
            if url is not None and not url.startswith(("http://", "https://")):
                raise ValueError(f"{name} must be http(s)://..., got {url!r}")
        return self

    @classmethod
    def coerce(cls, config: ClientConfig | str | None) -> ClientConfig:
        """A config, a bare URL (defaults for the rest), or None (all defaults)."""
        if config is None:
            return cls()
        if isinstance(config, str):
            return cls(url=config)
        return config

    def headers(self) -> dict[str, str]:
        return {"X-API-Key": self.api_key.get_secret_value()} if self.api_key else {}
