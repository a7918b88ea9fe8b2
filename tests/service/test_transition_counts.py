"""Serving a model with transition counts (model/transition_counts.py), whose apply
reads where each event's other endpoint was just before from the log's histories
(docs/STATE_STORE.md, "Transition counts"). The train/serve parity of such a model is
in test_train_serve_parity.py."""

from __future__ import annotations

import numpy as np
import pytest

from model.node_state import StateCodec
from service.engine import ModelRuntime
from state_store.factory import make_store
from tests.service.conftest import make_checkpoint
from tests.service.test_cold_equals_warm import ingest, scores
from tests.support.service_process import start_service
from training.data import read_edge_stream


@pytest.fixture(scope="module")
def counting_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("counting") / "ck"
    # raw and decayed counts (UCI spans 190 days in seconds: a 3-day decay)
    version = make_checkpoint(path, seed=3, transition_buckets=16, transition_decay=259_200.0)
    return path, version


def _served_counts(redis_server, path, version, stream, tmp_path, partitions):
    """Serve the stream's first 2,000 events on a log of ``partitions``, then score
    pairs warm, drop every state and score them again (rebuilt from the histories).
    Returns (warm scores, cold scores, warm records, rebuilt records)."""
    redis_server.flush()
    (tmp_path / f"p{partitions}").mkdir()
    svc = start_service(
        tmp_path / f"p{partitions}",
        {
            "DYGSERVE_CHECKPOINT": str(path),
            "DYGSERVE_REDIS_URL": redis_server.url,
            "DYGSERVE_STORE__PARTITIONS": str(partitions),
        },
    )
    try:
        with svc.client() as client:
            ingest(client, stream, 0, 2000)
            t = float(stream.t[-1]) + 1.0
            pairs = [(stream.src[i], stream.dst[i], t) for i in range(0, 2000, 7)]
            warm = scores(client, pairs)
            nodes = sorted({p[0] for p in pairs} | {p[1] for p in pairs})
            store = make_store(redis_server.url, partitions=partitions)
            try:
                codec = StateCodec(ModelRuntime.load(path).config, version)
                warm_counts = codec.decode_with_neighbours(store.read_states(version, nodes))[1]
                with redis_server.client() as r:
                    assert r.delete(*list(r.scan_iter(match="dygserve:{n:*}:s:*"))) >= len(nodes)
                cold = scores(client, pairs)  # rebuilt from the histories
                rebuilt = codec.decode_with_neighbours(store.read_states(version, nodes))[1]
            finally:
                store.close()
    finally:
        svc.stop()
    assert warm_counts.transitions is not None and rebuilt.transitions is not None
    return warm, cold, warm_counts.transitions, rebuilt.transitions


def test_counts_are_served_alike_on_one_log_and_on_partitions(
    redis_server, counting_checkpoint, data_dir, tmp_path
):
    """Cold equals warm: a rebuild asks the log the same questions for every event of
    the node's history, so the records, and the scores, come back as they were. And the
    partitioned log (each endpoint's partition holds its own copy of an event under its
    own seq, found by time and id) answers what the single log answers: the same
    records and scores."""
    path, version = counting_checkpoint
    stream = read_edge_stream(data_dir / "uci", limit=2000)
    served = {p: _served_counts(redis_server, path, version, stream, tmp_path, p) for p in (1, 4)}
    for warm, cold, warm_counts, rebuilt in served.values():
        assert warm_counts.totals().sum() > 1000
        assert max(abs(a - b) for a, b in zip(warm, cold, strict=True)) <= 1e-4
        _same_records(rebuilt, warm_counts)
    (one, _, one_counts, _), (parted, _, parted_counts, _) = served[1], served[4]
    _same_records(parted_counts, one_counts)
    assert max(abs(a - b) for a, b in zip(one, parted, strict=True)) <= 1e-5


