"""The StateStore contract, the same suite on every backend: in-memory, one real Redis
server and a real 3-master Redis Cluster."""

from __future__ import annotations

import asyncio
import itertools
import math
import struct
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model.node_state import NodeStates, StateCodec
from state_store.base import NewEvent, StoreUnavailable
from state_store.blob_header import read_watermark
from state_store.factory import make_store
from state_store.memory import InMemoryStore
from tests.support.redis_server import free_port
from tests.support.store_model import tiny_config

V1, V2 = "0123456789abcdef", "fedcba9876543210"
_EXAMPLE = itertools.count()


def blob(t: float, seq: int, fill: int = 0, size: int = 96) -> bytes:
    """A blob with a watermark header (bytes 32..47) and binary payload."""
    head = bytearray(64)
    struct.pack_into("<dq", head, 32, t, seq)
    return bytes(head) + bytes([(fill + i) % 256 for i in range(size - 64)])


def ev(
    src: str, dst: str, t: float, eid: str | None = None, features: tuple[float, ...] = ()
) -> NewEvent:
    return NewEvent(src=src, dst=dst, t=t, features=features, event_id=eid)


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


# ---- state blobs ---------------------------------------------------------------------------


def test_blob_round_trip(make) -> None:
    s = make()
    blobs = {"a": blob(1.0, 1, 0), "b": blob(2.0, 2, 7), "\u00fc{x}:y": blob(3.0, 3, 250)}
    out = s.write_states(V1, blobs, dict.fromkeys(blobs))
    assert sorted(out.written) == sorted(blobs) and out.conflicts == []
    assert s.read_states(V1, ["b", "missing", "a", "\u00fc{x}:y"]) == [
        blobs["b"],
        None,
        blobs["a"],
        blobs["\u00fc{x}:y"],
    ]
    assert s.read_states(V1, []) == []
    assert s.delete_states(V1, ["a", "missing"]) == 1
    assert s.read_states(V1, ["a", "b"]) == [None, blobs["b"]]


def test_real_state_blobs_and_watermarks(make) -> None:
    cfg = tiny_config()
    codec = StateCodec(cfg, V1)
    states = NodeStates.initial(3, cfg)
    states.h.normal_()
    states.t_last[:] = torch.tensor([0.1 + 0.2, 1e300, -5e-324], dtype=torch.float64)
    states.last_seq[:] = torch.tensor([1, 2**53, 3])
    states.n_events[:] = 1
    blobs = codec.encode_many(states)
    s = make()
    nodes = ["n0", "n1", "n2"]
    assert (
        s.write_states(V1, dict(zip(nodes, blobs, strict=True)), dict.fromkeys(nodes)).written
        == nodes
    )
    back = s.read_states(V1, nodes)
    assert back == blobs
    assert [read_watermark(b) for b in back] == [(0.1 + 0.2, 1), (1e300, 2**53), (-5e-324, 3)]
    assert torch.equal(codec.decode_many(back).h, states.h)


def test_versions_are_isolated(make) -> None:
    s = make()
    s.write_states(V1, {"a": blob(1.0, 1, 1)}, {"a": None})
    assert s.read_states(V2, ["a"]) == [None]
    # the other version's absent blob is written with expected None, independently
    assert s.write_states(V2, {"a": blob(9.0, 9, 2)}, {"a": None}).written == ["a"]
    assert s.read_states(V1, ["a"]) == [blob(1.0, 1, 1)]
    assert s.read_states(V2, ["a"]) == [blob(9.0, 9, 2)]
    assert s.delete_states(V2, ["a"]) == 1
    assert s.read_states(V1, ["a"]) == [blob(1.0, 1, 1)]


def test_compare_and_set(make) -> None:
    s = make()
    assert s.write_states(V1, {"a": blob(1.0, 1)}, {"a": None}).written == ["a"]
    # absent expected, but present: conflict
    out = s.write_states(V1, {"a": blob(2.0, 2)}, {"a": None})
    assert out.written == [] and out.conflicts == ["a"]
    # wrong watermark (t or seq): conflict, nothing changes
    for wrong in [(1.0, 2), (1.5, 1), (-0.0, 1)]:
        assert s.write_states(V1, {"a": blob(2.0, 2)}, {"a": wrong}).conflicts == ["a"]
    assert s.read_states(V1, ["a"]) == [blob(1.0, 1)]
    # expected a blob that is absent: conflict
    assert s.write_states(V1, {"b": blob(2.0, 2)}, {"b": (1.0, 1)}).conflicts == ["b"]
    # right watermark: written; mixed batch reports per node
    out = s.write_states(
        V1,
        {"a": blob(2.0, 2), "b": blob(3.0, 3), "c": blob(4.0, 4)},
        {"a": (1.0, 1), "b": (0.0, 0), "c": None},
    )
    assert sorted(out.written) == ["a", "c"] and out.conflicts == ["b"]
    assert s.read_states(V1, ["a", "b", "c"]) == [blob(2.0, 2), None, blob(4.0, 4)]


