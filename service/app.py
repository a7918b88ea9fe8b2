"""The FastAPI application: middlewares, error handlers and the v1 routers.

What runs at start and stop (model, store, engine, batcher, background re-drive) is
in ``service.lifecycle``; the routes are in ``service.routers``, one per resource,
with typed dependencies from ``service.deps``.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute

from . import metrics
from .errors import install_error_handlers
from .json_body import add_body_schemas
from .lifecycle import lifespan
from .limits import UNBOUNDED_PATHS, BodyLimitMiddleware, InFlightMiddleware
from .routers import ALL as ROUTERS
from .settings import Settings, get_settings
from .store_info import StoreInfoSampler


def create_app(settings: Settings | None = None) -> FastAPI:
    app = FastAPI(
        title="dygserve",
        version="1",
        description="Online link prediction on streaming temporal graphs (causal DyG-Mamba, per-node SSM states).",
        lifespan=lifespan,
    )
    app.state.settings = settings or get_settings()
    app.state.store_info = StoreInfoSampler(
        app.state.settings.store_info_interval_s, app.state.settings.store.state_ttl_s
    )
    api_routes = [r for router in ROUTERS for r in router.routes if isinstance(r, APIRoute)]
    app.add_middleware(
        InFlightMiddleware, limit=app.state.settings.max_in_flight, routes=api_routes
    )
    app.add_middleware(BodyLimitMiddleware, max_bytes=app.state.settings.max_body_bytes)
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    add_body_schemas(app)
    metrics.precreate_series(r.path for r in api_routes if r.path not in UNBOUNDED_PATHS)
    return app