def _same_records(a, b):
    """Raw counts exactly; the decayed ones to float32 rounding, since a record written
    in one call sums its weights in another order than one written batch by batch."""
    buckets = a.buckets
    assert a.decay and (a.counts[:, :buckets] == b.counts[:, :buckets]).all()
    np.testing.assert_allclose(a.counts[:, buckets:], b.counts[:, buckets:], rtol=1e-5, atol=1e-6)
    assert b.counts[:, buckets:].sum() > 1.0  # the decayed row is kept, not left empty


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("layout", ["one log", "4 partitions"])
def test_answers_in_hand_equal_the_logs(data_dir, redis_single, layout, depth):
    """``counterparts_before`` answers most events from the nodes advanced in the same
    call (their new events, their blobs' newest list entries) and asks the log only for
    the rest. Whatever is in hand, the answers are the log's: here every node of a
    UCI slice (with self-loops added) is advanced at once from its blob after a random
    cut of its history, with some nodes left out, some already past the cut, and cold
    ones from nothing. On a partitioned log each node's history holds its own copies,
    matched to the other endpoint's by the event's id. Depth 2 (second-order counts)
    also answers the entry before that one, as ``two_neighbours_before`` does."""
    import random

    from model.node_ids import node_key
    from model.transition_counts import PAD
    from service.engine import counterparts_before, counterparts_previous
    from state_store.base import NewEvent
    from state_store.common import other_endpoint
    from state_store.memory import InMemoryStore

    stream = read_edge_stream(data_dir / "uci", limit=3000)
    redis_single.flush()
    store = InMemoryStore() if layout == "one log" else make_store(redis_single.url, partitions=4)
    events = [
        NewEvent(str(s), str(d), float(t))
        for s, d, t in zip(stream.src, stream.dst, stream.t, strict=True)
    ]
    events += [NewEvent(e.src, e.src, e.t) for e in events[::97]]  # self-loops
    events.sort(key=lambda e: e.t)
    store.append_events(events)
    nodes = sorted({e.src for e in events} | {e.dst for e in events})
    histories = dict(zip(nodes, store.read_histories(nodes), strict=True))
    rng = random.Random(0)
    here, tails, new_events = [], [], []
    for n in nodes:
        if rng.random() < 0.2:
            continue  # not in this call: its partners ask the log
        h = histories[n]
        cut = rng.randrange(len(h) + 1) if rng.random() < 0.7 else 0  # 30% cold
        applied, new = h[:cut], h[cut:]
        here.append(n)
        entries = [PAD, PAD]  # the blob's list: each applied event's entries
        for e in applied:
            entries += [node_key(n)] * 2 if e.src == e.dst else [node_key(other_endpoint(e, n))]
        tails.append(entries[-depth:])
        new_events.append(new)
    got = counterparts_before(store, here, new_events, tails)
    assert len(got) == depth
    if depth == 1:  # the first-order name for it
        assert counterparts_previous(store, here, new_events, [t[0] for t in tails]) == got[0]
    asked = 0
    for r, (n, new) in enumerate(zip(here, new_events, strict=True)):
        expected: list[list[int]] = [[] for _ in range(depth)]
        for e in new:
            found = store.two_neighbours_before([other_endpoint(e, n)], [e])[0]
            for d in range(depth):
                key = PAD if found[d] is None else node_key(found[d])
                expected[d] += [key, key] if e.src == e.dst else [key]
            asked += 1
        assert [got[d][r] for d in range(depth)] == expected, n
    assert asked > 2000 and sum(k != PAD for row in got[-1] for k in row) > 1000


def test_an_apply_waits_while_the_entry_before_is_in_doubt(redis_single, tmp_path):
    """On a partitioned log the entry just before an event in the other endpoint's
    history may be a copy in doubt, which an abort would take away: the apply does not
    count from it. It waits its rounds and fails as a conflict (503: the event stays
    pending), and once the copy is decided it applies what one log would."""
    import numpy as np

    from model.node_ids import node_key
    from model.transition_counts import bucket_of
    from state_store.applier import ApplyConflictError, apply_nodes, logged_events
    from state_store.base import NewEvent

    make_checkpoint(tmp_path / "ck", seed=3, edge_feature_dim=0, transition_buckets=16)
    redis_single.flush()
    store = make_store(redis_single.url, partitions=4)
    try:
        rt = ModelRuntime.load(tmp_path / "ck").paired_with(store)
        names = [f"n{i}" for i in range(40)]
        u = names[0]
        v, w = [n for n in names if store.partition_of(n) != store.partition_of(u)][:2]
        events = [NewEvent(u, w, 1.0, (), "e1"), NewEvent(u, v, 2.0, (), "e2")]
        logged = logged_events(events, store.append_events(events))
        before = store.read_histories([u])[0][0]  # u's copy of (u, w): the entry before
        part = store._parts[store.partition_of(u)]
        with redis_single.client() as r:
            r.hset(part.doubt, "held", f"nonce {before.seq} 0 0 {u}")
            with pytest.raises(ApplyConflictError):
                apply_nodes(store, rt.version, [v], rt.advance_blobs, max_rounds=2)
            assert store.read_states(rt.version, [v]) == [None]  # nothing counted
            r.hdel(part.doubt, "held")
        apply_nodes(store, rt.version, [v], rt.advance_blobs)
        counts = rt.codec.decode_with_neighbours(store.read_states(rt.version, [v]))[1]
        assert counts.transitions is not None
        # v's one event, counted at the bucket of w (where u was just before)
        w_bucket = int(bucket_of(np.array([node_key(w)]), 16)[0])
        assert np.asarray(counts.transitions.counts)[0].tolist() == [
            float(b == w_bucket) for b in range(16)
        ]
        assert len(logged) == 4  # both events span two partitions: two copies each
    finally:
        store.close()