# ---- appending -----------------------------------------------------------------------------


def test_duplicates_across_retries(make) -> None:
    s = make()
    batch = [ev("a", "b", 1.0, "e1"), ev("b", "c", 2.0, "e2"), ev("a", "b", 1.0, "e1")]
    r1 = s.append_events(batch)
    assert r1.seqs == [1, 2, None] and r1.duplicates == [2] and r1.late == []
    assert r1.event_ids == ["e1", "e2", "e1"]
    r2 = s.append_events(batch)  # a client retry of the same request
    assert r2.seqs == [None, None, None] and r2.duplicates == [0, 1, 2]
    assert [e.seq for e in s.read_log(-1, 100)] == [1, 2]
    assert [len(h) for h in s.read_histories(["a", "b", "c"])] == [1, 2, 1]


def test_dedupe_window_expires(make) -> None:
    """An event id is remembered for ``dedupe_ttl_s``, then may be used again."""
    s = make(dedupe_ttl_s=0.3)
    assert s.append_events([ev("a", "b", 1.0, "w1"), ev("a", "c", 1.0, "w1")]).duplicates == [1]
    assert s.append_events([ev("a", "b", 2.0, "w1")]).duplicates == [0]  # within the window
    time.sleep(0.5)
    r = s.append_events([ev("a", "b", 3.0, "w1"), ev("a", "b", 4.0, "w1")])
    assert r.seqs[0] is not None and r.duplicates == [1]  # accepted again, and remembered again


def test_assigned_event_ids_are_unique(make) -> None:
    s = make()
    r = s.append_events([ev("a", "b", 1.0), ev("a", "b", 1.0)])
    assert r.seqs == [1, 2] and r.duplicates == []
    assert len(set(r.event_ids)) == 2 and all(len(i) == 32 for i in r.event_ids)
    assert [e.event_id for e in s.read_log(-1, 10)] == r.event_ids
    # Assigned ids are never seen by clients, so the store keeps no dedupe marker for
    # them: the same string sent later as a client id is new (and then remembered).
    again = s.append_events([ev("a", "b", 2.0, r.event_ids[0]), ev("a", "b", 2.0, r.event_ids[0])])
    assert again.seqs[0] == 3 and again.duplicates == [1]


def test_late_events_rejected_across_and_within_batches(make) -> None:
    s = make()
    assert s.append_events([ev("a", "b", 5.0, "e1")]).seqs == [1]
    r = s.append_events(
        [
            ev("a", "x", 3.0, "e2"),  # late for a
            ev("y", "b", 4.0, "e3"),  # late for b (the destination)
            ev("c", "d", 10.0, "e4"),
            ev("d", "e", 9.0, "e5"),  # late for d because of e4 in this very batch
            ev("a", "b", 5.0, "e6"),  # equal time is in order
            ev("z", "z", 1.0, "e7"),
        ]
    )
    assert r.seqs == [None, None, 2, None, 3, 4]
    assert [i for i, _ in r.late] == [0, 1, 3]
    assert r.late[0][1] == "late: t=3.0 < last event 5.0 of node 'a'"
    assert r.late[1][1] == "late: t=4.0 < last event 5.0 of node 'b'"
    assert r.late[2][1] == "late: t=9.0 < last event 10.0 of node 'd'"
    assert r.rejected == r.late
    # a refused event changed nothing: x, y, e have no history, its id is not remembered
    assert s.read_histories(["x", "y", "e"]) == [[], [], []]
    assert s.append_events([ev("x", "q", 0.0, "e2")]).seqs == [5]


