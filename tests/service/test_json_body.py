"""The batch routes take their bodies through ``service/json_body.py`` (parsed from
the bytes in a worker thread): the same answers as FastAPI's own parsing gave, and
the same OpenAPI contract. Real app in process (``httpx.ASGITransport``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service.app import create_app
from service.settings import Settings

from .conftest import make_checkpoint

ROUTES = {
    "/v1/events": "EventsRequest",
    "/v1/score": "ScoreRequest",
    "/v1/rank": "RankRequest",
    "/v1/classify": "ClassifyRequest",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    make_checkpoint(tmp_path / "a", seed=0)
    app = create_app(Settings(checkpoint=tmp_path / "a"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://in-process") as c:
            yield c


def resolve(spec: dict, ref: str) -> dict:
    assert ref.startswith("#/")
    node = spec
    for part in ref[2:].split("/"):
        node = node[part]
    return node


@pytest.mark.anyio
async def test_openapi_names_each_batch_body_and_its_parts(client) -> None:
    spec = (await client.get("/openapi.json")).json()
    for path, model in ROUTES.items():
        body = spec["paths"][path]["post"]["requestBody"]
        assert body["required"] is True
        ref = body["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model}"
        schema = resolve(spec, ref)
        # every reference inside the body's schema resolves in the document
        stack = [schema]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if "$ref" in node:
                    stack.append(resolve(spec, node["$ref"]))
                else:
                    stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    events = resolve(spec, "#/components/schemas/EventsRequest")
    assert events["required"] == ["events"]


@pytest.mark.anyio
async def test_field_errors_point_into_the_body(client) -> None:
    r = await client.post("/v1/events", json={"events": [{"src": "a", "dst": "b", "t": "soon"}]})
    assert r.status_code == 422
    (issue,) = r.json()["detail"]
    assert issue["loc"] == ["body", "events", 0, "t"] and issue["type"] == "float_type"
    r = await client.post("/v1/score", json={"pairs": "no"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:2] == ["body", "pairs"]


@pytest.mark.anyio
async def test_empty_malformed_and_non_json_bodies(client) -> None:
    empty = await client.post("/v1/events", content=b"")
    assert empty.status_code == 422 and empty.json()["detail"][0]["type"] == "missing"
    bad = await client.post(
        "/v1/rank", content=b'{"src": ', headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400 and bad.json()["detail"] == "malformed JSON body"
    text = await client.post(
        "/v1/classify", content=b'{"nodes": []}', headers={"content-type": "text/plain"}
    )
    assert text.status_code == 422
    # a JSON subtype is JSON, as for FastAPI
    ok = await client.post(
        "/v1/events",
        content=b'{"events": [{"src": "a", "dst": "b", "t": 1.0, "features": [0.0, 0.0]}]}',
        headers={"content-type": "application/vnd.api+json"},
    )
    assert ok.status_code == 200 and ok.json()["accepted"] == 1
