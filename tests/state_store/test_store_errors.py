"""Store errors with a name (state_store.base.STORE_ERROR_REASONS) against real
redis-server processes: each condition is caused for real (a full Redis under
``noeviction``, a read-only replica, a script past its time limit, a replica whose
master is gone) and must come out as ``StoreUnavailable`` with its reason, and a
refused call must change nothing. The service answers every one of them 503
(tests/reliability/test_full_redis.py, tests/service/test_store_errors_http.py)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.exceptions as rex

from state_store.applier import ApplyConflictError
from state_store.base import STORE_ERROR_REASONS, NewEvent, StoreUnavailable
from state_store.redis_store import RedisStore, store_error_reason
from tests.support.redis_server import RedisServer, redis_available, start_redis

from .test_store_semantics import V1, blob


@pytest.fixture
def server(tmp_path) -> Iterator[RedisServer]:
    if not redis_available():
        pytest.skip("redis-server is not installed (CI installs it)")
    s = start_redis(tmp_path / "r", extra_args=["--maxmemory-policy", "noeviction"])
    yield s
    s.stop()


def events(prefix: str, n: int, t0: float = 0.0) -> list[NewEvent]:
    return [
        NewEvent(f"{prefix}{i % 7}", f"{prefix}x{i % 5}", t0 + i, (), f"{prefix}-{i}")
        for i in range(n)
    ]


def digest(client: redis.Redis) -> str:
    """Every key with its type, value and TTL flag: equal digests mean nothing changed."""
    h = hashlib.sha256()
    for key in sorted(client.keys("*")):
        h.update(key + client.type(key))
        h.update(client.dump(key) or b"")
        h.update(b"ttl" if client.pttl(key) > 0 else b"-")
    return h.hexdigest()


def fill_up(client: redis.Redis) -> None:
    """Make the server full: maxmemory just below what it uses now."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", max(used - 64 * 1024, 1024 * 1024))
    assert int(client.info("memory")["used_memory"]) > int(
        client.config_get("maxmemory")["maxmemory"]
    )


def test_full_redis_refuses_appends_and_writes_whole_and_recovers(server) -> None:
    store = RedisStore(url=server.url)
    admin = server.client()
    try:
        store.append_events(events("a", 50))
        store.write_states(V1, {"a0": blob(1.0, 1)}, {"a0": None})
        admin.set("ballast", b"x" * 2_000_000)  # room for the script cache etc.
        fill_up(admin)
        admin.delete("ballast")  # frees memory, but the limit now sits below: set it again
        fill_up(admin)
        before = digest(admin)
        pending_before = store.pending(1000)

        # The append script begins with a write Redis does not refuse (ZREMRANGEBYSCORE):
        # without its shebang a full Redis ran it to the end and the log grew past
        # maxmemory. It must be refused whole.
        with pytest.raises(StoreUnavailable) as err:
            store.append_events(events("b", 20, t0=1000.0))
        assert err.value.reason == "oom" and not err.value.unreachable
        with pytest.raises(StoreUnavailable) as err:
            store.write_states(V1, {"b0": blob(2.0, 2)}, {"b0": None})
        assert err.value.reason == "oom"
        assert digest(admin) == before, "a refused call changed the store"

        # Reads go on, and marking applied (which frees memory) is not refused.
        assert store.read_states(V1, ["a0"])[0] == blob(1.0, 1)
        assert asyncio.run(store.read_states_async(V1, ["a0"]))[0] == blob(1.0, 1)
        assert store.pending(1000) == pending_before
        store.mark_applied([e.seq for e in pending_before[:10]])

        admin.config_set("maxmemory", 0)
        res = store.append_events(events("b", 20, t0=1000.0))
        assert all(s is not None for s in res.seqs)
        assert store.write_states(V1, {"b0": blob(2.0, 2)}, {"b0": None}).written == ["b0"]
    finally:
        store.close()
        admin.close()


def test_read_only_replica_is_readonly(server, tmp_path) -> None:
    replica = start_redis(
        tmp_path / "replica", extra_args=["--replicaof", "127.0.0.1", str(server.port)]
    )
    store = RedisStore(url=replica.url)
    try:
        with pytest.raises(StoreUnavailable) as err:
            store.append_events(events("a", 3))
        assert err.value.reason == "readonly"
        with pytest.raises(StoreUnavailable) as err:
            store.write_states(V1, {"a": blob(1.0, 1)}, {"a": None})
        assert err.value.reason == "readonly"
    finally:
        store.close()
        replica.stop()


