"""Exactly once with the real model (DESIGN invariant 5), cold equals warm (4), and
constant round trips: retries, 8 concurrent writer processes on one Redis and on a
Redis Cluster, a crash between logging and applying, TTL expiry."""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from model.node_state import StateCodec
from state_store.applier import (
    ApplyStats,
    apply_logged,
    apply_nodes,
    logged_events,
    redrive,
)
from state_store.base import LoggedEvent, NewEvent, StateStore
from state_store.factory import make_store
from state_store.faults import CRASH_EXIT_CODE, FAULT_ENV
from state_store.memory import InMemoryStore
from state_store.redis_store import RedisStore
from tests.support.store_model import (
    VERSION,
    ModelAdvance,
    build_model,
    max_state_diff,
    read_whole_log,
    uci_events,
)
from tests.support.store_workers import log_then_apply, pool_init, pool_writer

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5
N_WRITERS = 8
REDIS_BACKENDS = ["redis", "cluster"]


@pytest.fixture(scope="module")
def advance() -> ModelAdvance:
    return ModelAdvance(build_model())


@pytest.fixture(scope="module")
def events_3000() -> list[NewEvent]:
    return uci_events(3000)


def batches_of(events: list[NewEvent], size: int) -> list[list[NewEvent]]:
    return [events[i : i + size] for i in range(0, len(events), size)]


def all_nodes(events: list[LoggedEvent] | list[NewEvent]) -> list[str]:
    return list(dict.fromkeys(n for e in events for n in (e.src, e.dst)))


def sequential_replay(
    log: list[LoggedEvent], advance: ModelAdvance, batch: int = 100
) -> InMemoryStore:
    """A clean replay of a stored log, one batch after another, on a fresh store."""
    ref = InMemoryStore()
    for chunk in batches_of(log, batch):
        res = ref.append_events(
            [NewEvent(e.src, e.dst, e.t, e.features, e.event_id) for e in chunk]
        )
        assert res.seqs == [e.seq for e in chunk], "replay must reproduce the stored seqs"
        apply_logged(
            ref,
            VERSION,
            logged_events(
                [NewEvent(e.src, e.dst, e.t, e.features, e.event_id) for e in chunk], res
            ),
            advance,
        )
    return ref


def assert_same_states(
    store: StateStore, ref: StateStore, nodes: list[str], codec: StateCodec
) -> float:
    got, want = store.read_states(VERSION, nodes), ref.read_states(VERSION, nodes)
    assert all(b is not None for b in want)
    diff = max_state_diff(codec, got, want)
    assert diff <= TOL, f"max abs state difference {diff}"
    return diff


# ---- retries -------------------------------------------------------------------------------


def test_client_retries_apply_once(
    make, advance: ModelAdvance, events_3000: list[NewEvent]
) -> None:
    events = events_3000[:300]
    store = make()
    accepted = 0
    for batch in batches_of(events, 60):
        for attempt in range(3):  # the same request three times (lost acks)
            res = store.append_events(batch)
            if attempt == 0:
                accepted += len(logged_events(batch, res))
            else:
                assert res.seqs == [None] * len(batch) and len(res.duplicates) == len(batch)
            apply_logged(store, VERSION, logged_events(batch, res), advance)
        # and a retry that only re-applies (as after a failed apply): a no-op
        assert apply_nodes(store, VERSION, all_nodes(batch), advance).nodes_applied == 0
    log = read_whole_log(store)
    assert len(log) == accepted == len({e.event_id for e in log})
    assert store.pending(10) == []
    ref = sequential_replay(log, advance)
    assert_same_states(store, ref, all_nodes(log), advance.codec)


def test_lost_compare_and_set_reapplies_only_the_new_events(
    make, advance: ModelAdvance, events_3000: list[NewEvent]
) -> None:
    """Deterministic interleaving: writer A reads, writer B logs more events on the same
    nodes and applies them, A's write conflicts there; A re-reads and finds nothing left
    to do on those nodes, and nothing was applied twice."""
    store = make()
    first = events_3000[:40]
    t_end = max(e.t for e in first)
    second = [
        NewEvent(e.src, e.dst, t_end + 1 + i, event_id=f"b{i}") for i, e in enumerate(first[:10])
    ]
    store.append_events(first)  # logged, not applied yet (A is about to apply them)
    calls = []

    def racing_advance(ns, blobs, new):
        calls.append(len(ns))
        if len(calls) == 1:  # B gets in between A's read and A's write
            apply_logged(
                store, VERSION, logged_events(second, store.append_events(second)), advance
            )
        return advance(ns, blobs, new)

    stats = apply_nodes(store, VERSION, all_nodes(first), racing_advance)
    b_nodes = set(all_nodes(second))
    assert stats.conflicts == len(b_nodes) and stats.rounds == 2
    assert stats.nodes_applied == len(set(all_nodes(first)) - b_nodes)
    log = read_whole_log(store)
    assert_same_states(store, sequential_replay(log, advance), all_nodes(log), advance.codec)
    n_events = advance.codec.decode_many(
        store.read_states(VERSION, all_nodes(log))
    ).n_events.tolist()
    assert n_events == [len(h) for h in store.read_histories(all_nodes(log))]