def test_future_skew(make) -> None:
    s = make(max_future_skew=100.0)
    r = s.append_events(
        [
            ev("a", "b", 1000.0, "e1"),
            ev("c", "d", 1100.0, "e2"),
            ev("e", "f", 1200.5, "e3"),
            ev("g", "h", 1200.0, "e4"),
        ]
    )
    # the first event ever sets the clock; then each accepted event advances it
    assert r.seqs == [1, 2, None, 3]
    assert r.late[0][0] == 2 and r.late[0][1].startswith("future: t=1200.5")
    assert s.last_event_time() == 1200.0
    assert s.read_histories(["e"]) == [[]]


def test_future_skew_off(make) -> None:
    s = make()
    assert s.append_events([ev("a", "b", 1.0), ev("c", "d", 1e15)]).seqs == [1, 2]


def test_self_loop_appends_once(make) -> None:
    s = make()
    assert s.append_events([ev("a", "a", 1.0, "e1"), ev("a", "b", 2.0, "e2")]).seqs == [1, 2]
    (h,) = s.read_histories(["a"])
    assert [e.seq for e in h] == [1, 2]


def test_non_finite_time_refused_and_nothing_changes(make) -> None:
    s = make()
    for bad in [math.nan, math.inf, -math.inf]:
        with pytest.raises(ValueError):
            s.append_events([ev("a", "b", 1.0, "ok"), ev("a", "b", bad, "bad")])
    assert s.read_log(-1, 10) == [] and s.last_event_time() is None
    assert s.append_events([ev("a", "b", 1.0, "ok")]).seqs == [1]


def test_history_cap(make) -> None:
    s = make(history_cap=3)
    s.append_events([ev("a", f"n{i}", float(i), f"e{i}") for i in range(10)])
    ha, h5 = s.read_histories(["a", "n5"])
    assert [e.seq for e in ha] == [8, 9, 10]  # newest 3 kept
    assert [e.seq for e in h5] == [6]
    # the late policy still knows the last time of a node after trimming
    assert s.append_events([ev("a", "z", 8.5, "late")]).late[0][1].startswith("late: t=8.5")
    assert len(s.read_log(-1, 100)) == 10  # the global log is not capped per node


def test_a_hub_with_more_new_events_than_one_history_write_holds(make) -> None:
    """The append writes a node's new history entries in chunks of 500 (Lua's unpack
    limit): a hub in all 1,203 events of one batch keeps every one, in seq order, and
    each spoke its one; the last chunk is a partial one."""
    s = make(history_cap=5000)
    res = s.append_events([ev("hub", f"s{i % 7}", float(i), f"h{i}") for i in range(1203)])
    assert res.seqs == list(range(1, 1204)) and res.previous_seq["hub"] == -1
    hub, s3 = s.read_histories(["hub", "s3"])
    assert [e.seq for e in hub] == list(range(1, 1204))
    assert [e.t for e in s3] == [float(i) for i in range(3, 1203, 7)]
    assert s.append_events([ev("s3", "hub", 1202.5, "next")]).previous_seq == {
        "s3": 1201,
        "hub": 1203,
    }  # s3 last at i = 1200


def test_read_histories_after_and_limit(make) -> None:
    s = make()
    s.append_events([ev("a", "b", float(i), f"e{i}") for i in range(6)] + [ev("c", "d", 1.0, "x")])
    full, b, c = s.read_histories(["a", "b", "c"])
    assert [e.seq for e in full] == [1, 2, 3, 4, 5, 6] and full == b
    assert [e.seq for e in c] == [7]
    after = s.read_histories(["a", "c", "nobody"], after_seq=[3, 7, -1])
    assert [[e.seq for e in h] for h in after] == [[4, 5, 6], [], []]
    lim = s.read_histories(["a", "c"], after_seq=[1, -1], limit=2)
    assert [[e.seq for e in h] for h in lim] == [[5, 6], [7]]
    assert s.read_histories(["a"], limit=0) == [[]]
    e = full[2]
    assert (e.src, e.dst, e.t, e.event_id, e.features) == ("a", "b", 2.0, "e2", ())


