"""Opening a store: ``open_store(config)`` for a typed config, ``make_store(url, ...)``
for the URL form that the CLI, the tools and the tests use.

URLs:

* ``None`` (or ``""``, ``memory://``): the embedded ``InMemoryStore`` (one process, not
  persistent).
* ``redis://``, ``rediss://``, ``unix://``: ``RedisStore`` on one server.
* ``redis+cluster://host:port[,host:port...]`` (or ``rediss+cluster://``): ``RedisStore``
  on Redis Cluster.
"""

from __future__ import annotations

from typing import Any

from .base import StateStore
from .config import MemoryStoreConfig, RedisStoreConfig, StoreConfig
from .layout import recorded_partitions
from .memory import InMemoryStore
from .partitioned_store import PartitionedRedisStore
from .redis_store import RedisStore


def is_memory_url(url: str | None) -> bool:
    return not url or url.strip().lower() in ("memory", "memory://")


def store_config(url: str | None, **options: Any) -> StoreConfig:
    """The config of the backend ``url`` names, with ``options`` (fields of either
    backend's config; those the chosen backend does not have, such as a Redis key
    prefix for the embedded store, are left out)."""
    if is_memory_url(url):
        known = MemoryStoreConfig.model_fields
        return MemoryStoreConfig(**{k: v for k, v in options.items() if k in known})
    known = RedisStoreConfig.model_fields
    return RedisStoreConfig(
        url=url, **{k: v for k, v in options.items() if k in known and k != "url"}
    )


def open_store(config: StoreConfig) -> StateStore:
    if isinstance(config, MemoryStoreConfig):
        return InMemoryStore(config)
    if config.partition_count > 1:
        return PartitionedRedisStore(config)
    return RedisStore(config)


def make_store(url: str | None, **options: Any) -> StateStore:
    return open_store(store_config(url, **options))


def make_store_as_recorded(url: str | None, **options: Any) -> StateStore:
    """For offline tools (``dygserve backfill``): the store of ``url`` opened with the
    number of log partitions recorded in it (1 where none is), whatever the options say,
    so that a tool never reads a partitioned store as an empty single-slot one."""
    store = make_store(url, **{k: v for k, v in options.items() if k != "partitions"})
    if not isinstance(store, RedisStore):
        return store
    recorded = recorded_partitions(store.client, store.config.key_prefix)
    if recorded is None or recorded == store.partitions:
        return store
    store.close()
    return make_store(url, **{**options, "partitions": recorded})
