"""The v1 routes as calls: method, path, body and the response model the answer is read
into (the server's own models, ``service/schemas.py``). Building a call and reading its
answer do no I/O, so the blocking and the async client share them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import orjson
from pydantic import BaseModel, ValidationError

from ..schemas import (
    ClassifyDetail,
    ClassifyResponse,
    EventsResponse,
    Health,
    ModelInfo,
    NodeSummary,
    RankRequest,
    RankResponse,
    Readiness,
    ReloadRequest,
    ScoreDetail,
    ScoreResponse,
)
from .config import ClientConfig
from .errors import InvalidResponse, ValidationFailed, error_for
from .retry import parse_retry_after

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
JSON = {"Content-Type": "application/json"}


def _model(model: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as exc:
            raise InvalidResponse(
                f"{response.request.method} {response.request.url.path} answered "
                f"{response.status_code} with a body that is not a {model.__name__}: {exc}"
            ) from exc

    return parse


def _text(response: httpx.Response) -> str:
    return response.text


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, str] | None = None
    content: bytes | None = None
    items: int | None = None  # events or pairs carried
    resendable: bool = True  # safe to send again after a failure that may have delivered it
    retry: bool = True
    answers: frozenset[int] = field(default_factory=frozenset)  # non-2xx read as the result
    ingest: bool = False  # a write to the event log: sent to ClientConfig.ingest_url when set

    def url(self, config: ClientConfig) -> str:
        """Where to send it: the path on the client's base URL, or on the ingest URL."""
        if self.ingest and config.ingest_url:
            return config.ingest_url.rstrip("/") + self.path
        return self.path

    @property
    def headers(self) -> dict[str, str] | None:
        return JSON if self.content is not None else None

    def finish(self, response: httpx.Response) -> T:
        """The answer as the route's model, or the typed error of a refusal."""
        if 200 <= response.status_code < 300 or response.status_code in self.answers:
            return self.parse(response)
        raise error_for(response, parse_retry_after(response.headers.get("retry-after")))


def _validated(model: type[M], **fields: object) -> M:
    """A request body checked before sending, refused with the service's locations."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise ValidationFailed.from_validation(exc, ("body",)) from exc


def post_events(body: bytes, items: int, *, wait: bool, resendable: bool) -> Call[EventsResponse]:
    return Call(
        "POST",
        "/v1/events",
        _model(EventsResponse),
        params=None if wait else {"wait": "false"},
        content=body,
        items=items,
        resendable=resendable,
        ingest=True,
    )


def get_score(src: str | int, dst: str | int, t: float | None) -> Call[ScoreDetail]:
    params = {"src": str(src), "dst": str(dst)}
    if t is not None:
        params["t"] = repr(float(t))  # repr: the exact float64 back on the server
    return Call("GET", "/v1/score", _model(ScoreDetail), params=params, items=1)


def post_score(body: bytes, items: int) -> Call[ScoreResponse]:
    return Call("POST", "/v1/score", _model(ScoreResponse), content=body, items=items)


def post_rank(
    src: str | int, candidates: Sequence[str | int], t: float | None
) -> Call[RankResponse]:
    request = _validated(RankRequest, src=src, t=t, candidates=list(candidates))
    return Call(
        "POST",
        "/v1/rank",
        _model(RankResponse),
        content=orjson.dumps(request.model_dump()),
        items=len(request.candidates),
    )


def get_node(node: str | int) -> Call[NodeSummary]:
    # Node ids are free text: "/", "?" or "%" in one must not change the route.
    return Call("GET", "/v1/nodes/" + quote(str(node), safe=""), _model(NodeSummary))


def get_classify(node: str | int, t: float | None) -> Call[ClassifyDetail]:
    params = None if t is None else {"t": repr(float(t))}  # repr: the exact float64
    path = "/v1/nodes/" + quote(str(node), safe="") + "/classify"
    return Call("GET", path, _model(ClassifyDetail), params=params, items=1)


def post_classify(body: bytes, items: int) -> Call[ClassifyResponse]:
    return Call("POST", "/v1/classify", _model(ClassifyResponse), content=body, items=items)


def get_model() -> Call[ModelInfo]:
    return Call("GET", "/v1/model", _model(ModelInfo))


def post_reload(checkpoint: str) -> Call[ModelInfo]:
    request = _validated(ReloadRequest, checkpoint=checkpoint)
    return Call(
        "POST", "/v1/admin/reload", _model(ModelInfo), content=orjson.dumps(request.model_dump())
    )


def get_health() -> Call[Health]:
    return Call("GET", "/healthz", _model(Health))


def get_ready() -> Call[Readiness]:
    # 503 with a Readiness body is an answer here ("not ready yet"), not a failure to retry.
    return Call("GET", "/readyz", _model(Readiness), retry=False, answers=frozenset({503}))


def get_metrics() -> Call[str]:
    return Call("GET", "/metrics", _text)


def http_options(config: ClientConfig) -> dict[str, Any]:
    """What the httpx client of either kind is built with."""
    return {
        "base_url": config.url.rstrip("/"),
        "headers": config.headers(),
        "timeout": httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
        "limits": httpx.Limits(
            max_connections=config.max_connections,
            max_keepalive_connections=config.max_connections,
        ),
        "trust_env": config.trust_env,
    }