def test_a_writer_whose_events_another_writer_applied_stops_there(
    make, advance: ModelAdvance, events_3000: list[NewEvent]
) -> None:
    """Writer A logs events and reads; writer B logs more on the same nodes and applies
    them together with A's; then C logs still more there, unapplied. A's write loses on
    B's nodes, and A stops there: its own events are in B's blobs. Catching up with C's
    as well (as A used to) is what let a writer on a busy hub run out of rounds. C's
    events stay pending, and the re-drive brings every node to the sequential replay."""
    store = make()
    first = events_3000[:40]
    t_end = max(e.t for e in first)
    second = [
        NewEvent(e.src, e.dst, t_end + 1 + i, event_id=f"b{i}") for i, e in enumerate(first[:10])
    ]
    third = [
        NewEvent(e.src, e.dst, t_end + 100 + i, event_id=f"c{i}") for i, e in enumerate(first[:10])
    ]
    a_logged = logged_events(first, store.append_events(first))
    calls = []

    def racing_advance(ns, blobs, new):
        calls.append(len(ns))
        if len(calls) == 1:  # B (with A's events) and then C get in between A's read and write
            apply_logged(
                store, VERSION, logged_events(second, store.append_events(second)), advance
            )
            store.append_events(third)
        return advance(ns, blobs, new)

    stats = apply_logged(store, VERSION, a_logged, racing_advance)
    b_nodes = set(all_nodes(second))
    assert stats.conflicts == len(b_nodes)
    assert stats.covered_elsewhere == len(b_nodes) and stats.rounds == 2
    assert len(calls) == 1  # A advanced nothing in its second round
    # C's events are not in any blob yet: the busy nodes stand at B's newest event
    marks = advance.codec.decode_many(store.read_states(VERSION, sorted(b_nodes))).n_events
    histories = store.read_histories(sorted(b_nodes))
    assert marks.tolist() == [
        len(h) - sum(e.event_id.startswith("c") for e in h) for h in histories
    ]
    assert redrive(store, VERSION, advance).events_applied == 2 * len(third)
    log = read_whole_log(store)
    assert_same_states(store, sequential_replay(log, advance), all_nodes(log), advance.codec)


# ---- concurrent writer processes -------------------------------------------------------------


