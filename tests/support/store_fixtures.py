"""Real Redis servers for the tests that run on every store backend (the store
contract, the store bench): one single server and one 3-master cluster per session,
on free loopback ports, flushed before every test that uses them. Skipped (not
failed) only when redis-server is not installed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from state_store.base import StateStore
from state_store.factory import make_store
from tests.support.redis_server import (
    RedisClusterServers,
    RedisServer,
    redis_available,
    start_cluster,
    start_redis,
)

BACKENDS = ["memory", "redis", "cluster"]


def _need_redis() -> None:
    if not redis_available():
        pytest.skip("redis-server/redis-cli not installed (CI installs them)")


@pytest.fixture(scope="session")
def redis_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    _need_redis()
    server = start_redis(tmp_path_factory.mktemp("redis-single"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    _need_redis()
    cluster = start_cluster(tmp_path_factory.mktemp("redis-cluster"), masters=3)
    yield cluster
    cluster.stop()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Every test that uses ``make`` runs on each backend, unless it parametrizes
    ``backend`` itself (e.g. ``REDIS_BACKENDS``)."""
    return request.param


@pytest.fixture
def store_url(request: pytest.FixtureRequest, backend: str) -> str | None:
    """The URL of a freshly flushed server of the test's backend (None = in-memory).
    The servers are started on first use only."""
    if backend == "memory":
        return None
    server = request.getfixturevalue("redis_single" if backend == "redis" else "redis_cluster")
    server.flush()
    return server.url


@pytest.fixture
def make(store_url: str | None) -> Iterator[Callable[..., StateStore]]:
    """``make(**options)`` -> a store of the test's backend on an empty key space."""
    url = store_url
    stores: list[StateStore] = []

    def _make(**options: Any) -> StateStore:
        s = make_store(url, **options)
        stores.append(s)
        return s

    yield _make
    for s in stores:
        s.close()
