"""An ingest advanced while its append runs in Redis (service/overlapped_advance.py)
writes exactly the blobs of the plain path: append, then read, advance and write.
Real redis-server, real UCI events; the plain path is the same engine with
``overlap_append=False`` on keys of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from service import metrics
from service.app import create_app
from service.engine import Engine, ModelRuntime
from service.overlapped_advance import MIN_OVERLAP_EVENTS
from service.settings import Settings
from state_store.base import NewEvent, StateStore
from state_store.factory import make_store
from state_store.redis_store import RedisStore
from tests.service.conftest import make_checkpoint
from training.data import read_edge_stream

MODELS = {
    "plain": {},
    "transition counts": {
        "transition_buckets": 16,
        "transition_decay": 259_200.0,
        "transition_order2": True,
    },
    "role counts": {"role_counts": True},
    "latest transition count read at the query": {
        "transition_buckets": 16,
        "latest_transition_count": True,
        "latest_transition_at_query": True,
    },
}


@pytest.fixture(scope="module", params=list(MODELS))
def checkpoint(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("overlap") / "ck"
    make_checkpoint(path, seed=4, **MODELS[request.param])
    return path


@pytest.fixture
def runtime(checkpoint) -> ModelRuntime:
    return ModelRuntime.load(checkpoint)


def engine(checkpoint: Path, store: StateStore, overlap: bool = True) -> Engine:
    """An engine with a runtime of its own: a runtime asks the log of the engine it
    was last given to (transition counts), so engines on other keys must not share one."""
    return Engine(ModelRuntime.load(checkpoint), store, overlap_append=overlap)


@pytest.fixture(scope="module")
def uci(data_dir):
    return read_edge_stream(data_dir / "uci", limit=4000)


def batch(stream, lo: int, hi: int, dim: int, ids: bool = True) -> list[dict[str, Any]]:
    return [
        {
            "src": str(stream.src[i]),
            "dst": str(stream.dst[i]),
            "t": float(stream.t[i]),
            "features": [0.1 * (i % 3)] * dim,
            **({"event_id": f"e{i}"} if ids else {}),
        }
        for i in range(lo, hi)
    ]


def all_blobs(store, version: str, stream, n: int) -> dict[str, bytes | None]:
    nodes = sorted({str(x) for x in stream.src[:n]} | {str(x) for x in stream.dst[:n]})
    return dict(zip(nodes, store.read_states(version, nodes), strict=True))


def engines(checkpoint: Path, url: str, name: str) -> tuple[Engine, Engine]:
    """(overlapped, plain) engines on two key prefixes of one Redis."""
    over = engine(checkpoint, make_store(url, key_prefix=f"{name}-o"))
    plain = engine(checkpoint, make_store(url, key_prefix=f"{name}-p"), overlap=False)
    return over, plain


def test_overlapped_ingest_writes_the_plain_paths_blobs(
    redis_server, checkpoint, runtime, uci
) -> None:
    redis_server.flush()
    over, plain = engines(checkpoint, redis_server.url, "same")
    assert over.store.appends_in_background
    dim = runtime.config.edge_feature_dim
    before = metrics.ADVANCED_DURING_APPEND._value.get()
    # batches of several sizes, with and without ids, the first one on an empty store
    cuts = [0, 500, 540, 1500, 1533, 2600, 4000]
    for k, (lo, hi) in enumerate(zip(cuts, cuts[1:], strict=False)):
        events = batch(uci, lo, hi, dim, ids=k % 2 == 0)
        a, b = over.ingest(events), plain.ingest(events)
        assert a.applied and b.applied and a.accepted == b.accepted == hi - lo
    taken = metrics.ADVANCED_DURING_APPEND._value.get() - before
    assert taken > 0  # the prepared blobs were used, not only the plain advance
    got = all_blobs(over.store, runtime.version, uci, 4000)
    want = all_blobs(plain.store, runtime.version, uci, 4000)
    assert got == want


def test_duplicates_and_late_events_fall_back_to_the_plain_advance(
    redis_server, checkpoint, runtime, uci
) -> None:
    redis_server.flush()
    over, plain = engines(checkpoint, redis_server.url, "mixed")
    dim = runtime.config.edge_feature_dim
    first = batch(uci, 0, 600, dim)
    for e in (over, plain):
        assert e.ingest(first).applied
    # a retry of half the batch, the next events, and one event older than its source's
    # last: duplicates and a refusal in one request
    second = first[300:] + batch(uci, 600, 900, dim)
    late = dict(second[-1], t=float(uci.t[0]) - 1.0, event_id="late")
    second.append(late)
    a, b = over.ingest(second), plain.ingest(second)
    assert (a.accepted, a.duplicates, len(a.rejected)) == (300, 300, 1)
    assert (b.accepted, b.duplicates, len(b.rejected)) == (300, 300, 1)
    assert all_blobs(over.store, runtime.version, uci, 900) == all_blobs(
        plain.store, runtime.version, uci, 900
    )


class WriterBetween(RedisStore):
    """Another writer logs and applies an event of a shared node after this store's
    read of the states and before its append."""

    other: Engine | None = None
    event: dict[str, Any] | None = None

    def begin_append(self, events: list[NewEvent]):  # type: ignore[override]
        if self.other is not None and self.event is not None:
            assert self.other.ingest([self.event]).applied
            self.event = None
        return super().begin_append(events)


def test_a_writer_between_the_read_and_the_append(redis_server, checkpoint, runtime, uci) -> None:
    """The prepared blobs of the shared node are stale: its compare-and-set (or the
    fast path's check of its seq) sends it to the plain advance, and the states end as
    a single writer's of all the events in log order."""
    redis_server.flush()
    url, dim = redis_server.url, runtime.config.edge_feature_dim
    store = WriterBetween(url=url, key_prefix="between-o")
    over = engine(checkpoint, store)
    store.other = engine(checkpoint, RedisStore(url=url, key_prefix="between-o"))
    plain = engine(checkpoint, make_store(url, key_prefix="between-p"), overlap=False)
    first, second = batch(uci, 0, 400, dim), batch(uci, 400, 800, dim)
    for e in (over, plain):
        assert e.ingest(first).applied
    # the other writer's event: the source of the second batch's first event, just
    # before that event's time
    between = dict(second[0], t=float(uci.t[399]), event_id="between")
    store.event = between
    assert over.ingest(second).applied
    assert plain.ingest([between]).applied and plain.ingest(second).applied
    assert all_blobs(over.store, runtime.version, uci, 800) == all_blobs(
        plain.store, runtime.version, uci, 800
    )


def test_scripts_flushed_before_an_overlapped_append(
    redis_server, checkpoint, runtime, uci
) -> None:
    """A Redis that lost its scripts (restart, SCRIPT FLUSH) answers NOSCRIPT to the
    sent append: it is loaded and run again, once."""
    redis_server.flush()
    over, plain = engines(checkpoint, redis_server.url, "noscript")
    dim = runtime.config.edge_feature_dim
    events = batch(uci, 0, MIN_OVERLAP_EVENTS * 4, dim)
    assert over.ingest(events[:MIN_OVERLAP_EVENTS]).applied  # scripts loaded
    redis.Redis.from_url(redis_server.url).script_flush()
    assert over.ingest(events[MIN_OVERLAP_EVENTS:]).accepted == len(events) - MIN_OVERLAP_EVENTS
    for part in (events[:MIN_OVERLAP_EVENTS], events[MIN_OVERLAP_EVENTS:]):
        assert plain.ingest(part).applied
    assert all_blobs(over.store, runtime.version, uci, len(events)) == all_blobs(
        plain.store, runtime.version, uci, len(events)
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize("overlap", [True, False])
async def test_the_setting_reaches_the_service(redis_server, checkpoint, uci, overlap) -> None:
    """``ingest_overlap`` decides the path of ``POST /v1/events`` (real app, real Redis):
    the metric of prepared blobs moves only with it on, and the states are the same."""
    redis_server.flush()
    settings = Settings(
        checkpoint=checkpoint, store={"url": redis_server.url}, ingest_overlap=overlap
    )
    app = create_app(settings)
    rt = ModelRuntime.load(checkpoint)
    before = metrics.ADVANCED_DURING_APPEND._value.get()
    async with app.router.lifespan_context(app):
        assert app.state.engine.overlap_append is overlap  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://in-process") as c:
            for lo in (0, 300):
                body = {"events": batch(uci, lo, lo + 300, rt.config.edge_feature_dim)}
                r = await c.post("/v1/events", json=body)
                assert r.status_code == 200 and r.json()["applied"], r.text
    moved = metrics.ADVANCED_DURING_APPEND._value.get() - before
    assert (moved > 0) is overlap
    plain = engine(checkpoint, make_store(redis_server.url, key_prefix="setting-p"), overlap=False)
    for lo in (0, 300):
        assert plain.ingest(batch(uci, lo, lo + 300, rt.config.edge_feature_dim)).applied
    served = make_store(redis_server.url)
    assert all_blobs(served, rt.version, uci, 600) == all_blobs(plain.store, rt.version, uci, 600)