@pytest.fixture(scope="module")
def writer_pool() -> Iterator[Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(N_WRITERS)
    pool = ctx.Pool(N_WRITERS, initializer=pool_init, initargs=(barrier,))
    yield pool
    pool.terminate()
    pool.join()


@pytest.mark.parametrize("backend", REDIS_BACKENDS)
def test_concurrent_writer_processes(
    store_url: str,
    backend: str,
    writer_pool: Any,
    advance: ModelAdvance,
    events_3000: list[NewEvent],
) -> None:
    url = store_url
    batches = batches_of(events_3000, 50)
    # batch k goes to writer k % 8: every writer touches the busy nodes of UCI
    tasks = [(url, {}, batches[w::N_WRITERS]) for w in range(N_WRITERS)]
    results = writer_pool.map(pool_writer, tasks, chunksize=1)
    assert len({r["pid"] for r in results}) == N_WRITERS  # really 8 processes at once
    accepted = sum(r["accepted"] for r in results)
    rejected = sum(r["rejected"] for r in results)
    assert accepted + sum(r["duplicates"] + r["rejected"] for r in results) == len(events_3000)
    conflicts = sum(r["stats"]["conflicts"] for r in results)

    store = make_store(url)
    try:
        log = read_whole_log(store)
        assert [e.seq for e in log] == list(range(1, accepted + 1))
        # the writers really overlapped on nodes (writer of row r: (r // 50) % 8)
        writers_of: dict[str, set[int]] = {}
        for e in log:
            w = (int(e.event_id.split("-")[1]) // 50) % N_WRITERS
            for n in (e.src, e.dst):
                writers_of.setdefault(n, set()).add(w)
        shared = sum(len(ws) > 1 for ws in writers_of.values())
        assert shared >= 10, shared
        assert store.pending(10) == []
        ref = sequential_replay(log, advance)
        nodes = all_nodes(log)
        diff = assert_same_states(store, ref, nodes, advance.codec)
        # every node's watermark is its last logged event: nothing skipped, nothing twice
        n_events = advance.codec.decode_many(store.read_states(VERSION, nodes)).n_events.tolist()
        assert n_events == [len(h) for h in store.read_histories(nodes)]
    finally:
        store.close()
    print(
        f"\n{backend}: {accepted} accepted, {rejected} late of {len(events_3000)}; {shared} nodes "
        f"written by several writers; {conflicts} CAS conflicts, "
        f"{sum(r['stats']['covered_elsewhere'] for r in results)} nodes left to the writer that won; max diff {diff:.2e}"
    )


# ---- crash between logging and applying -------------------------------------------------------


@pytest.mark.parametrize("backend", REDIS_BACKENDS)
def test_crash_after_log_then_redrive(
    store_url: str, advance: ModelAdvance, events_3000: list[NewEvent]
) -> None:
    url = store_url
    store = make_store(url)
    try:
        log_then_apply(store, advance, batches_of(events_3000[:100], 50), VERSION)  # a normal start
        applied_before = store.read_states(VERSION, all_nodes(events_3000[:100]))
        env = {**os.environ, FAULT_ENV: "after_log", "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.support.store_workers",
                "--url",
                url,
                "--rows",
                "100:300",
                "--batch",
                "200",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == CRASH_EXIT_CODE, proc.stderr[-2000:]
        pending = store.pending(1000)
        assert len(pending) > 100 and pending[0].seq > 0
        # logged, acknowledged to nobody, applied to nobody
        assert store.read_states(VERSION, all_nodes(events_3000[:100])) == applied_before
        stats = redrive(store, VERSION, advance, batch=64)
        assert stats.marked == len(pending) and store.pending(10) == []
        once = store.read_states(VERSION, all_nodes(read_whole_log(store)))
        again = redrive(store, VERSION, advance)
        assert again.events_applied == 0 and again.round_trips == 1
        assert store.read_states(VERSION, all_nodes(read_whole_log(store))) == once
        log = read_whole_log(store)
        assert_same_states(store, sequential_replay(log, advance), all_nodes(log), advance.codec)
    finally:
        store.close()


# ---- cold equals warm ----------------------------------------------------------------------------


def test_ttl_expiry_gives_cold_node_rebuilt_to_warm_state(
    make, advance: ModelAdvance, events_3000: list[NewEvent]
) -> None:
    store = make(state_ttl_s=1.0)
    events = events_3000[:400]
    log_then_apply(store, advance, batches_of(events, 40), VERSION)
    nodes = all_nodes(read_whole_log(store))
    warm = store.read_states(VERSION, nodes)
    assert None not in warm
    time.sleep(1.5)
    assert store.read_states(VERSION, nodes) == [None] * len(nodes)
    stats = apply_nodes(store, VERSION, nodes, advance)
    assert stats.cold_rebuilds == len(nodes) == stats.nodes_applied
    cold = store.read_states(VERSION, nodes)
    diff = max_state_diff(advance.codec, cold, warm)
    assert diff <= TOL, diff


def test_capped_history_cold_rebuild_is_last_cap_events_only(advance: ModelAdvance) -> None:
    """Documented limit: a node with more events than history_cap is rebuilt from its
    newest history_cap events, from the initial state, so it differs from the warm one."""
    cap = 5
    store = InMemoryStore(history_cap=cap)
    events = [NewEvent("hub", f"n{i}", float(i * 600), event_id=f"e{i}") for i in range(12)]
    for batch in batches_of(events, 3):
        apply_logged(store, VERSION, logged_events(batch, store.append_events(batch)), advance)
    (warm,) = store.read_states(VERSION, ["hub"])
    store.delete_states(VERSION, ["hub"])
    apply_nodes(store, VERSION, ["hub"], advance)
    (cold,) = store.read_states(VERSION, ["hub"])
    w, c = advance.codec.decode_many([warm]), advance.codec.decode_many([cold])
    assert int(w.n_events) == 12 and int(c.n_events) == cap
    assert float(w.t_last) == float(c.t_last) and int(w.last_seq) == int(c.last_seq)
    assert float((w.h - c.h).abs().max()) > TOL  # not the warm state ...
    fresh = advance(["hub"], [None], store.read_histories(["hub"]))
    assert fresh["hub"] == cold  # ... but exactly the replay of the last `cap` events


def test_a_stale_blob_is_not_bridged_across_events_the_cap_dropped(advance: ModelAdvance) -> None:
    """A blob of a version that was not serving catches up from itself, unless the gap
    is as long as the history cap: then events of the gap may be gone, and the node is
    rebuilt from its kept history as a cold node is (the documented capped difference),
    never folded across the hole."""
    cap = 5
    store = InMemoryStore(history_cap=cap)
    events = [NewEvent("hub", f"n{i}", float(i * 600), event_id=f"e{i}") for i in range(12)]
    first, rest = events[:3], events[3:]
    apply_logged(store, VERSION, logged_events(first, store.append_events(first)), advance)
    # 9 more events applied by another version only: VERSION's blob misses them all and
    # the history keeps the newest 5
    apply_logged(store, "other", logged_events(rest, store.append_events(rest)), advance)
    apply_nodes(store, VERSION, ["hub"], advance)
    (caught_up,) = store.read_states(VERSION, ["hub"])
    assert advance.codec.decode_many([caught_up]).n_events.item() == cap
    fresh = advance(["hub"], [None], store.read_histories(["hub"]))
    assert fresh["hub"] == caught_up

    # A gap shorter than the cap: caught up from the blob itself (3 + 2 events).
    store = InMemoryStore(history_cap=cap)
    first, rest = events[:3], events[3:5]
    apply_logged(store, VERSION, logged_events(first, store.append_events(first)), advance)
    apply_logged(store, "other", logged_events(rest, store.append_events(rest)), advance)
    apply_nodes(store, VERSION, ["hub"], advance)
    (caught_up,) = store.read_states(VERSION, ["hub"])
    assert advance.codec.decode_many([caught_up]).n_events.item() == 5
    other = store.read_states("other", ["hub"])  # the same 5 events, from the initial state
    assert max_state_diff(advance.codec, [caught_up], other) <= TOL


@pytest.mark.parametrize("backend", REDIS_BACKENDS)
def test_only_state_blobs_expire(make, backend: str) -> None:
    """volatile-* eviction can only take states (rebuilt cold, exactly), never the log,
    histories, pending set or dedupe marks (scored by expiry inside one sorted set)."""
    store = make(state_ttl_s=60.0)
    store.append_events([NewEvent("a", "b", 1.0, event_id="x")])
    store.write_states(VERSION, {"a": bytes(96)}, {"a": None})
    client = store.client
    servers = (
        [client]
        if backend == "redis"
        else [client.get_redis_connection(n) for n in client.get_primaries()]
    )
    keys = {k: r.pttl(k) for r in servers for k in r.scan_iter(count=1000)}
    assert len(keys) == 9, keys  # state; seq, stream, pending, lt, tmax, eids, h:a, h:b
    for k, ttl in keys.items():
        if b":s:" in k:
            assert ttl > 0, k
        else:
            assert ttl == -1, k


# ---- round trips -----------------------------------------------------------------------------------


class CountingConnection(redis.Connection):
    """A real connection that counts the times it writes to its socket: one per
    command or per pipeline, so the count is the number of round trips."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sends += 1
        super().send_packed_command(command, check_health)


def simple_advance(
    nodes: list[str], blobs: list[bytes | None], new: list[list[LoggedEvent]]
) -> dict[str, bytes]:
    out = {}
    for n, b, evs in zip(nodes, blobs, new, strict=True):
        body = bytearray(b if b is not None else bytes(96))
        struct.pack_into("<dq", body, 32, evs[-1].t, evs[-1].seq)
        out[n] = bytes(body)
    return out


@pytest.mark.parametrize("backend", REDIS_BACKENDS)
def test_round_trips_do_not_grow_with_batch_size(store_url: str, backend: str) -> None:
    url = store_url
    store = RedisStore(url=url, connection_class=CountingConnection)
    masters = 1 if backend == "redis" else 3
    try:
        store.load_scripts()
        store.ping()

        def count(fn: Any, *args: Any) -> int:
            before = CountingConnection.sends
            fn(*args)
            return CountingConnection.sends - before

        per_size: dict[int, dict[str, int]] = {}
        for size in (10, 1000):
            nodes = [f"rt{size}-{i}" for i in range(size)]
            events = [
                NewEvent(nodes[i], nodes[(i + 1) % size], float(i), event_id=f"rt{size}-{i}")
                for i in range(size)
            ]
            c: dict[str, int] = {"append": count(store.append_events, events)}
            logged = [e for e in store.read_log(-1, 10**6) if e.event_id.startswith(f"rt{size}-")]
            stats = ApplyStats()
            c["apply_logged"] = count(
                lambda evs, st: st.add(apply_logged(store, VERSION, evs, simple_advance)),
                logged,
                stats,
            )
            assert stats.nodes_applied == size and stats.round_trips == 4
            c["read_states"] = count(store.read_states, VERSION, nodes)
            c["read_histories"] = count(store.read_histories, nodes)
            c["pending"] = count(store.pending, size)
            c["delete_states"] = count(store.delete_states, VERSION, nodes)
            per_size[size] = c
        print(f"\n{backend} round trips: {per_size}")
        big, small = per_size[1000], per_size[10]
        for op in ("append", "read_histories", "pending"):
            assert big[op] == small[op] == 1, (op, per_size)  # the log lives in one slot
        for op in ("read_states", "delete_states"):
            assert 1 <= small[op] <= big[op] <= masters, (op, per_size)
        # apply_logged = read_states + read_histories + write_states + mark_applied
        assert small["apply_logged"] <= big["apply_logged"] <= 2 + 2 * masters
        if backend == "redis":
            assert big == small
            with redis.Redis.from_url(url) as r:  # the server's own count agrees: one MGET
                before = r.info("stats")["total_commands_processed"]
                store.read_states(VERSION, [f"rt1000-{i}" for i in range(1000)])
                after = r.info("stats")["total_commands_processed"]
            assert after - before == 2  # the MGET and the first INFO
    finally:
        store.close()


# ---- more failure modes ------------------------------------------------------------------------


def test_threads_on_the_memory_store(advance: ModelAdvance, events_3000: list[NewEvent]) -> None:
    """The embedded store is shared by the threads of one process: same guarantees."""
    import threading

    store = InMemoryStore()
    batches = batches_of(events_3000[:1200], 40)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            log_then_apply(store, advance, batches[w::4], VERSION)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    log = read_whole_log(store)
    assert store.pending(10) == []
    assert_same_states(store, sequential_replay(log, advance), all_nodes(log), advance.codec)


@pytest.mark.parametrize("backend", REDIS_BACKENDS)
def test_scripts_are_reloaded_after_script_flush(make, backend: str) -> None:
    store = make()
    assert store.append_events([NewEvent("a", "b", 1.0)]).seqs == [1]
    client = store.client
    servers = (
        [client]
        if backend == "redis"
        else [client.get_redis_connection(n) for n in client.get_primaries()]
    )
    for r in servers:
        r.script_flush()
    assert store.append_events([NewEvent("a", "b", 2.0)]).seqs == [2]
    for r in servers:
        r.script_flush()
    assert store.write_states(
        VERSION, {"a": bytes(96), "b": bytes(96)}, {"a": None, "b": None}
    ).written == ["a", "b"]
    for r in servers:
        r.script_flush()
    store.mark_applied([1, 2])
    assert store.pending(10) == []


def test_acknowledged_events_survive_a_redis_crash_with_appendfsync_always(
    tmp_path: Path, advance: ModelAdvance, events_3000: list[NewEvent]
) -> None:
    """kill -9 of Redis right after append_events returned: with appendfsync always
    nothing acknowledged is lost; while it is down the store raises StoreUnavailable;
    after the restart the log continues and re-drive applies what was pending."""
    from state_store.base import StoreUnavailable
    from tests.support.redis_server import redis_available, start_redis

    if not redis_available():
        pytest.skip("redis-server not installed")
    server = start_redis(tmp_path, appendfsync="always")
    try:
        store = make_store(server.url, socket_timeout=1.0)
        events = events_3000[:200]
        log_then_apply(store, advance, batches_of(events[:100], 50), VERSION)
        res = store.append_events(events[100:])  # acknowledged, not applied
        accepted = [s for s in res.seqs if s is not None]
        server.proc.kill()  # SIGKILL: no shutdown, no final fsync
        server.proc.wait()
        with pytest.raises(StoreUnavailable):
            store.pending(10)
        server = start_redis(tmp_path, port=server.port, appendfsync="always")
        assert [e.seq for e in store.pending(1000)] == accepted
        assert store.append_events(events[100:120]).duplicates == list(range(20))  # ids remembered
        assert store.append_events([NewEvent("new", "node", events[-1].t, event_id="z")]).seqs == [
            accepted[-1] + 1
        ]
        redrive(store, VERSION, advance)
        log = read_whole_log(store)
        assert_same_states(store, sequential_replay(log, advance), all_nodes(log), advance.codec)
        store.close()
    finally:
        server.stop()
