"""``/healthz`` (the process is up), ``/readyz`` (store reachable, re-drive done),
``/metrics`` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from .. import metrics
from ..engine import Engine
from ..model_follower import ModelFollower
from ..schemas import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", responses={503: {"model": Readiness}})
async def readyz(request: Request, response: Response) -> Readiness:
    """200 when the store answers, the start-up re-drive is done and this worker serves
    the store's version (or has fallen behind it for less than the limit); else 503."""
    engine: Engine | None = getattr(request.app.state, "engine", None)
    follower: ModelFollower | None = getattr(request.app.state, "follower", None)
    store_ok = engine is not None and await run_in_threadpool(engine.store.ping)
    # A worker that has served another version than the store's for too long (it cannot
    # load it) is not ready: the mixed-version window stays bounded.
    following = follower is None or follower.within_limit
    ready = bool(store_ok and request.app.state.ready and following)
    if not ready:
        response.status_code = 503
        response.headers["Retry-After"] = "1"
    return Readiness(
        ready=ready, store=bool(store_ok), model_version=engine.runtime.version if engine else None
    )


@router.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    engine: Engine | None = getattr(request.app.state, "engine", None)
    if engine is not None:  # the store's memory figures, sampled in the background
        request.app.state.store_info.poke(engine.store)
    data, content_type = metrics.render()
    return Response(data, media_type=content_type)
