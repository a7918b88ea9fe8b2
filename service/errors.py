"""How errors become answers: one JSON shape (``{"detail": ...}``) for every 4xx/5xx
of the v1 routes, 503 with Retry-After for every store error with a name (unreachable,
full, read-only, loading, busy, a write conflict past its retries; ``StoreUnavailable``)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from state_store.base import StoreUnavailable

from . import metrics
from .engine import RequestRefused
from .schemas import ErrorResponse

# What the v1 routes answer besides 200, so the OpenAPI document matches the bodies
# (FastAPI's default 422 schema has no room for {"detail": "<message>"}).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 413, 422, 503)
}


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


def validation_issues(errors: Any) -> list[dict[str, Any]]:
    """Validation errors without the raw input (which can be huge or non-JSON)."""
    return [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in errors]


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "malformed JSON body")
    return JSONResponse({"detail": validation_issues(errors)}, status_code=422)


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestRefused)
    return error_response(exc.status, str(exc))


# The first words of a 503's detail, per store error reason (clients and dashboards
# can tell a full store from an unreachable one without parsing the rest).
STORE_ERROR_MESSAGES: dict[str, str] = {
    "connection": "state store unreachable",
    "timeout": "state store timed out",
    "oom": "state store full",
    "readonly": "state store read-only",
    "loading": "state store loading",
    "busy": "state store busy",
    "masterdown": "state store master down",
    "clusterdown": "state store cluster down",
    "tryagain": "state store resharding",
    "misconf": "state store cannot persist",
    "conflict": "state store write conflict",
}
STORE_RETRY_AFTER_S = "1"


def store_error_detail(exc: StoreUnavailable) -> str:
    """What a 503 says: the condition, that a retry is safe, then the store's words."""
    return (
        f"{STORE_ERROR_MESSAGES[exc.reason]}: retry later (events already logged are "
        f"applied by the re-drive; nothing is half-applied): {exc}"
    )


async def _store_down(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StoreUnavailable)
    if exc.unreachable:  # a full or busy store still serves reads: stay ready
        request.app.state.ready = False
    metrics.STORE_ERRORS.labels(reason=exc.reason).inc()
    return error_response(503, store_error_detail(exc), {"Retry-After": STORE_RETRY_AFTER_S})


async def _too_deep(request: Request, exc: Exception) -> JSONResponse:
    return error_response(400, "JSON nested too deeply")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(RequestRefused, _refused)
    app.add_exception_handler(StoreUnavailable, _store_down)
    app.add_exception_handler(RecursionError, _too_deep)