@pytest.mark.parametrize("order2", [False, True], ids=["first order", "second order"])
@pytest.mark.parametrize("partitions", [1, 4])
def test_a_plain_ingest_asks_the_log_nothing(redis_single, data_dir, tmp_path, partitions, order2):
    """Both endpoints of each event are advanced in the same apply, so every answer is
    in hand (on partitions, matched across the two copies by the event's id), the entry
    two back too for second-order counts: the log is asked only after crashes, for
    rebuilds of one node or behind another writer."""
    from state_store.applier import apply_logged, logged_events
    from state_store.base import NewEvent

    make_checkpoint(
        tmp_path / "ck",
        seed=3,
        edge_feature_dim=0,
        transition_buckets=16,
        transition_order2=order2,
    )
    stream = read_edge_stream(data_dir / "uci", limit=3000)
    events = [
        NewEvent(str(s), str(d), float(t), (), f"e{i}")
        for i, (s, d, t) in enumerate(zip(stream.src, stream.dst, stream.t, strict=True))
    ]
    redis_single.flush()
    store = make_store(redis_single.url, partitions=partitions)
    try:
        rt = ModelRuntime.load(tmp_path / "ck").paired_with(store)
        asked: list[int] = []
        answer, answer_two = store.neighbours_before, store.two_neighbours_before
        store.neighbours_before = lambda n, e: (asked.append(len(n)), answer(n, e))[1]  # type: ignore[method-assign]
        store.two_neighbours_before = lambda n, e: (asked.append(len(n)), answer_two(n, e))[1]  # type: ignore[method-assign]
        for lo in range(0, len(events), 500):
            res = store.append_events(events[lo : lo + 500])
            logged = logged_events(events[lo : lo + 500], res)
            apply_logged(store, rt.version, logged, rt.advance_blobs, previous_seq=res.previous_seq)
        assert asked == []
        nodes = sorted({e.src for e in events} | {e.dst for e in events})
        lists = rt.codec.decode_with_neighbours(store.read_states(rt.version, nodes))[1]
        assert lists.transitions is not None
        assert float(lists.transitions.totals().sum()) > 4000  # the counts were kept
        if order2:
            assert float(lists.transitions.second().totals().sum()) > 3000
    finally:
        store.close()


def test_the_latest_transition_count_kept_from_the_event_is_refused_with_a_reason(tmp_path):
    """``latest_transition_count`` kept from the event is the trainer's and the
    evaluator's only (docs/results/mooc-experiments.md, ninth round): the service's
    writers cannot keep it, so it refuses the checkpoint rather than serve scores that
    differ. Read at the query it is served (tests/service/test_train_serve_parity.py)."""
    path = tmp_path / "ck"
    make_checkpoint(path, seed=0, transition_buckets=16, latest_transition_count=True)
    with pytest.raises(ValueError, match="latest_transition_count"):
        ModelRuntime.load(path)
    at_query = tmp_path / "at-query"
    make_checkpoint(
        at_query,
        seed=0,
        transition_buckets=16,
        latest_transition_count=True,
        latest_transition_at_query=True,
    )
    assert ModelRuntime.load(at_query).codec.keeps_newest_id
    plain = tmp_path / "plain"
    make_checkpoint(plain, seed=0, transition_buckets=16)
    assert ModelRuntime.load(plain).config.transition_buckets == 16
