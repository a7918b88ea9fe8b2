"""Fixtures of the reliability suite: real redis-server processes with an AOF fsynced on
every write, the model runtime of the bundled checkpoint (for clean replays), and a
``figures`` recorder (printed; appended as JSON lines to $DYGSERVE_RELIABILITY_REPORT
when set, which is how docs/RELIABILITY.md gets its numbers)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from service.engine import ModelRuntime
from tests.support.redis_server import RedisServer, redis_available, start_redis

from .helpers import DEFAULT_CHECKPOINT


@pytest.fixture(scope="session")
def runtime() -> ModelRuntime:
    torch.set_num_threads(1)
    return ModelRuntime.load(DEFAULT_CHECKPOINT)


@pytest.fixture()
def redis_aof(tmp_path) -> Iterator[RedisServer]:
    """A fresh Redis with appendonly yes + appendfsync always (no acknowledged write lost)."""
    if not redis_available():
        pytest.skip("redis-server is not installed (CI installs it)")
    server = start_redis(tmp_path / "redis", appendfsync="always")
    yield server
    server.stop()


@pytest.fixture()
def figures(request) -> Iterator[dict[str, Any]]:
    out: dict[str, Any] = {}
    yield out
    if not out:
        return
    line = json.dumps({"test": request.node.name, **out}, sort_keys=True, default=str)
    print(f"\nFIGURES {line}")
    path = os.environ.get("DYGSERVE_RELIABILITY_REPORT")
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")
