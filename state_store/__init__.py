"""State store: node-state blobs, the event log, and the exactly-once applier.

``open_store(config)`` opens the backend a typed config names, ``make_store(url)``
the one a URL names: the embedded ``InMemoryStore`` (no URL),
``RedisStore`` on one server (``redis://``) or on Redis Cluster (``redis+cluster://``).
See docs/STATE_STORE.md.
"""

from .base import (
    STORE_ERROR_REASONS,
    AppendResult,
    EventLog,
    LoggedEvent,
    NewEvent,
    StateStore,
    StateTable,
    StoreUnavailable,
    WriteOutcome,
)
from .config import MemoryStoreConfig, RedisStoreConfig, StoreConfig
from .factory import make_store, open_store, store_config

__all__ = [
    "AppendResult",
    "EventLog",
    "LoggedEvent",
    "MemoryStoreConfig",
    "NewEvent",
    "RedisStoreConfig",
    "STORE_ERROR_REASONS",
    "StateStore",
    "StateTable",
    "StoreConfig",
    "StoreUnavailable",
    "WriteOutcome",
    "make_store",
    "open_store",
    "store_config",
]
