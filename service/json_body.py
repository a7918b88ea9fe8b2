"""Batch request bodies parsed from their bytes by pydantic's JSON parser, off the loop.

FastAPI parses a declared body with ``json.loads`` and then validates the Python
objects, both on the event loop: for an ingest of 1,000 events that is a few ms in
which no GET is answered, and about twice the time of validating the bytes directly
(``model_validate_json``; docs/BENCHMARKS.md). The batch routes take their body from
``json_body(Model)`` instead: the same model and the same 4xx answers
(``service/errors.py``: malformed JSON 400, a field 422 with ``body`` first in its
``loc``), parsed in a worker thread. ``documented`` puts the model back into the
route's OpenAPI entry, and ``add_body_schemas`` into the document's components.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

M = TypeVar("M", bound=BaseModel)

# Models whose schemas the OpenAPI document must carry (``documented`` fills it).
_DOCUMENTED: dict[str, type[BaseModel]] = {}
_SCHEMA_REF = "#/components/schemas/{model}"


def _is_json(content_type: str | None) -> bool:
    """As FastAPI decides: no content type, or ``application/json`` or ``…+json``."""
    if not content_type:
        return True
    main = content_type.split(";", 1)[0].strip().lower()
    return main == "application/json" or (
        main.startswith("application/") and main.endswith("+json")
    )


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency that returns the request's body as ``model``."""

    async def parse(request: Request) -> M:
        raw = await request.body()  # (BodyLimitMiddleware has bounded it)
        if not raw:
            raise RequestValidationError(
                [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
            )
        if not _is_json(request.headers.get("content-type")):
            raise RequestValidationError(
                [
                    {
                        "type": "model_attributes_type",
                        "loc": ("body",),
                        "msg": "Input should be a valid dictionary or object to extract fields from",
                        "input": None,
                    }
                ]
            )
        try:
            return await run_in_threadpool(model.model_validate_json, raw)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_context=False)
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in errors]
            ) from None

    return parse


def documented(model: type[BaseModel]) -> dict[str, Any]:
    """The route's ``openapi_extra``: its request body is ``model``."""
    _DOCUMENTED[model.__name__] = model
    ref = {"$ref": _SCHEMA_REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def add_body_schemas(app: FastAPI) -> None:
    """Make ``app.openapi()`` carry the schemas of the documented bodies."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, model in _DOCUMENTED.items():
            body = model.model_json_schema(ref_template=_SCHEMA_REF)
            for sub, sub_schema in body.pop("$defs", {}).items():
                components.setdefault(sub, sub_schema)
            components.setdefault(name, body)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
