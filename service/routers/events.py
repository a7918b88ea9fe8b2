"""``POST /v1/events``: log a batch of edge events, then apply them."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from .. import metrics
from ..auth import require_api_key
from ..deps import BackgroundDep, EngineDep, SettingsDep
from ..engine import RequestRefused
from ..errors import ERROR_RESPONSES
from ..json_body import documented, json_body
from ..schemas import EventsRequest, EventsResponse

router = APIRouter(tags=["ingest"], responses=ERROR_RESPONSES)


@router.post(
    "/v1/events",
    dependencies=[Depends(require_api_key)],
    openapi_extra=documented(EventsRequest),
)
async def post_events(
    body: Annotated[EventsRequest, Depends(json_body(EventsRequest))],
    engine: EngineDep,
    settings: SettingsDep,
    background: BackgroundDep,
    wait: bool = True,
) -> EventsResponse:
    """Log a batch of edge events, then advance both endpoints' states by one step each.

    ``wait=true`` (default) answers after the states are committed; ``wait=false``
    answers once the events are logged (durable, exactly once) and applies them
    in the background."""
    if len(body.events) > settings.max_batch_events:
        raise RequestRefused(
            413, f"{len(body.events)} events; at most {settings.max_batch_events} per request"
        )
    start = time.perf_counter()
    metrics.BATCH_SIZE.labels(kind="ingest").observe(len(body.events))
    events = body.model_dump()["events"]  # one call: per event it cost 3x as much
    if wait:
        result = await run_in_threadpool(engine.ingest, events, True)
    else:
        rt = engine.runtime
        result, logged = await run_in_threadpool(engine.log_events, rt, events)
        result.applied = not logged and not logged.unconfirmed
        if logged:
            background.spawn(run_in_threadpool(engine.apply_in_background, rt, logged))
    metrics.INGEST_LATENCY.observe(time.perf_counter() - start)
    return result
