"""ASGI middlewares that bound the work a request can cause.

* ``BodyLimitMiddleware``: 413 for a body over the byte limit, whether announced by
  Content-Length or streamed in chunks (counted as it arrives, never buffered whole).
* ``InFlightMiddleware``: at most N requests in progress; beyond that 503 with
  Retry-After, so overload sheds load instead of queueing without bound.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import metrics

UNBOUNDED_PATHS = ("/metrics", "/healthz", "/readyz")


async def _reply(
    send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = orjson.dumps({"detail": detail})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    announced = int(value)
                except ValueError:
                    await _reply(send, 400, "invalid Content-Length")
                    return
                if announced > self.max_bytes:
                    await _reply(send, 413, f"body over {self.max_bytes} bytes")
                    return
        seen = 0
        started = False
        too_large = False

        async def counted_receive() -> Message:
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    too_large = True
                    raise BodyTooLarge
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if too_large:
                # FastAPI turns any error while reading the body into its own 400
                # ("There was an error parsing the body"): whatever the app answers
                # once the limit tripped, the client gets the 413.
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await _reply(send, 413, f"body over {self.max_bytes} bytes")
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await _reply(send, 413, f"body over {self.max_bytes} bytes")


def route_template(scope: Scope, routes: Sequence[BaseRoute]) -> str:
    """The template of the route a request would reach ("/v1/nodes/{node}"), for a
    label: raw paths would make one series per node id, without bound. Routing has not
    run yet where a request is shed, so match it here (only on that path)."""
    for route in routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:  # FULL, or PARTIAL (the path with another method)
            return str(getattr(route, "path", "unmatched"))
    return "unmatched"


class InFlightMiddleware:
    def __init__(self, app: ASGIApp, limit: int, routes: Sequence[BaseRoute] = ()) -> None:
        self.app = app
        self.limit = limit
        self.routes = routes  # the app's routes, to label a shed request by its template
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path in UNBOUNDED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            await _reply(send, 503, "too many requests in flight", [(b"retry-after", b"1")])
            metrics.HTTP_REQUESTS.labels(
                route=route_template(scope, self.routes), status="503"
            ).inc()
            return
        self.in_flight += 1
        metrics.IN_FLIGHT.inc()
        status = "500"

        async def tracked_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        finally:
            self.in_flight -= 1
            metrics.IN_FLIGHT.dec()
            route = scope.get("route")
            metrics.HTTP_REQUESTS.labels(
                route=getattr(route, "path", "unmatched"), status=status
            ).inc()
