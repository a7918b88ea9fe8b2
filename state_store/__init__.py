"""State store: node-state blobs, the event log, and the exactly-once applier.

``make_store(url)`` picks the backend: the embedded ``InMemoryStore`` (no URL),
``RedisStore`` on one server (``redis://``) or on Redis Cluster (``redis+cluster://``).
See docs/STATE_STORE.md.
"""

from .base import (
    AppendResult,
    LoggedEvent,
    NewEvent,
    StateStore,
    StoreUnavailable,
    WriteOutcome,
)
from .common import MemoryStoreConfig, RedisStoreConfig
from .factory import make_store

__all__ = [
    "AppendResult",
    "LoggedEvent",
    "MemoryStoreConfig",
    "NewEvent",
    "RedisStoreConfig",
    "StateStore",
    "StoreUnavailable",
    "WriteOutcome",
    "make_store",
]
