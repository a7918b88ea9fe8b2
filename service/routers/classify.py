"""``GET /v1/nodes/{node}/classify`` and ``POST /v1/classify``: node-state probabilities
(checkpoints with a node head) from the cached states, cold nodes rebuilt on the way."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from model.node_ids import MAX_ID_BYTES

from .. import metrics
from ..classify import classify_nodes
from ..deps import EngineDep, SettingsDep
from ..engine import RequestRefused
from ..errors import ERROR_RESPONSES
from ..json_body import documented, json_body
from ..schemas import (
    MAX_ABS_TIME,
    ClassifyDetail,
    ClassifyRequest,
    ClassifyResponse,
    ErrorResponse,
)

# 404: the checkpoint has no node head, or a node has no event.
RESPONSES: dict[int | str, dict[str, Any]] = {**ERROR_RESPONSES, 404: {"model": ErrorResponse}}
router = APIRouter(tags=["classify"], responses=RESPONSES)


@router.get("/v1/nodes/{node}/classify")
async def get_classify(
    node: str,
    engine: EngineDep,
    t: Annotated[
        float | None, Query(allow_inf_nan=False, ge=-MAX_ABS_TIME, le=MAX_ABS_TIME)
    ] = None,
) -> ClassifyDetail:
    """Probability that the node is in the labelled state at time t (default: the
    latest event time seen), e.g. "this editor will be banned" on Wikipedia."""
    if len(node.encode()) > MAX_ID_BYTES:
        raise RequestRefused(422, f"a node id is at most {MAX_ID_BYTES} bytes")
    start = time.perf_counter()
    scored, version, head_version = await run_in_threadpool(
        classify_nodes, engine, [(node, t, None)]
    )
    c = scored[0]
    metrics.CLASSIFY_LATENCY.labels(route="get_classify").observe(time.perf_counter() - start)
    metrics.NODES_CLASSIFIED.labels(route="get_classify").inc()
    return ClassifyDetail(
        node=c.node,
        t=c.t,
        probability=c.probability,
        logit=c.logit,
        state_age=c.state_age,
        clamped=c.clamped,
        model_version=version,
        head_version=head_version,
    )


@router.post("/v1/classify", openapi_extra=documented(ClassifyRequest))
async def post_classify(
    body: Annotated[ClassifyRequest, Depends(json_body(ClassifyRequest))],
    engine: EngineDep,
    settings: SettingsDep,
) -> ClassifyResponse:
    """A batch of {node, t} in one call (one state read, one read-out)."""
    if len(body.nodes) > settings.max_classify_nodes:
        raise RequestRefused(
            413, f"{len(body.nodes)} nodes; at most {settings.max_classify_nodes} per request"
        )
    start = time.perf_counter()
    metrics.BATCH_SIZE.labels(kind="classify").observe(len(body.nodes))
    scored, version, head_version = await run_in_threadpool(
        classify_nodes, engine, [(q.node, q.t, q.features) for q in body.nodes]
    )
    metrics.CLASSIFY_LATENCY.labels(route="post_classify").observe(time.perf_counter() - start)
    metrics.NODES_CLASSIFIED.labels(route="post_classify").inc(len(scored))
    return ClassifyResponse.model_validate(
        {
            "scores": [
                {
                    "node": c.node,
                    "t": c.t,
                    "probability": c.probability,
                    "logit": c.logit,
                    "state_age": c.state_age,
                    "clamped": c.clamped,
                }
                for c in scored
            ],
            "model_version": version,
            "head_version": head_version,
        }
    )
