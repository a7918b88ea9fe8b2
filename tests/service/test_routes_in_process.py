"""The routers in process, through ``httpx.ASGITransport`` with the app's lifespan:
no uvicorn, so every route's contract is checked in milliseconds. Each answer is
parsed back into the response model the route declares, so a route that returned
something else than its type says would fail here. (The uvicorn end-to-end tests
beside this one cover the same contract over a real socket.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service.app import create_app
from service.schemas import (
    EventsResponse,
    Health,
    ModelInfo,
    NodeSummary,
    RankResponse,
    Readiness,
    ScoreDetail,
    ScoreResponse,
)
from service.settings import Settings

from .conftest import make_checkpoint

KEY = {"X-API-Key": "k3y"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    make_checkpoint(tmp_path / "models" / "a", seed=0)
    make_checkpoint(tmp_path / "models" / "b", seed=1)
    settings = Settings(
        checkpoint=tmp_path / "models" / "a",
        api_key="k3y",
        max_batch_events=50,
        max_body_bytes=8192,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://in-process") as c:
            yield c


def events(*rows: tuple[str, str, float]) -> dict:
    return {"events": [{"src": s, "dst": d, "t": t, "features": [0.1, 0.2]} for s, d, t in rows]}


@pytest.mark.anyio
async def test_events_scores_rank_nodes(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/events", json=events(("a", "b", 1.0), ("b", "c", 2.0)), headers=KEY)
    assert r.status_code == 200
    assert EventsResponse.model_validate(r.json()) == EventsResponse(
        accepted=2, duplicates=0, rejected=[], applied=True
    )

    r = await client.get("/v1/score", params={"src": "a", "dst": "c", "t": 3.0})
    one = ScoreDetail.model_validate(r.json())
    assert one.src_state_age == 2.0 and one.dst_state_age == 1.0 and not one.clamped

    r = await client.post("/v1/score", json={"pairs": [{"src": "a", "dst": "c", "t": 3.0}]})
    batch = ScoreResponse.model_validate(r.json())
    assert abs(batch.scores[0].logit - one.logit) < 1e-5
    assert batch.model_version == one.model_version

    r = await client.post("/v1/rank", json={"src": "a", "t": 3.0, "candidates": ["b", "c", "z"]})
    ranked = RankResponse.model_validate(r.json())
    assert [x.logit for x in ranked.ranking] == sorted(
        (x.logit for x in ranked.ranking), reverse=True
    )
    assert {x.dst for x in ranked.ranking} == {"b", "c", "z"}

    node = NodeSummary.model_validate((await client.get("/v1/nodes/b")).json())
    assert node.cached and node.events_applied == 2 and node.history_length == 2


@pytest.mark.anyio
async def test_refusals_keep_their_status_and_shape(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v1/events", json=events(("a", "b", 1.0)))).status_code == 401
    wrong = await client.post(
        "/v1/events", json=events(("a", "b", 1.0)), headers={"X-API-Key": "x"}
    )
    assert wrong.status_code == 403
    too_many = events(*[("a", "b", float(i)) for i in range(51)])
    r = await client.post("/v1/events", json=too_many, headers=KEY)
    assert r.status_code in (413,) and "detail" in r.json()
    r = await client.post(
        "/v1/events", json={"events": [{"src": "a", "dst": "b", "t": 1.0, "x": 1}]}, headers=KEY
    )
    assert r.status_code == 422 and isinstance(r.json()["detail"], list)
    r = await client.post(
        "/v1/events", content=b"{not json", headers={**KEY, "content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json() == {"detail": "malformed JSON body"}
    # nothing above reached the store
    assert (await client.get("/v1/nodes/a")).json()["history_length"] == 0


@pytest.mark.anyio
async def test_model_reload_and_health(client: httpx.AsyncClient) -> None:
    before = ModelInfo.model_validate((await client.get("/v1/model")).json())
    r = await client.post("/v1/admin/reload", json={"checkpoint": "b"}, headers=KEY)
    after = ModelInfo.model_validate(r.json())
    assert after.model_version != before.model_version
    r = await client.post("/v1/admin/reload", json={"checkpoint": "../../etc"}, headers=KEY)
    assert r.status_code == 403
    assert Health.model_validate((await client.get("/healthz")).json()).status == "ok"
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and Readiness.model_validate(ready.json()).ready
    assert b"dygserve_events_ingested" in (await client.get("/metrics")).content
