"""The async client, on ``httpx.AsyncClient``: the blocking client's methods as
coroutines, plus an ingest that may keep several requests in flight."""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import TypeVar

import httpx

from ..schemas import (
    ClassifyDetail,
    ClassifyResponse,
    EventsResponse,
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
    EventBatch,
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


class AsyncDygserveClient:
    """Every v1 route of a dygserve service, as coroutines (see the package docstring).
    Use it as an async context manager or ``await aclose()``."""

    def __init__(
        self,
        config: ClientConfig | str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        on_attempt: AttemptHook | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = ClientConfig.coerce(config)
        self.on_attempt = on_attempt
        self._rng = rng or random.Random()
        self._http = httpx.AsyncClient(transport=transport, **calls.http_options(self.config))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncDygserveClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # ----- one request, its retries and its answer
    async def _send(self, call: calls.Call[T]) -> httpx.Response:
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
                response = await self._http.request(
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
            await asyncio.sleep(pause)

    async def _call(self, call: calls.Call[T]) -> T:
        return call.finish(await self._send(call))

    # ----- ingest
    async def ingest(
        self, events: Iterable[EventLike], *, wait: bool = True, concurrency: int = 1
    ) -> IngestResult:
        """As ``DygserveClient.ingest``. ``concurrency`` > 1 keeps up to that many
        requests in flight, but never two that share a node: a batch waits until every
        earlier batch with one of its nodes is answered, so each node's events still
        reach the service in input order. After a failure no new batch starts; the ones
        in flight finish, and ``progress.remaining`` holds the unanswered events."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        plan = IngestPlan.build(
            events,
            self.config.limits,
            validate=self.config.validate_requests,
            assign_ids=self.config.assign_event_ids,
        )
        if concurrency == 1:
            for batch in plan.batches:
                try:
                    plan.record(batch, await self._call(self._events_call(batch, wait)))
                except DygserveError as exc:
                    exc.progress = plan.progress()
                    raise
            return plan.result()
        return await self._ingest_gated(plan, wait, concurrency)

    def _events_call(self, batch: EventBatch, wait: bool) -> calls.Call[EventsResponse]:
        return calls.post_events(
            batch.body,
            len(batch.rows),
            wait=wait,
            resendable=batch.resendable,
        )

    async def _ingest_gated(self, plan: IngestPlan, wait: bool, concurrency: int) -> IngestResult:
        busy: set[str] = set()  # nodes of the batches in flight
        running = 0
        failure: DygserveError | None = None
        changed = asyncio.Condition()

        async def send(batch: EventBatch) -> None:
            nonlocal running, failure
            try:
                plan.record(batch, await self._call(self._events_call(batch, wait)))
            except DygserveError as exc:
                failure = failure or exc
            finally:
                busy.difference_update(batch.nodes)
                running -= 1
                async with changed:
                    changed.notify_all()

        def may_start(batch: EventBatch) -> bool:
            return failure is not None or (running < concurrency and busy.isdisjoint(batch.nodes))

        tasks: list[asyncio.Task[None]] = []
        try:
            for batch in plan.batches:
                async with changed:
                    await changed.wait_for(functools.partial(may_start, batch))
                if failure is not None:
                    break
                busy.update(batch.nodes)
                running += 1
                tasks.append(asyncio.create_task(send(batch)))
            await asyncio.gather(*tasks)
        except BaseException:  # cancelled: no request of this call outlives it
            for task in tasks:
                task.cancel()
            raise
        if failure is not None:
            failure.progress = plan.progress()
            raise failure
        return plan.result()

    # ----- scores
    async def score(self, src: str | int, dst: str | int, t: float | None = None) -> ScoreDetail:
        return await self._call(calls.get_score(src, dst, t))

    async def score_pairs(self, pairs: Iterable[PairLike]) -> ScoreResponse:
        answers = [
            await self._call(calls.post_score(body, n))
            for body, n in pair_requests(
                pair_rows(pairs, validate=self.config.validate_requests), self.config.limits
            )
        ]
        return ScoreResponse(
            scores=[s for a in answers for s in a.scores],
            model_version=answers[-1].model_version if answers else "",
        )

    async def rank(
        self, src: str | int, candidates: Sequence[str | int], t: float | None = None
    ) -> RankResponse:
        return await self._call(calls.post_rank(src, candidates, t))

    # ----- node classification (a checkpoint with a node head; else NotFound)
    async def classify(self, node: str | int, t: float | None = None) -> ClassifyDetail:
        """``GET /v1/nodes/{node}/classify``: the probability that the node is in the
        labelled state at ``t`` (None: the latest event time seen)."""
        return await self._call(calls.get_classify(node, t))

    async def classify_nodes(self, queries: Iterable[NodeQueryLike]) -> ClassifyResponse:
        """``POST /v1/classify``, cut into requests under the limits, answers in input
        order. A query is a ``NodeQueryIn``, a mapping, or ``(node, t)``; a head
        trained with event features needs them in each query (a mapping or model).
        A call cut in several requests that straddles a reload holds answers of both
        versions; the versions given are the last request's."""
        rows = node_query_rows(queries, validate=self.config.validate_requests)
        answers = [
            await self._call(calls.post_classify(body, n))
            for body, n in node_query_requests(rows, self.config.limits)
        ]
        return ClassifyResponse(
            scores=[s for a in answers for s in a.scores],
            model_version=answers[-1].model_version if answers else "",
            head_version=answers[-1].head_version if answers else "",
        )

    # ----- nodes, model, health
    async def node(self, node: str | int) -> NodeSummary:
        return await self._call(calls.get_node(node))

    async def model(self) -> ModelInfo:
        return await self._call(calls.get_model())

    async def reload(self, checkpoint: str) -> ModelInfo:
        return await self._call(calls.post_reload(checkpoint))

    async def health(self) -> Health:
        return await self._call(calls.get_health())

    async def ready(self) -> Readiness:
        return await self._call(calls.get_ready())

    async def wait_ready(self, timeout_s: float = 60.0, interval_s: float = 0.2) -> Readiness:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            try:
                readiness = await self.ready()
                if readiness.ready:
                    return readiness
                last = f"ready=false (store {readiness.store})"
            except (httpx.TransportError, DygserveError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() + interval_s > deadline:
                raise TimeoutError(f"service not ready after {timeout_s:g}s ({last})")
            await asyncio.sleep(interval_s)

    async def metrics(self) -> str:
        return await self._call(calls.get_metrics())
