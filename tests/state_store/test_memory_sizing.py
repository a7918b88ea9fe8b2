"""The sizing rule of docs/STATE_STORE.md (``state_store.sizing``) against a real
Redis: ingest UCI events through the store and the bundled checkpoint's applier, then
compare the rule's estimate with how much ``used_memory`` grew, and each part of it
with ``MEMORY USAGE`` of the keys of that kind. ``RedisStore.memory`` reports the
figures the service exports as metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from model.checkpoint import BUNDLED_CHECKPOINT
from service.engine import ModelRuntime
from state_store.applier import apply_logged, logged_events
from state_store.base import NewEvent
from state_store.redis_store import RedisStore
from state_store.sizing import (
    HISTORY_ENTRY_BYTES,
    SizingInput,
    estimate_bytes,
    state_bytes,
)
from tests.support.redis_server import RedisServer, redis_available, start_redis
from tests.support.store_model import uci_events

N_EVENTS = 8000
TOLERANCE = 0.2


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    if not redis_available():
        pytest.skip("redis-server is not installed (CI installs it)")
    s = start_redis(tmp_path / "r")
    yield s
    s.stop()


def test_sizing_rule_matches_a_real_redis(server: RedisServer) -> None:
    runtime = ModelRuntime.load(BUNDLED_CHECKPOINT)
    store = RedisStore(url=server.url)
    admin = server.client()
    try:
        store.load_scripts()
        base = store.memory()
        assert base is not None and base.used_bytes > 0 and base.max_bytes == 0
        rows = uci_events(N_EVENTS)
        events = [NewEvent(e.src, e.dst, e.t, e.features, f"uci-{i}") for i, e in enumerate(rows)]
        for i in range(0, len(events), 500):
            batch = events[i : i + 500]
            with torch.no_grad():
                apply_logged(
                    store,
                    runtime.version,
                    logged_events(batch, store.append_events(batch)),
                    runtime.advance_blobs,
                )
        grown = store.memory().used_bytes - base.used_bytes  # type: ignore[union-attr]

        degree: Counter[str] = Counter()
        for e in events:
            degree[e.src] += 1
            if e.dst != e.src:
                degree[e.dst] += 1
        cap = store.config.history_cap
        estimate = estimate_bytes(
            SizingInput(
                events_in_histories=sum(min(d, cap) for d in degree.values()),
                log_entries=min(len(events), store.config.log_keep),
                event_ids=len(events),
                nodes=len(degree),
                blob_bytes=runtime.codec.blob_size,
            )
        )
        assert abs(estimate - grown) <= TOLERANCE * grown, (estimate, grown)

        # and its two big parts, key by key
        by_kind: Counter[str] = Counter()
        for key in admin.scan_iter(count=1000):
            kind = "state" if b":s:" in key else "history" if b":h:" in key else "other"
            by_kind[kind] += int(admin.memory_usage(key, samples=0))
        states = len(degree) * state_bytes(runtime.codec.blob_size)
        histories = sum(degree.values()) * HISTORY_ENTRY_BYTES
        assert abs(by_kind["state"] - states) <= TOLERANCE * states, (by_kind, states)
        assert abs(by_kind["history"] - histories) <= TOLERANCE * histories, (by_kind, histories)
    finally:
        store.close()
        admin.close()


def test_memory_reports_limit_policy_and_evictions(server: RedisServer) -> None:
    """A full Redis under volatile-lru evicts state blobs (they carry a TTL) and
    nothing of the log: the eviction count ``memory()`` reports grows, and every
    history and the log are intact."""
    store = RedisStore(url=server.url, state_ttl_s=3600.0)
    admin = server.client()
    try:
        events = [NewEvent(f"a{i}", f"b{i}", float(i), (), f"e{i}") for i in range(200)]
        store.append_events(events)
        admin.config_set("maxmemory-policy", "volatile-lru")
        used = store.memory().used_bytes  # type: ignore[union-attr]
        admin.config_set("maxmemory", used + 300_000)
        blob = b"\0" * 64 + b"x" * 20_000
        for i in range(200):  # ~4 MB of blobs into 300 kB of room
            store.write_states("v1", {f"n{i}": blob}, {f"n{i}": None})
        m = store.memory()
        assert m is not None
        assert m.policy == "volatile-lru" and m.max_bytes == used + 300_000
        assert m.evicted_keys > 0
        assert (
            sum(b is not None for b in store.read_states("v1", [f"n{i}" for i in range(200)])) < 200
        )
        histories = store.read_histories([f"a{i}" for i in range(200)])
        assert [len(h) for h in histories] == [1] * 200
        assert len(store.read_log(0, 1000)) == 200
    finally:
        store.close()
        admin.close()


@pytest.mark.parametrize("backend", ["memory", "redis", "cluster"])
def test_memory_on_every_backend(make, backend: str) -> None:
    """Redis: the server's figures (a cluster's summed over its masters); the
    embedded store has none."""
    m = make().memory()
    if backend == "memory":
        assert m is None
        return
    assert m is not None and m.used_bytes > 500_000 and m.evicted_keys >= 0
    if backend == "cluster":  # three masters, each over half a megabyte when idle
        assert m.used_bytes > 1_500_000
