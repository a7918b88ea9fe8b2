"""``make_store(url, **options)``: the store a URL names.

* ``None`` (or ``""``, ``memory://``): the embedded ``InMemoryStore`` (one process, not
  persistent). Redis-only options (``socket_timeout``, ``key_prefix``) are ignored.
* ``redis://``, ``rediss://``, ``unix://``: ``RedisStore`` on one server.
* ``redis+cluster://host:port[,host:port...]`` (or ``rediss+cluster://``): ``RedisStore``
  on Redis Cluster.

``options`` are the fields of ``RedisStoreConfig`` / ``MemoryStoreConfig``
(``state_ttl_s``, ``history_cap``, ``dedupe_ttl_s``, ``max_future_skew``, ``log_keep``,
``socket_timeout``, ``key_prefix``). An option given as ``None`` keeps its default,
except where ``None`` is a setting of its own ("off": ``state_ttl_s``,
``dedupe_ttl_s``, ``max_future_skew``, ``socket_timeout``).
"""

from __future__ import annotations

from typing import Any

from .base import StateStore
from .common import MemoryStoreConfig, RedisStoreConfig

_NONE_MEANS_OFF = {"state_ttl_s", "dedupe_ttl_s", "max_future_skew", "socket_timeout"}
_REDIS_ONLY = set(RedisStoreConfig.model_fields) - set(MemoryStoreConfig.model_fields)


def make_store(url: str | None, **options: Any) -> StateStore:
    opts = {k: v for k, v in options.items() if v is not None or k in _NONE_MEANS_OFF}
    if not url or url.strip().lower() in ("memory", "memory://"):
        from .memory import InMemoryStore

        mem = {k: v for k, v in opts.items() if k not in _REDIS_ONLY}
        return InMemoryStore(MemoryStoreConfig(**mem))
    from .redis_store import RedisStore

    opts.pop("url", None)
    return RedisStore(RedisStoreConfig(url=url, **opts))
