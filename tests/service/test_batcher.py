"""Dynamic batching of score requests (``service.batcher.ScoreBatcher``) on a real
engine: concurrent requests share model calls and each still gets its own scores."""

from __future__ import annotations

import asyncio

import pytest

from model.checkpoint import load_checkpoint
from service.batcher import ScoreBatcher
from service.engine import Engine, ModelRuntime
from service.settings import DEFAULT_CHECKPOINT
from state_store.base import StoreUnavailable
from state_store.factory import make_store
from tests.support.redis_server import free_port
from tests.support.store_model import uci_events


class CountingEngine(Engine):
    """The real engine, counting its scoring calls and their sizes."""

    calls: list[int]

    def score_pairs(self, pairs):
        self.calls.append(len(pairs))
        return super().score_pairs(pairs)


@pytest.fixture(scope="module")
def engine() -> CountingEngine:
    eng = CountingEngine(ModelRuntime(load_checkpoint(DEFAULT_CHECKPOINT)), make_store(None))
    events = [{"src": e.src, "dst": e.dst, "t": e.t} for e in uci_events(2000)]
    for lo in range(0, len(events), 500):
        eng.ingest(events[lo : lo + 500])
    eng.calls = []
    return eng


def _requests(engine: Engine, n: int) -> list[list[tuple[str, str, float | None]]]:
    ids = sorted({e.src for e in uci_events(2000)})
    return [
        [
            (ids[(7 * k + j) % len(ids)], ids[(11 * k + 3 * j) % len(ids)], 5e6 + k)
            for j in range(1 + k % 5)
        ]
        for k in range(n)
    ]


def test_concurrent_requests_share_calls_and_get_their_own_scores(engine: CountingEngine) -> None:
    requests = _requests(engine, 40)
    want = [engine.score_pairs(r)[0] for r in requests]
    engine.calls.clear()
    batcher = ScoreBatcher(lambda: engine, max_pairs=64)

    async def all_at_once():
        return await asyncio.gather(*(batcher.score(r) for r in requests))

    got = asyncio.run(all_at_once())
    for w, (g, version) in zip(want, got, strict=True):
        assert version == engine.runtime.version
        assert [(p.src, p.dst, p.t) for p in g] == [(p.src, p.dst, p.t) for p in w]
        assert max(abs(a.logit - b.logit) for a, b in zip(g, w, strict=True)) < 1e-5
    assert sum(engine.calls) == sum(len(r) for r in requests)
    assert len(engine.calls) < len(requests)  # shared calls
    assert max(engine.calls) <= 64


def test_an_oversized_request_is_one_call_of_its_own(engine: CountingEngine) -> None:
    engine.calls.clear()
    big = [p for r in _requests(engine, 30) for p in r]
    scored, _ = asyncio.run(ScoreBatcher(lambda: engine, max_pairs=8).score(big))
    assert len(scored) == len(big) and engine.calls == [len(big)]


def test_a_failed_call_fails_every_request_in_it() -> None:
    dead = make_store(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.5)
    engine = Engine(ModelRuntime(load_checkpoint(DEFAULT_CHECKPOINT)), dead)
    batcher = ScoreBatcher(lambda: engine)

    async def two():
        return await asyncio.gather(
            batcher.score([("a", "b", 1.0)]),
            batcher.score([("c", "d", 1.0)]),
            return_exceptions=True,
        )

    results = asyncio.run(two())
    assert all(isinstance(r, StoreUnavailable) for r in results), results


@pytest.fixture(scope="module")
def redis_engine(redis_server) -> CountingEngine:
    eng = CountingEngine(
        ModelRuntime(load_checkpoint(DEFAULT_CHECKPOINT)), make_store(redis_server.url)
    )
    eng.calls = []
    events = [{"src": e.src, "dst": e.dst, "t": e.t} for e in uci_events(2000)]
    for lo in range(0, len(events), 500):
        eng.ingest(events[lo : lo + 500])
    return eng


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_small_calls_score_on_the_loop_with_the_same_numbers(store, request) -> None:
    engine = request.getfixturevalue("engine" if store == "memory" else "redis_engine")
    requests = _requests(engine, 12)
    want = [engine.score_pairs(r)[0] for r in requests]
    engine.calls = []
    batcher = ScoreBatcher(lambda: engine, max_pairs=64, loop_max_pairs=16)

    async def one_by_one():
        out = [await batcher.score(r) for r in requests]
        await engine.store.aclose()
        return out

    got = asyncio.run(one_by_one())
    for w, (g, version) in zip(want, got, strict=True):
        assert version == engine.runtime.version
        assert [(p.src, p.dst, p.t, p.src_age, p.dst_age, p.src_inductive) for p in g] == [
            (p.src, p.dst, p.t, p.src_age, p.dst_age, p.src_inductive) for p in w
        ]
        assert max(abs(a.logit - b.logit) for a, b in zip(g, w, strict=True)) == 0.0
    assert engine.calls == []  # no worker-thread call: every node had a cached state


def test_what_the_loop_cannot_score_goes_to_a_worker(redis_engine: CountingEngine) -> None:
    """Unknown nodes (their history must be read), pairs without a time (the clock is
    another read) and calls above the limit take the blocking path, with its answers."""
    known = _requests(redis_engine, 1)[0][0]
    unknown = [("never-seen-node", known[1], 5e6)]
    no_time = [(known[0], known[1], None)]
    big = [p for r in _requests(redis_engine, 10) for p in r][:17]
    redis_engine.calls = []
    batcher = ScoreBatcher(lambda: redis_engine, max_pairs=64, loop_max_pairs=16)

    async def each():
        out = [await batcher.score(r) for r in (unknown, no_time, big)]
        await redis_engine.store.aclose()
        return out

    (u, _), (n, _), (b, _) = asyncio.run(each())
    assert redis_engine.calls == [1, 1, 17]
    assert u[0].src_inductive and not u[0].dst_inductive
    assert n[0].t == redis_engine.store.last_event_time() and len(b) == 17


def test_numpy_and_torch_kernels_give_the_engine_the_same_scores(engine: CountingEngine) -> None:
    """Calls up to ``numpy_max_pairs`` read out in numpy, bigger ones in torch: the same
    pairs through either kernel (and with repeated nodes, unknown nodes and mixed times)
    get the same answers."""
    pairs = [p for r in _requests(engine, 30) for p in r] + [
        ("never-seen-node", "also-unknown", 5e6)
    ]
    assert len(pairs) > 20
    by_numpy, _ = engine.score_pairs(pairs)
    engine.numpy_max_pairs = 0
    try:
        by_torch, _ = engine.score_pairs(pairs)
        engine.numpy_max_pairs = len(pairs) - 1  # one over the limit: torch again
        over_limit, _ = engine.score_pairs(pairs)
    finally:
        engine.numpy_max_pairs = 256
    assert engine.runtime.numpy_scorer is not None
    for a, b, c in zip(by_numpy, by_torch, over_limit, strict=True):
        assert (a.src, a.dst, a.t, a.src_age, a.dst_age, a.src_inductive, a.dst_inductive) == (
            b.src,
            b.dst,
            b.t,
            b.src_age,
            b.dst_age,
            b.src_inductive,
            b.dst_inductive,
        )
        assert abs(a.logit - b.logit) < 2e-5 and b.logit == c.logit
    assert len({round(p.logit, 4) for p in by_numpy}) > 10  # real, varied scores
