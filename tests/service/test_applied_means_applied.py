"""``"applied": true`` means every event of the request is applied (issue 15, defect 5).

A request whose apply failed leaves its events logged and pending until the re-drive.
Its retry finds them all duplicates; it used to answer ``applied: true`` while the
states still lacked them. Now a retry with ``wait=true`` applies what is pending of
its own events before answering (read-your-writes), and one with ``wait=false`` says
``applied: false`` until they are.

The failed apply is the state ``Engine.log_events`` leaves behind (logged, nothing
applied): exactly what a store error between logging and applying leaves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service.app import create_app
from service.engine import Engine, ModelRuntime
from service.settings import Settings
from state_store.redis_store import RedisStore

from .conftest import make_checkpoint


def wire(prefix: str, n: int) -> list[dict]:
    return [
        {
            "src": f"{prefix}-hub",
            "dst": f"{prefix}-{i}",
            "t": float(i),
            "features": [0.5, -1.0],
            "event_id": f"{prefix}-e{i}",
        }
        for i in range(n)
    ]


def test_a_retry_of_pending_duplicates_applies_them(redis_server, models_dir):
    redis_server.flush()
    store = RedisStore(url=redis_server.url)
    engine = Engine(ModelRuntime.load(models_dir / "a"), store)
    rows = wire("p", 6)
    first, _ = engine.log_events(engine.runtime, rows)  # logged; the apply "failed"
    assert first.accepted == 6 and len(store.pending(100)) == 6

    retry = engine.ingest(rows)  # the client's retry, wait=true
    assert retry.accepted == 0 and retry.duplicates == 6
    assert retry.applied is True
    assert store.pending(100) == []  # applied by the retry, not left for the re-drive
    hub = engine.node_summary("p-hub")
    assert hub.cached and hub.events_applied == hub.history_length == 6
    assert engine.node_summary("p-3").events_applied == 1

    again = engine.ingest(rows)  # nothing pending any more: still applied, nothing redone
    assert again.applied is True and engine.node_summary("p-hub").events_applied == 6
    store.close()


def test_only_the_requests_own_pending_events_are_looked_up(redis_server, models_dir):
    """Pending events of other requests do not make a retry's answer false, and a
    retry finds its own among more than one page of pending events."""
    redis_server.flush()
    store = RedisStore(url=redis_server.url)
    engine = Engine(ModelRuntime.load(models_dir / "a"), store)
    engine.log_events(engine.runtime, wire("other", 1500))  # someone else's, pending
    mine = wire("mine", 3)
    engine.log_events(engine.runtime, mine)  # pending, behind a page and a half of others
    retry = engine.ingest(mine)
    assert retry.applied is True
    assert engine.node_summary("mine-hub").events_applied == 3
    pending_ids = {e.event_id for e in store.pending(10_000)}
    assert not any(i.startswith("mine-") for i in pending_ids)
    assert len(pending_ids) == 1500  # the others are the re-drive's (or their retries') to apply
    store.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def app_client(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Engine]]:
    make_checkpoint(tmp_path / "models" / "a", seed=0)
    app = create_app(Settings(checkpoint=tmp_path / "models" / "a"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://in-process") as c:
            yield c, app.state.engine


@pytest.mark.anyio
async def test_the_route_reports_pending_duplicates_as_not_applied_without_wait(app_client):
    client, engine = app_client
    rows = wire("w", 3)
    engine.log_events(engine.runtime, rows)  # logged, apply "failed"
    r = await client.post("/v1/events", params={"wait": "false"}, json={"events": rows})
    assert r.status_code == 200
    assert r.json()["duplicates"] == 3 and r.json()["applied"] is False
    r = await client.post("/v1/events", json={"events": rows})  # wait=true
    assert r.json() == {"accepted": 0, "duplicates": 3, "rejected": [], "applied": True}
    node = (await client.get("/v1/nodes/w-hub")).json()
    assert node["events_applied"] == node["history_length"] == 3


def test_an_id_repeated_inside_a_request_is_applied_once(redis_server, models_dir):
    """The second copy is a duplicate of the event this very request logged: it is not
    taken for an earlier attempt's pending event (which applied it twice to a new node)."""
    redis_server.flush()
    store = RedisStore(url=redis_server.url)
    engine = Engine(ModelRuntime.load(models_dir / "a"), store)
    earlier = wire("r", 1)
    engine.log_events(engine.runtime, earlier)  # an earlier attempt, still pending
    twice = {"src": "n-a", "dst": "n-b", "t": 5.0, "features": [0.5, -1.0], "event_id": "x"}
    rows = [earlier[0], twice, dict(twice, dst="n-c", t=6.0)]
    out = engine.ingest(rows)
    assert out.accepted == 1 and out.duplicates == 2 and out.applied is True
    new = engine.node_summary("n-a")
    assert new.events_applied == new.history_length == 1
    assert engine.node_summary("r-hub").events_applied == 1
    assert engine.node_summary("n-c").history_length == 0
    assert store.pending(10) == []
    store.close()


def test_a_retry_behind_a_long_backlog_does_not_claim_applied(
    redis_server, models_dir, monkeypatch
):
    """The scan for its own pending events is bounded (a backlog after an outage can be
    long); what it did not find it cannot call applied, and the re-drive is due."""
    import service.engine as engine_module

    monkeypatch.setattr(engine_module, "PENDING_PAGES_MAX", 1)  # one page of 1,000
    redis_server.flush()
    store = RedisStore(url=redis_server.url)
    engine = Engine(ModelRuntime.load(models_dir / "a"), store)
    engine.log_events(engine.runtime, wire("backlog", 1500))
    mine = wire("late", 2)
    engine.log_events(engine.runtime, mine)  # pending behind the first page
    engine.needs_redrive = False
    retry = engine.ingest(mine)
    assert retry.duplicates == 2 and retry.applied is False
    assert engine.needs_redrive is True
    engine.redrive()
    assert engine.ingest(mine).applied is True
    assert engine.node_summary("late-hub").events_applied == 2
    store.close()
