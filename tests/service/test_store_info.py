"""The store's memory figures for /metrics (service.store_info): sampled in the
background, at most once per interval, from a real Redis; and the warning for an
eviction policy that cannot work with this service's keys."""

from __future__ import annotations

import asyncio
import logging

from service.metrics import STORE_MEMORY
from service.store_info import StoreInfoSampler, eviction_warning
from state_store.redis_store import RedisStore


def test_eviction_warning() -> None:
    assert eviction_warning("volatile-lru", 3600.0) is None
    assert eviction_warning("noeviction", None) is None
    assert "no key has a TTL" in (eviction_warning("volatile-lru", None) or "")
    assert "event log" in (eviction_warning("allkeys-lru", 3600.0) or "")


def test_sampler_reads_a_real_redis_once_per_interval(redis_server, caplog) -> None:
    store = RedisStore(url=redis_server.url)
    calls = 0
    real = store.memory

    def counted():  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return real()

    store.memory = counted  # type: ignore[method-assign]
    admin = redis_server.client()
    admin.config_set("maxmemory-policy", "volatile-lru")
    try:

        async def scrapes() -> None:
            sampler = StoreInfoSampler(interval_s=3600.0, state_ttl_s=None)
            STORE_MEMORY.sample = None
            for _ in range(50):  # a scrape storm: one sample
                sampler.poke(store)
                await asyncio.sleep(0.01)
            assert sampler._task is not None
            await sampler._task

        with caplog.at_level(logging.WARNING, logger="dygserve"):
            asyncio.run(scrapes())
        assert calls == 1
        assert STORE_MEMORY.sample is not None and STORE_MEMORY.sample.used_bytes > 0
        assert STORE_MEMORY.sample.policy == "volatile-lru"
        assert any("no key has a TTL" in r.getMessage() for r in caplog.records)
    finally:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.close()
        store.close()
        STORE_MEMORY.sample = None