def test_neighbours_before_an_event(make) -> None:
    """Where each event's endpoint was just before it (the transition counts' lookup):
    by seq in the node's history, a self-loop's other endpoint is the node itself, and a
    trimmed or missing history answers None."""
    events = [ev("a", "x", 1.0, "1"), ev("b", "x", 2.0, "2"), ev("a", "y", 3.0, "3")]
    events += [ev("a", "a", 4.0, "4"), ev("a", "z", 5.0, "5"), ev("a", "w", 6.0, "6")]
    s = make()
    s.append_events(events)
    logged = {e.seq: e for e in s.read_log(0, 100)}
    asked = ["a", "x", "x", "a", "a", "a", "nobody", "a"]
    before = [logged[k] for k in (3, 2, 1, 4, 5, 6, 3, 6)]
    assert s.neighbours_before(asked, before) == ["x", "a", None, "y", "a", "z", None, "z"]
    assert s.neighbours_before([], []) == []
    capped = make(history_cap=3, key_prefix="capped")
    capped.append_events(events)
    # a's history keeps seqs 4-6: what came before seq 4 has been trimmed away
    kept = {e.seq: e for e in capped.read_log(0, 100)}
    assert capped.neighbours_before(["a"] * 3, [kept[k] for k in (4, 5, 6)]) == [None, "a", "z"]


def test_two_neighbours_before_an_event(make) -> None:
    """The second-order counts' lookup: a node's two latest list entries before an
    event, newest first; a self-loop is two entries of the node itself, and a trimmed
    or missing history answers None where it lacks them."""
    events = [ev("a", "x", 1.0, "1"), ev("b", "x", 2.0, "2"), ev("a", "y", 3.0, "3")]
    events += [ev("a", "a", 4.0, "4"), ev("a", "z", 5.0, "5"), ev("a", "w", 6.0, "6")]
    s = make()
    s.append_events(events)
    logged = {e.seq: e for e in s.read_log(0, 100)}
    asked = ["a", "x", "x", "a", "a", "a", "nobody"]
    before = [logged[k] for k in (3, 2, 1, 4, 5, 6, 3)]
    assert s.two_neighbours_before(asked, before) == [
        ("x", None),
        ("a", None),
        (None, None),
        ("y", "x"),
        ("a", "a"),  # the self-loop just before: the node itself, twice
        ("z", "a"),  # its second entry
        (None, None),
    ]
    assert s.two_neighbours_before([], []) == []
    # The first of each answer is neighbours_before's.
    assert [p[0] for p in s.two_neighbours_before(asked, before)] == s.neighbours_before(
        asked, before
    )
    capped = make(history_cap=3, key_prefix="capped")
    capped.append_events(events)
    kept = {e.seq: e for e in capped.read_log(0, 100)}
    assert capped.two_neighbours_before(["a"] * 3, [kept[k] for k in (4, 5, 6)]) == [
        (None, None),
        ("a", "a"),
        ("z", "a"),
    ]


