"""Metrics that dashboards can rely on (issue 15, defect 6), in process through
``httpx.ASGITransport`` with the app's lifespan:

* a request shed by the in-flight bound (503) is labelled with its route template,
  not its raw path (one series per node id would grow without bound);
* the label sets a panel divides by exist from the start, at 0 (a 5xx ratio or a
  rejected-by-reason panel shows 0, not "no data");
* a cold rebuild done by the applier (ingest into a node whose blob is gone) is
  counted, and a node's first events are not;
* a compare-and-set lost to another writer is counted, once per node.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute
from prometheus_client import REGISTRY

from service import metrics
from service.app import create_app
from service.limits import UNBOUNDED_PATHS
from service.routers import ALL as ROUTERS
from service.settings import Settings
from state_store.applier import apply_logged, logged_events
from state_store.base import STORE_ERROR_REASONS, NewEvent

from .conftest import make_checkpoint


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_series_that_panels_divide_by_exist_at_zero(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "a")
    app = create_app(Settings(checkpoint=tmp_path / "a"))
    routes = [r.path for router in ROUTERS for r in router.routes if isinstance(r, APIRoute)]
    assert "/v1/score" in routes and "/v1/nodes/{node}" in routes
    assert app.title
    for route in routes:
        if route in UNBOUNDED_PATHS:
            continue
        for status in ("200", "500", "503"):
            assert sample("dygserve_http_requests_total", route=route, status=status) is not None, (
                route,
                status,
            )
    for reason in ("late", "future"):
        assert sample("dygserve_events_rejected_total", reason=reason) is not None, reason
    for reason in STORE_ERROR_REASONS:
        assert sample("dygserve_store_errors_total", reason=reason) is not None, reason
    text = metrics.render()[0].decode()
    assert 'dygserve_http_requests_total{route="/v1/score",status="500"}' in text


@pytest.fixture
async def app_and_client(tmp_path: Path) -> AsyncIterator[tuple[object, httpx.AsyncClient]]:
    make_checkpoint(tmp_path / "a", edge_feature_dim=0)
    app = create_app(Settings(checkpoint=tmp_path / "a", max_in_flight=1))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://in-process") as c:
            yield app, c


@pytest.mark.anyio
async def test_a_shed_request_is_labelled_with_its_route_template(app_and_client) -> None:
    _, client = app_and_client
    node = f"n-{uuid.uuid4().hex}"
    release = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield b'{"events": ['
        await release.wait()  # the request stays in flight until the test lets it go
        yield b'{"src": "a", "dst": "b", "t": 1.0}]}'

    held = asyncio.create_task(
        client.post("/v1/events", content=slow_body(), headers={"content-type": "application/json"})
    )
    for _ in range(500):  # until the held request occupies the only slot
        if sample("dygserve_in_flight_requests") == 1:
            break
        await asyncio.sleep(0.01)
    try:
        for _ in range(200):
            shed = await client.get(f"/v1/nodes/{node}")
            if shed.status_code == 503:
                break
            await asyncio.sleep(0.01)
        assert shed.status_code == 503 and shed.headers["retry-after"] == "1"
    finally:
        release.set()
        assert (await held).status_code == 200
    text = metrics.render()[0].decode()
    assert node not in text, "a raw path became a label value"
    assert (
        sample("dygserve_http_requests_total", route="/v1/nodes/{node}", status="503") or 0
    ) >= 1


@pytest.mark.anyio
async def test_cold_rebuilds_by_the_applier_are_counted(app_and_client) -> None:
    app, client = app_and_client
    engine = app.state.engine  # type: ignore[attr-defined]
    before = sample("dygserve_cold_rebuilds_total") or 0.0

    def events(*rows: tuple[str, str, float]) -> dict:
        return {"events": [{"src": s, "dst": d, "t": t} for s, d, t in rows]}

    r = await client.post("/v1/events", json=events(("u", "v", 1.0), ("v", "w", 2.0)))
    assert r.status_code == 200 and r.json()["accepted"] == 2
    # three new nodes: their first events are no rebuild
    assert sample("dygserve_cold_rebuilds_total") == before
    assert engine.store.delete_states(engine.runtime.version, ["u"]) == 1
    r = await client.post("/v1/events", json=events(("u", "x", 3.0)))
    assert r.status_code == 200 and r.json()["applied"]
    # u was rebuilt from its history by the applier (x is new)
    assert sample("dygserve_cold_rebuilds_total") == before + 1
    (blob,) = engine.store.read_states(engine.runtime.version, ["u"])
    assert int(engine.runtime.codec.decode_many([blob]).n_events[0]) == 2


@pytest.mark.anyio
async def test_a_compare_and_set_lost_to_another_writer_is_counted(app_and_client) -> None:
    """Between this request's read of p and its write, a second writer logs a later
    event of p and applies it (with this request's, which it finds in p's history).
    The request loses p's compare-and-set, counts it, and finds its event applied."""
    app, client = app_and_client
    engine = app.state.engine  # type: ignore[attr-defined]
    rt = engine.runtime
    before = sample("dygserve_apply_conflicts_total") or 0.0
    calls: list[int] = []

    @contextmanager
    def second_writer_between(runtime, events, _advance) -> Iterator:
        def advance(nodes, blobs, new):
            calls.append(len(nodes))
            if len(calls) == 1:
                other = [NewEvent("p", "q", 5.0)]
                logged = logged_events(other, engine.store.append_events(other))
                apply_logged(engine.store, runtime.version, logged, runtime.advance_blobs)
            return runtime.advance_blobs(nodes, blobs, new)

        yield advance

    engine.apply_watch = second_writer_between
    r = await client.post("/v1/events", json={"events": [{"src": "p", "dst": "r", "t": 4.0}]})
    assert r.status_code == 200 and r.json()["applied"]
    assert calls == [2]  # this request advanced p and r once, and nothing after
    assert sample("dygserve_apply_conflicts_total") == before + 1  # p; r was only ours
    p_blob, r_blob = engine.store.read_states(rt.version, ["p", "r"])
    assert rt.codec.decode_many([p_blob, r_blob]).n_events.tolist() == [2, 1]
