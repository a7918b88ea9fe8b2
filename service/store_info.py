"""Samples the store's memory figures (``StateStore.memory``: Redis INFO) for the
metrics in ``service.metrics.STORE_MEMORY``.

A scrape of /metrics starts a sample when the last one is older than the interval and
none is running, and answers at once with the last one: the INFO round trip runs in
a worker thread, off the request, so a slow or unreachable Redis never slows a scrape
and the figures cost one INFO per interval, whatever the request rate.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from starlette.concurrency import run_in_threadpool

from state_store.base import StateStore

from .metrics import STORE_MEMORY

log = logging.getLogger("dygserve")


def eviction_warning(policy: str, state_ttl_s: float | None) -> str | None:
    """What is wrong with the store's eviction policy for this service, if anything.

    Only state blobs may go (a cold node is rebuilt from its history); the log,
    histories, pending set and event ids must stay. So: ``volatile-*`` with a state TTL
    (blobs evictable), or ``noeviction`` (a full store refuses writes with 503s)."""
    if policy.startswith("allkeys-"):
        return (
            f"the store's maxmemory-policy is {policy}: it may evict the event log and "
            "histories (acknowledged events lost); use volatile-lru with DYGSERVE_STATE_TTL_S"
        )
    if policy.startswith("volatile-") and state_ttl_s is None:
        return (
            f"the store's maxmemory-policy is {policy} but no key has a TTL "
            "(DYGSERVE_STATE_TTL_S unset): nothing can be evicted, a full store refuses writes"
        )
    return None


class StoreInfoSampler:
    def __init__(self, interval_s: float, state_ttl_s: float | None = None) -> None:
        self.interval_s = interval_s
        self.state_ttl_s = state_ttl_s
        self.warned: str | None = None  # the last warning logged (each one once)
        self._started_at = -math.inf
        self._task: asyncio.Task[None] | None = None

    def poke(self, store: StateStore) -> None:
        """On the event loop: start a sample in the background if one is due."""
        if self._task is not None and not self._task.done():
            return
        now = time.monotonic()
        if now - self._started_at < self.interval_s:
            return
        self._started_at = now  # a failed sample waits for the next interval too
        self._task = asyncio.get_running_loop().create_task(self._sample(store))

    async def _sample(self, store: StateStore) -> None:
        try:
            sample = await run_in_threadpool(store.memory)
        except Exception as exc:  # the last sample stays; the store's errors show elsewhere
            log.debug("store memory sample failed: %s", exc)
            return
        STORE_MEMORY.sample = sample
        warning = eviction_warning(sample.policy, self.state_ttl_s) if sample else None
        if warning is not None and warning != self.warned:
            log.warning(warning)
        self.warned = warning
