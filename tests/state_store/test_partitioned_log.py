"""The partitioned log (``partitions`` = P > 1) on a real local 3-master Redis Cluster:
the recorded layout, equality with a single Redis, concurrent writer processes with one
SIGKILLed, and each crash window between the two partitions' appends
(docs/STATE_STORE.md, "Partitioned log")."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from state_store.applier import apply_logged, logged_events, redrive
from state_store.base import NewEvent
from state_store.factory import make_store, make_store_as_recorded
from state_store.faults import CRASH_EXIT_CODE, FAULT_ENV
from state_store.layout import LayoutMismatch
from tests.support.partition_checks import (
    assert_both_endpoints_or_neither,
    assert_settled,
    assert_states_equal_replay,
    diff_ignoring_seq,
    histories_of,
)
from tests.support.store_model import VERSION, ModelAdvance, build_model, uci_events
from tests.support.store_workers import log_then_apply

REPO = Path(__file__).resolve().parents[2]
P = 16


@pytest.fixture(scope="module")
def advance() -> ModelAdvance:
    return ModelAdvance(build_model())


@pytest.fixture(scope="module")
def events() -> list[NewEvent]:
    return uci_events(1800)


@pytest.fixture
def cluster_url(redis_cluster: Any) -> str:
    redis_cluster.flush()
    return str(redis_cluster.url)


def batches_of(evs: list[NewEvent], size: int) -> list[list[NewEvent]]:
    return [evs[i : i + size] for i in range(0, len(evs), size)]


def nodes_of(evs: list[NewEvent]) -> list[str]:
    return list(dict.fromkeys(n for e in evs for n in (e.src, e.dst)))


def run_writer(
    url: str, rows: str, fault: str | None = None, batch: int = 200, retries: int = 0
) -> Any:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if fault:
        env[FAULT_ENV] = fault
    cmd = [sys.executable, "-m", "tests.support.store_workers", "--url", url, "--rows", rows]
    cmd += ["--batch", str(batch), "--partitions", str(P)]
    if retries:  # as a client of the service: a 503 is retried (same ids) after a re-drive
        cmd += ["--retries", str(retries), "--doubt-timeout", "0.2"]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def keys_per_master(cluster: Any) -> list[int]:
    out = []
    for port in cluster.ports:
        c = redis.Redis(port=port)
        if c.info("replication")["role"] == "master":
            out.append(int(c.dbsize()))
        c.close()
    return out


# ---- the layout ------------------------------------------------------------------------


def test_partition_count_is_recorded_and_another_is_refused(redis_single: Any) -> None:
    redis_single.flush()
    url = redis_single.url
    make_store(url, partitions=4).claim_layout()
    for other in (2, None):
        with pytest.raises(LayoutMismatch, match="written with 4 log partition"):
            make_store(url, partitions=other).claim_layout()
    # a store written by the single-slot layout (before the meta key) is refused by P > 1
    redis_single.flush()
    legacy = make_store(url)
    legacy.append_events([NewEvent("a", "b", 1.0)])
    with pytest.raises(LayoutMismatch, match="single-slot layout"):
        make_store(url, partitions=4).append_events([NewEvent("a", "b", 2.0)])
    legacy.claim_layout()  # and P = 1 adopts it as it is
    assert redis_single.client().hget("dygserve:meta", "partitions") == b"1"
    # offline tools open a store with the count it records, whatever they are given
    assert make_store_as_recorded(url).partitions == 1
    redis_single.flush()
    make_store(url, partitions=4).claim_layout()
    assert make_store_as_recorded(url).partitions == 4
    assert make_store_as_recorded(url, partitions=2).partitions == 4


# ---- one writer: the same answers and states as one Redis --------------------------------


def test_sequential_ingest_equals_single_redis_and_spreads_over_masters(
    cluster_url: str,
    redis_cluster: Any,
    redis_single: Any,
    advance: ModelAdvance,
    events: list[NewEvent],
) -> None:
    redis_single.flush()
    stream = events[:1200]
    # a retried batch (all duplicates) and a late event, as clients send them
    extra = [
        stream[100:150],
        [NewEvent(stream[500].src, "late-peer", stream[500].t - 1e6, (), "late-1")],
    ]
    outcomes = []
    for store in (make_store(redis_single.url), make_store(cluster_url, partitions=P)):
        store.claim_layout()
        seen = []
        for batch in batches_of(stream[:600], 200) + extra + batches_of(stream[600:], 200):
            res = store.append_events(batch)
            seen.append((len(res.duplicates), [r for _, r in res.late]))
            logged = logged_events(batch, res)
            apply_logged(store, VERSION, logged, advance, previous_seq=res.previous_seq)
        outcomes.append((seen, store))
    (one, single), (part, cluster) = outcomes
    assert one == part
    assert one[3] == (50, []) and one[4][1][0].startswith("late:")
    nodes = nodes_of(stream)
    diff = diff_ignoring_seq(
        advance, cluster.read_states(VERSION, nodes), single.read_states(VERSION, nodes)
    )
    assert diff <= 1e-5, diff
    assert_settled(cluster)
    assert_both_endpoints_or_neither(histories_of(cluster, nodes))
    counts = keys_per_master(redis_cluster)
    assert max(counts) <= sum(counts) / 2, counts  # the log no longer sits on one master
    single.close()
    cluster.close()


# ---- concurrent writers, one killed ------------------------------------------------------


def test_concurrent_writers_with_one_sigkilled(
    cluster_url: str, advance: ModelAdvance, events: list[NewEvent]
) -> None:
    # rows interleave in time, so the writers share UCI's busy nodes all along
    # the survivors retry a batch that is refused while the victim's copies are in doubt
    procs = [run_writer(cluster_url, r, batch=100, retries=50) for r in ("0:600", "600:1200")]
    victim = run_writer(cluster_url, "1200:1800", batch=100)
    store = make_store(cluster_url, partitions=P, doubt_timeout_s=0.05)
    try:
        deadline = time.monotonic() + 120
        while not store.pending(1) and time.monotonic() < deadline:  # it is writing
            time.sleep(0.05)
        time.sleep(0.3)
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(30) == -signal.SIGKILL
        accepted = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-2000:]
            accepted.append(ast.literal_eval(out.strip().splitlines()[-1])["accepted"])
        time.sleep(0.1)  # past doubt_timeout_s: the resolver decides what the victim left
        redrive(store, VERSION, advance)
        assert_settled(store)
        nodes = nodes_of(events)
        hist = histories_of(store, nodes)
        logged = assert_both_endpoints_or_neither(hist)
        rows = {int(e.split("-")[1]) for e in logged}
        # every event a finished writer was told accepted is there, once
        for n, (lo, hi) in zip(accepted, ((0, 600), (600, 1200)), strict=True):
            assert n > 0 and sum(lo <= r < hi for r in rows) == n
        assert_states_equal_replay(store, advance, [n for n in nodes if hist[n]])
    finally:
        store.close()


# ---- the crash windows -----------------------------------------------------------------------


def _start(url: str, advance: ModelAdvance, events: list[NewEvent]) -> Any:
    store = make_store(url, partitions=P, doubt_timeout_s=0.05)
    log_then_apply(store, advance, batches_of(events[:100], 50), VERSION)  # a normal start
    return store


def _crash(url: str, fault: str) -> None:
    proc = run_writer(url, "100:300", fault=fault)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == CRASH_EXIT_CODE, err[-2000:]


def _doubts(store: Any) -> int:
    return sum(int(store.client.execute_command("HLEN", k.doubt)) for k in store._parts)


def test_crash_between_partition_appends_then_a_client_retry(
    cluster_url: str, advance: ModelAdvance, events: list[NewEvent]
) -> None:
    store = _start(cluster_url, advance, events)
    try:
        _crash(cluster_url, "between_partition_appends")
        assert _doubts(store) > 0  # copies in one partition only
        held_nodes = nodes_of(events[100:300])
        _, held = store.read_committed(held_nodes, [-1] * len(held_nodes))
        assert held  # nobody applies a copy in doubt
        # the client retries the same batch (same ids) long before the timeout
        fresh = make_store(cluster_url, partitions=P)
        out = log_then_apply(fresh, advance, [events[100:300]], VERSION)
        assert out["duplicates"] == 0 and out["accepted"] + out["rejected"] == 200
        redrive(store, VERSION, advance)
        assert_settled(store)
        nodes = nodes_of(events[:300])
        hist = histories_of(store, nodes)
        assert len(assert_both_endpoints_or_neither(hist)) == 100 + out["accepted"]
        assert_states_equal_replay(store, advance, nodes)
        fresh.close()
    finally:
        store.close()


def test_crash_between_partition_appends_then_the_resolver_aborts(
    cluster_url: str, advance: ModelAdvance, events: list[NewEvent]
) -> None:
    store = _start(cluster_url, advance, events)
    try:
        _crash(cluster_url, "between_partition_appends")
        in_doubt = _doubts(store)
        assert in_doubt > 0
        time.sleep(0.1)
        assert store.resolve_doubts() == (0, in_doubt)  # the other copies never landed: abort
        redrive(store, VERSION, advance)
        assert_settled(store)
        nodes = nodes_of(events[:300])
        hist = histories_of(store, nodes)
        logged = assert_both_endpoints_or_neither(hist)
        crossed = {e.event_id for e in events[100:300]} & logged
        # only events with both endpoints in one partition (logged whole) may remain
        for e in events[100:300]:
            if e.event_id in crossed:
                assert store.partition_of(e.src) == store.partition_of(e.dst)
        assert_states_equal_replay(store, advance, nodes)
        # the client's retry then logs the aborted ones afresh, exactly once
        out = log_then_apply(store, advance, [events[100:300]], VERSION)
        assert out["duplicates"] == len(crossed)
        assert_settled(store)
        hist = histories_of(store, nodes)
        assert len(assert_both_endpoints_or_neither(hist)) == 100 + out["accepted"] + len(crossed)
        assert_states_equal_replay(store, advance, nodes)
    finally:
        store.close()


@pytest.mark.parametrize(
    "fault", ["before_commit", "after_partial_write", "before_mark", "after_log"]
)
def test_crash_after_both_appends_then_redrive(
    cluster_url: str, advance: ModelAdvance, events: list[NewEvent], fault: str
) -> None:
    store = _start(cluster_url, advance, events)
    try:
        _crash(cluster_url, fault)
        if fault == "before_commit":
            assert _doubts(store) > 0
        time.sleep(0.1)
        stats = redrive(store, VERSION, advance)  # the resolver commits: both copies exist
        assert stats.marked > 0
        assert_settled(store)
        nodes = nodes_of(events[:300])
        hist = histories_of(store, nodes)
        logged = assert_both_endpoints_or_neither(hist)
        assert {e.event_id for e in events[100:300]} - logged == set()  # none lost (none late here)
        assert_states_equal_replay(store, advance, nodes)
        again = redrive(store, VERSION, advance)
        assert again.events_applied == 0
    finally:
        store.close()


# ---- a stalled writer, and two deciders at once ---------------------------------------------


def _cross_event(store: Any, eid: str, t: float) -> tuple[NewEvent, int, int]:
    """An event whose endpoints live in two partitions, and those partitions."""
    for k in range(1000):
        src, dst = f"s{k}", f"d{k}"
        ps, pd = store.partition_of(src), store.partition_of(dst)
        if ps != pd:
            return NewEvent(src, dst, t, (), eid), ps, pd
    raise AssertionError("no cross-partition pair found")


def _append_copy(store: Any, ev: NewEvent, p: int, nonce: str) -> Any:
    """One partition's append of one attempt, as a writer's pipeline sends it."""
    parts = [(store.partition_of(ev.src), store.partition_of(ev.dst))]
    keys, args = store._append_call(p, [0], [ev], [ev.event_id], [ev.t], parts, nonce)
    return store._part_call([("append_part", keys, args)])[0]


def test_a_writer_stalled_past_the_timeout_is_fenced_and_its_retry_logs_once(
    cluster_url: str,
) -> None:
    store = make_store(cluster_url, partitions=P, doubt_timeout_s=0.05)
    try:
        ev, ps, pd = _cross_event(store, "stall-1", 10.0)
        first = _append_copy(store, ev, ps, "attempt-1")  # its first copy lands, then it stalls
        assert isinstance(first[0], int)
        time.sleep(0.1)
        assert store.resolve_doubts() == (0, 1)  # the other copy is absent: fenced, aborted
        assert store.read_histories([ev.src, ev.dst]) == [[], []]
        resumed = _append_copy(store, ev, pd, "attempt-1")  # the stalled writer goes on
        assert list(resumed[0]) == [-5]  # fenced: that attempt can never commit
        assert store.read_histories([ev.src, ev.dst]) == [[], []]
        res = store.append_events([ev])  # the client's retry: a new attempt
        assert res.seqs[0] is not None and 0 in res.other_seqs and not res.duplicates
        assert store.append_events([ev]).duplicates == [0]
        hist = histories_of(store, [ev.src, ev.dst])
        assert assert_both_endpoints_or_neither(hist) == {"stall-1"}
    finally:
        store.close()


def test_two_resolvers_at_once_reach_one_decision(cluster_url: str) -> None:
    import threading

    stores = [make_store(cluster_url, partitions=P, doubt_timeout_s=0.01) for _ in range(2)]
    try:
        events = []
        for i in range(20):  # both copies of each land, nobody finishes them
            ev = NewEvent(f"a{i}", f"b{i}", float(i), (), f"both-{i}")
            ps, pd = stores[0].partition_of(ev.src), stores[0].partition_of(ev.dst)
            if ps == pd:
                continue
            for p in (ps, pd):
                assert isinstance(_append_copy(stores[0], ev, p, f"n{i}")[0], int)
            events.append(ev)
        lone, _, _ = _cross_event(stores[0], "one-only", 100.0)
        _append_copy(stores[0], lone, stores[0].partition_of(lone.src), "n-one")
        time.sleep(0.05)
        results: list[tuple[int, int]] = []
        threads = [
            threading.Thread(target=lambda s=s: results.append(s.resolve_doubts())) for s in stores
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert len(results) == 2
        assert len(events) >= 10
        assert sum(r[1] for r in results) >= 1  # the lone copy was aborted (maybe by both)
        nodes = [n for e in events + [lone] for n in (e.src, e.dst)]
        hist = histories_of(stores[0], nodes)
        assert assert_both_endpoints_or_neither(hist) == {e.event_id for e in events}
        in_doubt = [
            int(stores[0].client.execute_command("HLEN", k.doubt)) for k in stores[0]._parts
        ]
        assert sum(in_doubt) == 0
    finally:
        for s in stores:
            s.close()


# ---- a master restarted ----------------------------------------------------------------------


def test_a_master_killed_and_restarted_mid_ingest_loses_and_doubles_nothing(
    tmp_path: Path, advance: ModelAdvance, events: list[NewEvent]
) -> None:
    import threading

    from tests.support.redis_server import kill_and_restart, start_cluster

    cluster = start_cluster(tmp_path / "aof-cluster", appendfsync="always")
    try:
        store = make_store(cluster.url, partitions=P, doubt_timeout_s=0.2)
        out: dict[str, Any] = {}

        def writer() -> None:  # a client of the service: 503s are retried, same ids
            out.update(log_then_apply(store, advance, batches_of(events[:1200], 100), VERSION, 200))

        th = threading.Thread(target=writer)
        th.start()
        deadline = time.monotonic() + 120
        while not store.pending(1) and time.monotonic() < deadline:
            time.sleep(0.02)
        alive_at_kill = th.is_alive()
        kill_and_restart(cluster, 1)  # a master dies mid-ingest (AOF fsync always)
        alive_at_restart = th.is_alive()
        th.join(300)
        assert not th.is_alive() and out, "the writer did not finish"
        # Not vacuous: the writer was ingesting through the whole outage, and every batch
        # touches every master. Whether it saw a StoreUnavailable (and retried the batch,
        # out["retried"]) or redis-py's own reconnect backoff outlasted the 1 s outage
        # depends on timing, so that is not asserted; what follows must hold either way.
        assert alive_at_kill and alive_at_restart, "the writer was not mid-ingest"
        time.sleep(0.3)
        redrive(store, VERSION, advance)
        assert_settled(store)
        nodes = nodes_of(events[:1200])
        hist = histories_of(store, nodes)
        logged = assert_both_endpoints_or_neither(hist)
        assert len(logged) == out["accepted"]  # every acknowledged event, once
        assert_states_equal_replay(store, advance, [n for n in nodes if hist[n]])
        store.close()
    finally:
        cluster.stop()