def _tied_events(n: int = 400) -> list[NewEvent]:
    """Events over 12 nodes with a snapshot's ties (five events at each time), a few
    self-loops, ids on two thirds (the store assigns the others), no (src, dst, t)
    twice, so that the test can name each event by them."""
    import random

    rng = random.Random(7)
    nodes = [f"n{i}" for i in range(12)]
    out: dict[tuple[str, str, float], NewEvent] = {}
    while len(out) < n:
        i = len(out)
        src = rng.choice(nodes)
        dst = src if i % 37 == 0 else rng.choice(nodes)
        out.setdefault(
            (src, dst, float(i // 5)), ev(src, dst, float(i // 5), f"e{i}" if i % 3 else None)
        )
    return list(out.values())


def test_a_partitioned_log_says_where_a_node_was(redis_single) -> None:
    """Each partition numbers its own copies, so the other endpoint's copy of an event
    says nothing by its seq about where the event sits in this node's history: the
    node's own copy is found by the event's time and id, among a snapshot's ties too.
    Every answer, asked with the other endpoint's copy, is the other endpoint of the
    node's entry before the event in input order, None where the cap trimmed it."""
    events = _tied_events()
    index = {(e.src, e.dst, e.t): k for k, e in enumerate(events)}
    history: dict[str, list[int]] = {}
    for k, e in enumerate(events):
        for n in dict.fromkeys((e.src, e.dst)):
            history.setdefault(n, []).append(k)
    for cap in (10_000, 7):
        redis_single.flush()
        s = make_store(redis_single.url, partitions=4, history_cap=cap)
        try:
            assert all(x is not None for x in s.append_events(events).seqs)
            nodes = sorted(history)
            asked, copies, expected = [], [], []
            for n, h in zip(nodes, s.read_histories(nodes), strict=True):
                for copy in h:  # n's copy, asked about n's counterpart c
                    c = other(copy, n)
                    k = index[(copy.src, copy.dst, copy.t)]
                    at = history[c].index(k)
                    trimmed = at - 1 < len(history[c]) - cap
                    expected.append(
                        None if at == 0 or trimmed else other(events[history[c][at - 1]], c)
                    )
                    asked.append(c)
                    copies.append(copy)
            spanning = sum(
                s.partition_of(a) != x.seq % 4 for a, x in zip(asked, copies, strict=True)
            )
            assert spanning > len(asked) / 2  # most questions need the search by time and id
            got = s.neighbours_before(asked, copies)
            assert got == expected
            assert sum(x is not None for x in got) > (500 if cap > 100 else 40)
            # ...and the two entries before (second-order counts), from the same copies
            two = s.two_neighbours_before(asked, copies)
            assert [p[0] for p in two] == expected
            assert two == [
                _two_expected(events, history[c], index[(x.src, x.dst, x.t)], c, cap)
                for c, x in zip(asked, copies, strict=True)
            ]
            assert sum(p[1] is not None for p in two) > (400 if cap > 100 else 30)
        finally:
            s.close()


def other(e, node: str) -> str:
    return e.dst if e.src == node else e.src


def _two_expected(events, history: list[int], k: int, c: str, cap: int):
    """c's two latest list entries before event k (input order), from c's history
    (event indices) with the cap's trimming: a self-loop is two entries of c."""
    at = history.index(k)
    kept = history[max(0, len(history) - cap) : at]
    entries: list[str] = []
    for j in kept:
        e = events[j]
        entries += [c, c] if e.src == e.dst else [other(e, c)]
    if not entries:
        return (None, None)
    newest = events[kept[-1]]
    if newest.src == newest.dst:
        return (c, c)
    return (entries[-1], entries[-2] if len(entries) > 1 else None)


def test_a_partitioned_lookup_waits_for_a_copy_in_doubt(redis_single) -> None:
    """The entry just before an event may be a copy in doubt, which an abort would
    take away (and the answer with it): the lookup says so instead of answering."""
    from state_store.base import HeldByDoubt

    redis_single.flush()
    s = make_store(redis_single.url, partitions=4)
    try:
        events = [ev(f"u{i}", "hub", float(i), f"e{i}") for i in range(12)]
        s.append_events(events)
        h = s.read_histories(["hub"])[0]
        # the latest event whose other endpoint lives elsewhere, asked with that
        # endpoint's copy (the search by time and id), and hub's entry before it
        k = max(i for i in range(1, 12) if s.partition_of(f"u{i}") != s.partition_of("hub"))
        their_copy = s.read_histories([f"u{k}"])[0][0]
        assert their_copy.seq != h[k].seq
        doubt = s._parts[s.partition_of("hub")].doubt
        for asked_with in (their_copy, h[k]):  # (hub's own copy: by seq)
            with redis_single.client() as r:
                r.hset(doubt, "fake", f"nonce {h[k - 1].seq} 0 0 hub")
                with pytest.raises(HeldByDoubt):
                    s.neighbours_before(["hub"], [asked_with])
                r.hdel(doubt, "fake")
            assert s.neighbours_before(["hub"], [asked_with]) == [f"u{k - 1}"]
    finally:
        s.close()


def test_log_pending_mark_applied_and_trimming(make) -> None:
    s = make(log_keep=2)
    s.append_events([ev(f"s{i}", f"d{i}", float(i), f"e{i}") for i in range(1, 11)])
    assert [e.seq for e in s.read_log(-1, 100)] == list(range(1, 11))
    assert [e.seq for e in s.read_log(3, 4)] == [4, 5, 6, 7]
    assert [e.seq for e in s.pending(3)] == [1, 2, 3]
    # an applied event above a pending one does not let the log go below the pending one
    s.mark_applied([2, 3, 4])
    assert [e.seq for e in s.pending(100)] == [1, 5, 6, 7, 8, 9, 10]
    assert s.read_log(-1, 1)[0].seq == 1
    s.mark_applied([1, 5])
    assert [e.seq for e in s.read_log(-1, 100)] == [6, 7, 8, 9, 10]  # trimmed below lowest pending
    s.mark_applied([6, 7, 8, 9, 10, 10, 99])  # repeats and unknown seqs are harmless
    assert s.pending(100) == []
    assert [e.seq for e in s.read_log(-1, 100)] == [9, 10]  # but log_keep newest stay
    s.append_events([ev("s1", "x", 20.0, "e20")])
    assert [e.seq for e in s.read_log(8, 100)] == [9, 10, 11]
    assert [e.seq for e in s.pending(10)] == [11]


def test_log_keeps_everything_by_default(make) -> None:
    s = make()
    s.append_events([ev("a", "b", float(i)) for i in range(5)])
    s.mark_applied([1, 2, 3, 4, 5])
    assert len(s.read_log(-1, 100)) == 5 and s.pending(10) == []


def test_last_event_time(make) -> None:
    s = make()
    assert s.last_event_time() is None
    s.append_events([ev("a", "b", 2.5), ev("c", "d", 1.5)])
    assert s.last_event_time() == 2.5


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ts=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=8),
    feats=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=2, max_size=2),
)
def test_float64_round_trips_bit_exactly(make, ts, feats) -> None:
    s = make()  # a new client per example; fresh node names keep examples apart
    tag = next(_EXAMPLE)
    ts = sorted(ts)
    u, v = f"u-{tag}", f"v-{tag}"
    events = [ev(u, v, t, f"{tag}-{i}", tuple(feats)) for i, t in enumerate(ts)]
    r = s.append_events(events)
    assert None not in r.seqs, r.late
    (hu,) = s.read_histories([u])
    for e, t in zip(hu, ts, strict=True):
        assert bits(e.t) == bits(t)
        assert [bits(x) for x in e.features] == [bits(float(x)) for x in feats]
    logged = s.read_log(r.seqs[0] - 1, len(ts))
    assert [bits(e.t) for e in logged] == [bits(t) for t in ts]
    (hv,) = s.read_histories([v], limit=1)
    assert bits(hv[0].t) == bits(ts[-1])