def test_replica_without_its_master_is_masterdown(server, tmp_path) -> None:
    replica = start_redis(
        tmp_path / "replica",
        extra_args=[
            "--replicaof",
            "127.0.0.1",
            str(server.port),
            "--replica-serve-stale-data",
            "no",
        ],
    )
    store = RedisStore(url=replica.url)
    try:
        with replica.client() as c:  # synced first, so that losing the master is the cause
            deadline = time.monotonic() + 15
            while c.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica never synced"
                time.sleep(0.05)
        server.stop()
        with pytest.raises(StoreUnavailable) as err:
            for _ in range(100):  # until the replica notices its master is gone
                store.read_states(V1, ["a"])
                time.sleep(0.05)
        assert err.value.reason == "masterdown" and err.value.unreachable
    finally:
        store.close()
        replica.stop()


def test_a_script_past_its_time_limit_is_busy(server) -> None:
    admin = server.client()
    admin.config_set("busy-reply-threshold", 50)  # ms; lua-time-limit before Redis 7
    store = RedisStore(url=server.url, socket_timeout=5.0)
    blocker = threading.Thread(
        target=lambda: _ignore(lambda: server.client().eval("while true do end", 0)), daemon=True
    )
    blocker.start()
    try:
        time.sleep(0.3)  # past the threshold: every other command now gets BUSY
        with pytest.raises(StoreUnavailable) as err:
            store.read_states(V1, ["a"])
        assert err.value.reason == "busy"
        with pytest.raises(StoreUnavailable) as err:
            store.append_events(events("a", 2))
        assert err.value.reason == "busy"
    finally:
        admin.script_kill()
        blocker.join(10)
        admin.close()
        store.close()


def _ignore(call) -> None:  # type: ignore[no-untyped-def]
    try:
        call()
    except rex.RedisError:
        pass  # the killed script's own client gets an error: expected


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (rex.ConnectionError("Connection refused"), "connection"),
        (rex.TimeoutError("Timeout reading from socket"), "timeout"),
        (rex.BusyLoadingError("Redis is loading the dataset in memory"), "loading"),
        (rex.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "oom"),
        (rex.ReadOnlyError("You can't write against a read only replica."), "readonly"),
        (rex.MasterDownError("Link with MASTER is down"), "masterdown"),
        (rex.ClusterDownError("The cluster is down"), "clusterdown"),
        (rex.TryAgainError("Multiple keys request during rehashing of slot"), "tryagain"),
        (rex.ResponseError("BUSY Redis is busy running a script."), "busy"),
        (rex.ResponseError("MISCONF Redis is configured to save RDB snapshots"), "misconf"),
        # Redis 6 wraps the error a script met; Redis 7 passes its first word through
        (
            rex.ResponseError(
                "ERR Error running script (call to f_1): @user_script:9: -OOM command not allowed"
            ),
            "oom",
        ),
        (
            rex.ResponseError("OOM command not allowed when used memory > 'maxmemory'. script: x"),
            "oom",
        ),
        # errors without a name stay what they are (a bug, a wrong argument: a 500)
        (rex.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"), None),
        (rex.ResponseError("ERR syntax error"), None),
        (rex.DataError("Invalid input of type"), None),
    ],
)
def test_error_reasons(error: Exception, reason: str | None) -> None:
    assert store_error_reason(error) == reason


def test_every_reason_is_a_store_unavailable() -> None:
    for reason in STORE_ERROR_REASONS:
        assert StoreUnavailable("x", reason).reason == reason
    with pytest.raises(ValueError):
        StoreUnavailable("x", "no such reason")
    conflict = ApplyConflictError("3 node(s) still conflicting")
    assert isinstance(conflict, StoreUnavailable) and conflict.reason == "conflict"


def test_a_redis_down_when_the_append_is_sent_is_unavailable(server) -> None:
    """``begin_append`` (the append sent now, its answer read later) takes its
    connection inside the same fallback as the send: a Redis that refuses connections
    then is a ``StoreUnavailable`` after the plain call's retries, as for
    ``append_events``, not a bare redis-py error (which the service would answer 500)."""
    store = RedisStore(url=server.url)
    try:
        assert store.appends_in_background
        store.append_events(events("a", 3))  # connected and scripts loaded
        store.client.connection_pool.disconnect()
        server.stop()
        with pytest.raises(StoreUnavailable) as caught:
            store.begin_append(events("b", 40))()
        assert caught.value.reason == "connection"
    finally:
        store.close()
