"""``GET /v1/nodes/{node}``: what the service holds for one node."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from model.node_ids import MAX_ID_BYTES

from ..auth import require_read_key
from ..deps import EngineDep
from ..engine import RequestRefused
from ..errors import ERROR_RESPONSES
from ..schemas import NodeSummary

router = APIRouter(
    tags=["debug"], responses=ERROR_RESPONSES, dependencies=[Depends(require_read_key)]
)


@router.get("/v1/nodes/{node}")
async def get_node(node: str, engine: EngineDep) -> NodeSummary:
    if len(node.encode()) > MAX_ID_BYTES:
        raise RequestRefused(422, f"a node id is at most {MAX_ID_BYTES} bytes")
    return await run_in_threadpool(engine.node_summary, node)
