"""How errors become answers: one JSON shape (``{"detail": ...}``) for every 4xx/5xx
of the v1 routes, 503 with Retry-After for a store that cannot be reached."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from state_store.base import StoreUnavailable

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


async def _store_down(request: Request, exc: Exception) -> JSONResponse:
    request.app.state.ready = False
    return error_response(503, f"state store unavailable: {exc}", {"Retry-After": "1"})


async def _too_deep(request: Request, exc: Exception) -> JSONResponse:
    return error_response(400, "JSON nested too deeply")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(RequestRefused, _refused)
    app.add_exception_handler(StoreUnavailable, _store_down)
    app.add_exception_handler(RecursionError, _too_deep)