# ---- errors and the factory ------------------------------------------------------------------


def test_awaited_reads_equal_blocking_reads(make, backend) -> None:
    """The event loop's read (small score calls) sees exactly what the blocking read sees;
    a cluster store has none and says so, so the caller takes the blocking path."""
    s = make()
    blobs = {"a": blob(1.0, 1, 0), "b": blob(2.0, 2, 7)}
    s.write_states(V1, blobs, dict.fromkeys(blobs))
    nodes = ["b", "missing", "a"]
    assert s.read_states(V1, nodes) == [blobs["b"], None, blobs["a"]]
    assert s.async_reads is (backend != "cluster")
    if not s.async_reads:
        with pytest.raises(NotImplementedError):
            asyncio.run(s.read_states_async(V1, nodes))
        return

    async def twice_on_one_loop_then_close():
        first = await s.read_states_async(V1, nodes)
        s.write_states(
            V1, {"a": blob(5.0, 9, 0)}, {"a": read_watermark(blobs["a"])}
        )  # a newer blob is seen at once
        second = await s.read_states_async(V1, ["a", "b"])
        empty = await s.read_states_async(V1, [])
        await s.aclose()
        return first, second, empty

    first, second, empty = asyncio.run(twice_on_one_loop_then_close())
    assert first == [blobs["b"], None, blobs["a"]]
    assert second == [blob(5.0, 9, 0), blobs["b"]] and empty == []
    assert asyncio.run(s.read_states_async(V1, ["b"])) == [
        blobs["b"]
    ]  # a new loop gets its own client


def test_ping(make) -> None:
    assert make().ping() is True


def test_unreachable_redis_raises_store_unavailable() -> None:
    port = free_port()
    s = make_store(f"redis://127.0.0.1:{port}/0", socket_timeout=0.5)
    assert s.ping() is False
    for call in (
        lambda: s.read_states(V1, ["a"]),
        lambda: s.append_events([ev("a", "b", 1.0)]),
        lambda: s.write_states(V1, {"a": blob(1.0, 1)}, {"a": None}),
        lambda: s.pending(1),
    ):
        with pytest.raises(StoreUnavailable):
            call()
    with pytest.raises(StoreUnavailable):
        asyncio.run(s.read_states_async(V1, ["a"]))
    with pytest.raises(StoreUnavailable):
        make_store(f"redis+cluster://127.0.0.1:{port}", socket_timeout=0.5)


def test_factory() -> None:
    assert isinstance(make_store(None), InMemoryStore)
    m = make_store(None, history_cap=5, state_ttl_s=None, socket_timeout=1.0, key_prefix="x")
    assert isinstance(m, InMemoryStore) and m.config.history_cap == 5
    with pytest.raises(ValueError):
        make_store("http://localhost:1")
    with pytest.raises(ValueError):
        make_store(None, history_cap=0)
