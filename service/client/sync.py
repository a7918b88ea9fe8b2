"""The blocking client, on ``httpx.Client``."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import TypeVar

import httpx

from ..schemas import (
    ClassifyDetail,
    ClassifyResponse,
    Health,
    ModelInfo,
    NodeSummary,
    RankResponse,
    Readiness,
    ScoreDetail,
    ScoreResponse,
)
from . import calls
from .batching import (
    EventLike,
    IngestPlan,
    NodeQueryLike,
    PairLike,
    node_query_requests,
    node_query_rows,
    pair_requests,
    pair_rows,
)
from .config import ClientConfig
from .errors import DygserveError
from .results import AttemptHook, IngestResult
from .retry import RetryLoop

T = TypeVar("T")


class DygserveClient:
    """Every v1 route of a dygserve service, with retries and batching (see the package
    docstring). Thread-safe as ``httpx.Client`` is; use it as a context manager or
    ``close()`` it."""

    def __init__(
        self,
        config: ClientConfig | str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        on_attempt: AttemptHook | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = ClientConfig.coerce(config)
        self.on_attempt = on_attempt
        self._rng = rng or random.Random()
        self._http = httpx.Client(transport=transport, **calls.http_options(self.config))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> DygserveClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ----- one request, its retries and its answer
    def _send(self, call: calls.Call[T]) -> httpx.Response:
        loop = RetryLoop(
            self.config.retry,
            call.method,
            call.path,
            resendable=call.resendable,
            retry=call.retry,
            request_bytes=len(call.content or b""),
            items=call.items,
            hook=self.on_attempt,
            rng=self._rng,
        )
        while True:
            loop.begin()
            try:
                response = self._http.request(
                    call.method,
                    call.url(self.config),
                    params=call.params,
                    content=call.content,
                    headers=call.headers,
                )
            except httpx.TransportError as exc:
                pause = loop.failed(exc)
            else:
                answered = loop.answered(response)
                if answered is None:
                    return response
                pause = answered
            time.sleep(pause)

    def _call(self, call: calls.Call[T]) -> T:
        return call.finish(self._send(call))

    # ----- ingest
    def ingest(self, events: Iterable[EventLike], *, wait: bool = True) -> IngestResult:
        """Send events (``EventIn`` or mappings) in requests under the limits, in input
        order, one after another. Events without ``event_id`` get one (kept across
        retries; returned in ``event_ids``). ``wait=False``: answered once logged.

        A request refused (4xx) or given up raises; the exception's ``progress`` says
        what was answered and holds the events still to send, with their ids."""
        plan = IngestPlan.build(
            events,
            self.config.limits,
            validate=self.config.validate_requests,
            assign_ids=self.config.assign_event_ids,
        )
        for batch in plan.batches:
            call = calls.post_events(
                batch.body,
                len(batch.rows),
                wait=wait,
                resendable=batch.resendable,
            )
            try:
                plan.record(batch, self._call(call))
            except DygserveError as exc:
                exc.progress = plan.progress()
                raise
        return plan.result()

    # ----- scores
    def score(self, src: str | int, dst: str | int, t: float | None = None) -> ScoreDetail:
        """``GET /v1/score``: one pair (``t`` None: the latest event time seen)."""
        return self._call(calls.get_score(src, dst, t))

    def score_pairs(self, pairs: Iterable[PairLike]) -> ScoreResponse:
        """``POST /v1/score``, cut into requests under the limits, scores in input order.
        A call cut in several requests that straddles a model reload holds scores of
        both versions; ``model_version`` is then the last request's."""
        answers = [
            self._call(calls.post_score(body, n))
            for body, n in pair_requests(
                pair_rows(pairs, validate=self.config.validate_requests), self.config.limits
            )
        ]
        return ScoreResponse(
            scores=[s for a in answers for s in a.scores],
            model_version=answers[-1].model_version if answers else "",
        )

    def rank(
        self, src: str | int, candidates: Sequence[str | int], t: float | None = None
    ) -> RankResponse:
        """``POST /v1/rank``: the candidates sorted by probability (one request)."""
        return self._call(calls.post_rank(src, candidates, t))

    # ----- node classification (a checkpoint with a node head; else NotFound)
    def classify(self, node: str | int, t: float | None = None) -> ClassifyDetail:
        """``GET /v1/nodes/{node}/classify``: the probability that the node is in the
        labelled state at ``t`` (None: the latest event time seen)."""
        return self._call(calls.get_classify(node, t))

    def classify_nodes(self, queries: Iterable[NodeQueryLike]) -> ClassifyResponse:
        """``POST /v1/classify``, cut into requests under the limits, answers in input
        order. A query is a ``NodeQueryIn``, a mapping, or ``(node, t)``; a head
        trained with event features needs them in each query (a mapping or model).
        A call cut in several requests that straddles a reload holds answers of both
        versions; the versions given are the last request's."""
        rows = node_query_rows(queries, validate=self.config.validate_requests)
        answers = [
            self._call(calls.post_classify(body, n))
            for body, n in node_query_requests(rows, self.config.limits)
        ]
        return ClassifyResponse(
            scores=[s for a in answers for s in a.scores],
            model_version=answers[-1].model_version if answers else "",
            head_version=answers[-1].head_version if answers else "",
        )

    # ----- nodes, model, health
    def node(self, node: str | int) -> NodeSummary:
        return self._call(calls.get_node(node))

    def model(self) -> ModelInfo:
        return self._call(calls.get_model())

    def reload(self, checkpoint: str) -> ModelInfo:
        """``POST /v1/admin/reload``: a checkpoint folder under the models directory."""
        return self._call(calls.post_reload(checkpoint))

    def health(self) -> Health:
        return self._call(calls.get_health())

    def ready(self) -> Readiness:
        """``GET /readyz`` once, not retried: ``ready`` false while the service starts."""
        return self._call(calls.get_ready())

    def wait_ready(self, timeout_s: float = 60.0, interval_s: float = 0.2) -> Readiness:
        """Poll ``/readyz`` until ready; TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            try:
                readiness = self.ready()
                if readiness.ready:
                    return readiness
                last = f"ready=false (store {readiness.store})"
            except (httpx.TransportError, DygserveError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() + interval_s > deadline:
                raise TimeoutError(f"service not ready after {timeout_s:g}s ({last})")
            time.sleep(interval_s)

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text."""
        return self._call(calls.get_metrics())
