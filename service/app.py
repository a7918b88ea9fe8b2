"""The FastAPI application: routes of the v1 contract, health, metrics, admin."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import ORJSONResponse, Response
from starlette.concurrency import run_in_threadpool

from model.checkpoint import CheckpointError
from model.node_ids import MAX_ID_BYTES
from state_store.base import StoreUnavailable
from state_store.factory import make_store

from . import metrics
from .auth import require_api_key
from .batcher import ScoreBatcher
from .engine import Engine, ModelRuntime, RequestRefused
from .gc_tuning import freeze_startup_objects, refreeze
from .limits import BodyLimitMiddleware, InFlightMiddleware
from .malloc_tuning import keep_freed_memory
from .schemas import (
    MAX_ABS_TIME,
    ErrorResponse,
    EventsRequest,
    EventsResponse,
    ModelInfo,
    NodeSummary,
    RankRequest,
    RankResponse,
    ReloadRequest,
    ScoreDetail,
    ScoreRequest,
    ScoreResponse,
)
from .settings import Settings, get_settings

log = logging.getLogger("dygserve")
REDRIVE_INTERVAL_S = 1.0
# What the v1 routes answer besides 200, so the OpenAPI document matches the bodies
# (FastAPI's default 422 schema has no room for {"detail": "<message>"}).
ERROR_RESPONSES: dict[int | str, dict] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 413, 422, 503)
}


async def engine_of(request: Request) -> Engine:
    # async on purpose: FastAPI runs a plain-def dependency in the thread pool, one
    # thread hand-off (two wake-ups) per request just to read an attribute.
    return request.app.state.engine


EngineDep = Annotated[Engine, Depends(engine_of)]


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> ORJSONResponse:
    return ORJSONResponse({"detail": message}, status_code=status, headers=headers)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        import torch

        torch.set_num_threads(settings.torch_threads)
        keep_freed_memory()  # big torch temporaries reuse heap pages instead of faulting in new ones
        runtime = ModelRuntime.load(
            settings.checkpoint, settings.backend, settings.onnx_dir, settings.device
        )
        store = make_store(
            settings.redis_url,
            history_cap=settings.history_cap,
            state_ttl_s=settings.state_ttl_s,
            dedupe_ttl_s=settings.dedupe_ttl_s,
            max_future_skew=settings.max_future_skew,
        )
        engine = Engine(runtime, store, numpy_max_pairs=settings.numpy_score_max_pairs)
        app.state.engine = engine
        app.state.ready = False
        metrics.set_model_version(runtime.version)
        task = asyncio.create_task(_background_redrive(app))
        try:
            await run_in_threadpool(engine.redrive)
            await run_in_threadpool(engine.score_pairs, [("__warmup_a__", "__warmup_b__", 0.0)])
            freeze_startup_objects()  # no full GC pass walks the model and framework again
            app.state.ready = True
        except StoreUnavailable:
            log.warning("store unavailable at start; will retry the re-drive in the background")
        log.info("serving model %s from %s", runtime.version, settings.checkpoint)
        yield
        app.state.ready = False
        task.cancel()
        await store.aclose()
        store.close()

    app = FastAPI(
        title="dygserve",
        version="1",
        description="Online link prediction on streaming temporal graphs (causal DyG-Mamba, per-node SSM states).",
        default_response_class=ORJSONResponse,
        lifespan=lifespan,
    )
    app.state.settings = settings
    # One scoring call in flight; requests that arrive meanwhile share the next one.
    batcher = ScoreBatcher(
        lambda: app.state.engine,
        max_pairs=max(settings.max_score_pairs, settings.max_rank_candidates),
        loop_max_pairs=settings.loop_score_max_pairs,
    )
    background: set[asyncio.Task] = set()
    app.add_middleware(InFlightMiddleware, limit=settings.max_in_flight)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _error(400, "malformed JSON body")
        return ORJSONResponse({"detail": _jsonable(errors)}, status_code=422)

    @app.exception_handler(RequestRefused)
    async def _refused(request: Request, exc: RequestRefused):
        return _error(exc.status, str(exc))

    @app.exception_handler(StoreUnavailable)
    async def _store_down(request: Request, exc: StoreUnavailable):
        request.app.state.ready = False
        return _error(503, f"state store unavailable: {exc}", {"Retry-After": "1"})

    @app.exception_handler(RecursionError)
    async def _too_deep(request: Request, exc: RecursionError):
        return _error(400, "JSON nested too deeply")

    # ----- write ---------------------------------------------------------------------
    @app.post(
        "/v1/events",
        response_model=EventsResponse,
        dependencies=[Depends(require_api_key)],
        tags=["ingest"],
        responses=ERROR_RESPONSES,
    )
    async def post_events(
        body: EventsRequest, engine: EngineDep, wait: bool = True
    ) -> ORJSONResponse:
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
            result["applied"] = not logged
            if logged:
                task = asyncio.create_task(
                    run_in_threadpool(engine.apply_in_background, rt, logged)
                )
                background.add(task)  # keep a reference until it is done
                task.add_done_callback(background.discard)
        metrics.INGEST_LATENCY.observe(time.perf_counter() - start)
        return ORJSONResponse(result)

    # ----- score ---------------------------------------------------------------------
    @app.get("/v1/score", response_model=ScoreDetail, tags=["score"], responses=ERROR_RESPONSES)
    async def get_score(
        engine: EngineDep,
        src: Annotated[str, Query(min_length=1, max_length=MAX_ID_BYTES)],
        dst: Annotated[str, Query(min_length=1, max_length=MAX_ID_BYTES)],
        t: Annotated[
            float | None, Query(allow_inf_nan=False, ge=-MAX_ABS_TIME, le=MAX_ABS_TIME)
        ] = None,
    ) -> ORJSONResponse:
        """Probability of a link src -> dst at time t (default: the latest event time seen)."""
        start = time.perf_counter()
        scored, version = await batcher.score([(src, dst, t)])
        p = scored[0]
        metrics.SCORE_LATENCY.labels(route="get_score").observe(time.perf_counter() - start)
        return ORJSONResponse(
            {
                "src": p.src,
                "dst": p.dst,
                "t": p.t,
                "probability": p.probability,
                "logit": p.logit,
                "model_version": version,
                "src_state_age": p.src_age,
                "dst_state_age": p.dst_age,
                "src_inductive": p.src_inductive,
                "dst_inductive": p.dst_inductive,
                "clamped": p.clamped,
            }
        )

    @app.post("/v1/score", response_model=ScoreResponse, tags=["score"], responses=ERROR_RESPONSES)
    async def post_score(body: ScoreRequest, engine: EngineDep) -> ORJSONResponse:
        """A batch of candidate links in one call."""
        if len(body.pairs) > settings.max_score_pairs:
            raise RequestRefused(
                413, f"{len(body.pairs)} pairs; at most {settings.max_score_pairs} per request"
            )
        start = time.perf_counter()
        metrics.BATCH_SIZE.labels(kind="score").observe(len(body.pairs))
        scored, version = await batcher.score([(p.src, p.dst, p.t) for p in body.pairs])
        metrics.SCORE_LATENCY.labels(route="post_score").observe(time.perf_counter() - start)
        return ORJSONResponse(
            {
                "scores": [
                    {
                        "src": p.src,
                        "dst": p.dst,
                        "t": p.t,
                        "probability": p.probability,
                        "logit": p.logit,
                    }
                    for p in scored
                ],
                "model_version": version,
            }
        )

    @app.post("/v1/rank", response_model=RankResponse, tags=["score"], responses=ERROR_RESPONSES)
    async def post_rank(body: RankRequest, engine: EngineDep) -> ORJSONResponse:
        """One source, many candidate destinations, sorted by probability (TGB MRR use case)."""
        if len(body.candidates) > settings.max_rank_candidates:
            raise RequestRefused(
                413, f"{len(body.candidates)} candidates; at most {settings.max_rank_candidates}"
            )
        start = time.perf_counter()
        metrics.BATCH_SIZE.labels(kind="score").observe(len(body.candidates))
        scored, version = await batcher.score([(body.src, c, body.t) for c in body.candidates])
        ranked = sorted(scored, key=lambda p: -p.logit)
        metrics.SCORE_LATENCY.labels(route="rank").observe(time.perf_counter() - start)
        t = scored[0].t if scored else (body.t or 0.0)
        return ORJSONResponse(
            {
                "src": body.src,
                "t": t,
                "model_version": version,
                "ranking": [
                    {"dst": p.dst, "probability": p.probability, "logit": p.logit} for p in ranked
                ],
            }
        )

    # ----- introspection and admin ---------------------------------------------------
    @app.get(
        "/v1/nodes/{node}", response_model=NodeSummary, tags=["debug"], responses=ERROR_RESPONSES
    )
    async def get_node(node: str, engine: EngineDep) -> ORJSONResponse:
        if len(node.encode()) > MAX_ID_BYTES:
            raise RequestRefused(422, f"a node id is at most {MAX_ID_BYTES} bytes")
        return ORJSONResponse(await run_in_threadpool(engine.node_summary, node))

    @app.get("/v1/model", response_model=ModelInfo, tags=["admin"], responses=ERROR_RESPONSES)
    async def get_model(engine: EngineDep) -> ORJSONResponse:
        rt = engine.runtime
        return ORJSONResponse(
            {
                "model_version": rt.version,
                "checkpoint": str(rt.checkpoint.path),
                "backend": rt.backend,
                "device": str(rt.device),
                "config": rt.config.model_dump(mode="json"),
                "metrics": rt.checkpoint.metrics,
            }
        )

    @app.post(
        "/v1/admin/reload",
        response_model=ModelInfo,
        dependencies=[Depends(require_api_key)],
        tags=["admin"],
        responses=ERROR_RESPONSES,
    )
    async def reload(body: ReloadRequest, engine: EngineDep) -> ORJSONResponse:
        """Switch to another checkpoint under the models directory; states of the new
        version rebuild lazily from history (or with `dygserve backfill`)."""
        root = (settings.models_dir or Path(settings.checkpoint).parent).resolve()
        try:  # a NUL byte in the name is a ValueError, a name over NAME_MAX an OSError
            target = (root / body.checkpoint).resolve()
        except (OSError, ValueError) as exc:
            raise RequestRefused(
                422, f"checkpoint refused, still serving {engine.runtime.version}: {exc}"
            ) from exc
        if not target.is_relative_to(root):
            raise RequestRefused(403, "checkpoints load only from under the models directory")
        try:
            runtime = await run_in_threadpool(
                ModelRuntime.load, target, settings.backend, None, settings.device
            )
        except (CheckpointError, OSError, ValueError) as exc:
            raise RequestRefused(
                422, f"checkpoint refused, still serving {engine.runtime.version}: {exc}"
            ) from exc
        old_version = engine.swap(runtime).version
        metrics.set_model_version(runtime.version, old_version)
        log.info("reloaded: %s -> %s", old_version, runtime.version)
        # The old model is garbage once its last request ends; free its cycles, freeze the new one.
        await run_in_threadpool(refreeze)
        return await get_model(engine)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz(request: Request) -> ORJSONResponse:
        engine: Engine | None = getattr(request.app.state, "engine", None)
        store_ok = engine is not None and await run_in_threadpool(engine.store.ping)
        ready = bool(store_ok and request.app.state.ready)
        body = {
            "ready": ready,
            "store": bool(store_ok),
            "model_version": engine.runtime.version if engine else None,
        }
        return ORJSONResponse(
            body, status_code=200 if ready else 503, headers=None if ready else {"Retry-After": "1"}
        )

    @app.get("/metrics", tags=["health"])
    async def prometheus_metrics() -> Response:
        data, content_type = metrics.render()
        return Response(data, media_type=content_type)

    return app


def _jsonable(errors: list[dict]) -> list[dict]:
    """Validation errors without the raw input (which can be huge or non-JSON)."""
    return [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in errors]


async def _background_redrive(app: FastAPI) -> None:
    """Re-drive logged-but-unapplied events after a failed apply or a store outage."""
    while True:
        await asyncio.sleep(REDRIVE_INTERVAL_S)
        engine: Engine = app.state.engine
        if not engine.needs_redrive and app.state.ready:
            continue
        try:
            await run_in_threadpool(engine.redrive)
            app.state.ready = True
        except StoreUnavailable:
            app.state.ready = False
        except Exception:  # keep the loop alive; the next tick tries again
            log.exception("re-drive failed")
