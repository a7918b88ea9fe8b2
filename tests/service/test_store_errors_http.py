"""A store error that redis-py leaves unnamed (a ``BUSY`` reply: a script runs past
Redis's time limit) answered on every store-facing route, in process with a real
Redis: 503, ``Retry-After``, a detail that names the condition, counted by reason,
including the small-call scoring path that reads on the event loop. Routes that do
not touch the store go on; once the script is killed everything answers 200 again."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.exceptions as rex
from prometheus_client import REGISTRY

from service.app import create_app
from service.settings import Settings

from .conftest import make_checkpoint


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(tmp_path: Path, redis_server) -> AsyncIterator[httpx.AsyncClient]:
    redis_server.flush()
    make_checkpoint(tmp_path / "a", edge_feature_dim=0)
    settings = Settings(checkpoint=tmp_path / "a", store={"url": redis_server.url})
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://in-process") as c:
            yield c


CALLS = [
    ("GET", "/v1/score", {"params": {"src": "a", "dst": "b", "t": 5.0}}),  # on the loop
    ("POST", "/v1/score", {"json": {"pairs": [{"src": "a", "dst": "b", "t": 5.0}] * 40}}),
    ("POST", "/v1/rank", {"json": {"src": "a", "t": 5.0, "candidates": ["b", "c"]}}),
    ("GET", "/v1/nodes/a", {}),
    ("POST", "/v1/events", {"json": {"events": [{"src": "a", "dst": "c", "t": 4.0}]}}),
]


def busy_count() -> float:
    return REGISTRY.get_sample_value("dygserve_store_errors_total", {"reason": "busy"}) or 0.0


@pytest.mark.anyio
async def test_a_busy_redis_is_a_503_on_every_store_route(client, redis_server) -> None:
    r = await client.post(
        "/v1/events",
        json={"events": [{"src": "a", "dst": "b", "t": 1.0}, {"src": "b", "dst": "c", "t": 2.0}]},
    )
    assert r.status_code == 200
    for method, path, kw in CALLS[:4]:
        assert (await client.request(method, path, **kw)).status_code == 200, path

    admin = redis_server.client()
    admin.config_set("busy-reply-threshold", 50)

    def block() -> None:
        try:
            redis_server.client().eval("while true do end", 0)
        except rex.RedisError:
            pass  # killed: expected

    blocker = threading.Thread(target=block, daemon=True)
    blocker.start()
    before = busy_count()
    try:
        await asyncio.sleep(0.3)  # past the threshold: every other command gets BUSY
        for method, path, kw in CALLS:
            r = await client.request(method, path, **kw)
            assert r.status_code == 503, (path, r.status_code, r.text[:300])
            assert r.headers["retry-after"] == "1"
            assert r.json()["detail"].startswith("state store busy"), r.json()
        assert (await client.get("/v1/model")).status_code == 200  # no store: unaffected
        assert busy_count() - before == len(CALLS)
    finally:
        admin.script_kill()
        blocker.join(10)
        admin.close()
    for method, path, kw in CALLS:
        r = await client.request(method, path, **kw)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
