"""model.transition_counts: its writers against each other (the evaluator's and the
service's, which walk events in order, and the trainer's prefix index), the blob
round trip, and what the head reads (the torch and numpy scorers read it alike:
tests/model/test_numpy_scorer.py, "transition_counts")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.config import ModelConfig
from model.node_state import NeighbourLists, NodeStates, StateCodec
from model.pair_features import pair_feature_dim, pair_inputs
from model.transition_counts import (
    PAD,
    DenseTransitions,
    add_counts,
    add_transitions,
    bucket_of,
    counterpart_previous,
    counterpart_previous_two,
    empty_counts,
    latest_transition_counts,
    pair_keys,
    transition_feature_dim,
)
from training.batches import IndexedStream, NodeEventIndex
from training.data import read_edge_stream


def _streamed(
    d: IndexedStream, events: np.ndarray, buckets: int, decay: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Counts after ``events`` written in slices of uneven sizes, as the evaluator and
    the service write them (a batch at a time, each in stream order), and each node's
    newest entry time (+inf: none), which a decayed record is kept as of."""
    counts = empty_counts(d.num_nodes, buckets, decay)
    newest = np.full(d.num_nodes, -np.inf)  # (add_counts reads any non-finite as none)
    latest: dict[int, int] = {}
    cuts = np.unique(
        np.r_[0, np.cumsum(np.random.default_rng(0).integers(1, 500, 200)), len(events)]
    )
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=False):
        ev = events[lo : min(hi, len(events))]
        if not len(ev):
            continue
        for_src, for_dst = counterpart_previous(
            d.keys[d.src[ev]].tolist(), d.keys[d.dst[ev]].tolist(), latest
        )
        rows = np.concatenate([d.src[ev], d.dst[ev]])
        times = np.concatenate([d.t[ev], d.t[ev]])
        previous = np.array(for_src + for_dst, dtype=np.int64)
        add_counts(counts, rows, previous, buckets, decay, times, newest)
        np.maximum.at(newest, rows, times)
    return counts, np.where(np.isfinite(newest), newest, np.inf)


def test_the_trainers_prefix_counts_equal_the_streamed_ones(data_dir):
    """Can. Parl. has self-loops and many events at one time; every node's counts after
    the first 7,777 and after all 20,000 events agree exactly."""
    d = IndexedStream.build(read_edge_stream(data_dir / "canparl"))
    events = np.arange(20_000)
    index = NodeEventIndex.build(d, events)
    nodes = np.arange(d.num_nodes)
    every_bucket = np.tile(np.arange(64), (d.num_nodes, 1))
    for cut in (7_777, 20_000):
        streamed, _ = _streamed(d, events[:cut], 64)
        m = index.prefix_count_before_event(nodes, np.full(d.num_nodes, cut))
        prefix = index.transitions(nodes, m, 64)
        np.testing.assert_array_equal(prefix.at(every_bucket), streamed)
        np.testing.assert_array_equal(prefix.totals(), streamed.sum(1))
    assert streamed.sum() > 30_000  # nearly every entry has a previous neighbour


def test_counts_of_a_small_stream():
    """a-x, b-x, a-y, b-y: y is reached from x twice (by a and by b); x is reached from
    nothing (a's and b's first events); a and b each count y's and x's previous visitor."""
    a, b, x, y = 10, 11, 12, 13
    latest: dict[int, int] = {}
    for_src, for_dst = counterpart_previous([a, b, a, b], [x, x, y, y], latest)
    assert for_dst == [PAD, PAD, x, x]  # what x, x, y, y count: the source's previous item
    assert for_src == [PAD, a, PAD, a]  # what a, b, a, b count: the item's previous visitor
    counts = empty_counts(14, 16)
    add_counts(counts, np.array([a, b, a, b, x, x, y, y]), np.array(for_src + for_dst), 16)
    assert counts[y, x % 16] == 2 and counts[y].sum() == 2 and counts[x].sum() == 0
    assert counts[b, a % 16] == 2 and counts[a].sum() == 0
    assert list(bucket_of(np.array([PAD, 17, 3]), 16)) == [PAD, 1, 3]


def test_the_blob_keeps_the_counts_and_the_head_reads_them():
    cfg = ModelConfig(d_model=8, d_state=4, neighbour_list_len=4, transition_buckets=8)
    codec = StateCodec(cfg, "00" * 8)
    lists = NeighbourLists.empty_for(2, cfg)
    lists.keys[1, -2:] = torch.tensor([3, 5])  # node 1 visited 3, then 5
    lists.times[1, -2:] = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert isinstance(lists.transitions, DenseTransitions)
    lists.transitions.counts[0, 5] = 4.0  # node 0 was reached from 5 four times
    lists.transitions.counts[0, 3] = 1.0
    blobs = codec.encode_many(NodeStates.initial(2, cfg), lists)
    assert len(blobs[0]) == codec.blob_size
    _, back = codec.decode_with_neighbours(blobs)
    assert isinstance(back.transitions, DenseTransitions)
    np.testing.assert_array_equal(back.transitions.counts, lists.transitions.counts)

    keys = torch.tensor([100, 101])
    pair, _ = pair_inputs(
        cfg,
        keys[[1]],
        keys[[0]],
        torch.tensor([3.0], dtype=torch.float64),
        back.select([1]),
        back.select([0]),
        torch.tensor([2]),
        torch.tensor([5]),
        torch.tensor([2.0], dtype=torch.float64),
        torch.tensor([1.5], dtype=torch.float64),
    )
    assert pair is not None and pair.shape[1] == pair_feature_dim(cfg)
    cols = pair[0, -transition_feature_dim(8) :].numpy()
    # v = node 0 at u's latest neighbours 5, 3, none; v's total; then u's (empty) record.
    np.testing.assert_allclose(cols, np.log1p([4, 1, 0, 5, 0, 0, 0, 0]), rtol=1e-6)


def test_decayed_counts_of_the_prefix_index_equal_the_streamed_ones(data_dir):
    """Wikipedia, 20,000 events written in slices of uneven sizes with their times, and
    the trainer's prefix index, read at the same query times: the decayed counts at
    every bucket and the decayed totals agree to float32 rounding."""
    d = IndexedStream.build(read_edge_stream(data_dir / "wikipedia"))
    decay, buckets, cut = 86_400.0, 32, 20_000
    events = np.arange(cut)
    counts, newest = _streamed(d, events, buckets, decay)
    nodes = np.arange(d.num_nodes)
    index = NodeEventIndex.build(d, events)
    m = index.prefix_count_before_event(nodes, np.full(d.num_nodes, cut))
    tau = np.where(np.isfinite(newest), newest, 0.0) + 3_600.0
    every_bucket = np.tile(np.arange(buckets), (d.num_nodes, 1))
    prefix = index.transitions(nodes, m, buckets, decay)
    streamed = DenseTransitions(counts, buckets, decay)
    got_at, got_total = prefix.decayed(every_bucket, tau, newest)
    want_at, want_total = streamed.decayed(every_bucket, tau, newest)
    np.testing.assert_allclose(got_at, want_at, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(got_total, want_total, rtol=2e-5, atol=1e-6)
    np.testing.assert_array_equal(prefix.at(every_bucket), counts[:, :buckets])
    # the decay did something: recent visitors weigh more than the raw counts say
    assert 0 < want_total.sum() < 0.5 * counts[:, :buckets].sum()


def test_decayed_counts_by_hand():
    """x is reached from p at t=0 and from q at t=T; read at 2T the record holds p with
    weight e^-2 and q with e^-1, and its total their sum; the raw counts are unchanged."""
    T, buckets, x = 10.0, 8, 0
    counts = empty_counts(1, buckets, T)
    newest = np.array([np.inf])
    add_counts(counts, np.array([x]), np.array([3]), buckets, T, np.array([0.0]), newest)
    add_counts(counts, np.array([x]), np.array([5]), buckets, T, np.array([T]), np.array([0.0]))
    record = DenseTransitions(counts, buckets, T)
    at, total = record.decayed(np.array([[3, 5, PAD]]), np.array([2 * T]), np.array([T]))
    np.testing.assert_allclose(at[0], [np.exp(-2), np.exp(-1), 0.0], rtol=1e-6)
    np.testing.assert_allclose(total, [np.exp(-2) + np.exp(-1)], rtol=1e-6)
    np.testing.assert_array_equal(record.at(np.array([[3, 5]])), [[1.0, 1.0]])
    # a query behind the record's newest time reads it undecayed, never amplified
    at, _ = record.decayed(np.array([[5]]), np.array([0.0]), np.array([T]))
    assert at[0, 0] == 1.0


def test_second_order_prefix_counts_equal_the_streamed_ones(data_dir):
    """The second-order records (``transition_order2``): the pair of each counterpart's
    two previous neighbours, written in slices as the evaluator writes them, and the
    trainer's prefix index, on Can. Parl. (self-loops: a node's own two entries), with
    decay: raw counts equal, decayed ones to float32 rounding; the first-order half of
    the same records is unchanged by the second."""
    d = IndexedStream.build(read_edge_stream(data_dir / "canparl"))
    buckets, decay, cut = 64, 86_400.0 * 365, 20_000
    events = np.arange(cut)
    counts = empty_counts(d.num_nodes, buckets, decay, order2=True)
    newest = np.full(d.num_nodes, -np.inf)
    latest: dict[int, int] = {}
    before: dict[int, int] = {}
    for lo in range(0, cut, 777):
        ev = events[lo : lo + 777]
        p1s, p1d, p2s, p2d = counterpart_previous_two(
            d.keys[d.src[ev]].tolist(), d.keys[d.dst[ev]].tolist(), latest, before
        )
        rows = np.concatenate([d.src[ev], d.dst[ev]])
        times = np.concatenate([d.t[ev], d.t[ev]])
        p1 = np.array(p1s + p1d, dtype=np.int64)
        pairs = pair_keys(np.array(p2s + p2d, dtype=np.int64), p1)
        add_transitions(counts, rows, p1, buckets, decay, times, newest, pairs)
        np.maximum.at(newest, rows, times)
    newest = np.where(np.isfinite(newest), newest, np.inf)
    first, _ = _streamed(d, events, buckets, decay)  # (in other slices: float32 rounding)
    np.testing.assert_array_equal(counts[:, :buckets], first[:, :buckets])
    np.testing.assert_allclose(counts[:, : first.shape[1]], first, rtol=2e-5, atol=1e-6)

    nodes = np.arange(d.num_nodes)
    index = NodeEventIndex.build(d, events)
    m = index.prefix_count_before_event(nodes, np.full(d.num_nodes, cut))
    prefix = index.transitions(nodes, m, buckets, decay, order2=True).second()
    streamed = DenseTransitions(counts, buckets, decay).second()
    every_bucket = np.tile(np.arange(buckets), (d.num_nodes, 1))
    np.testing.assert_array_equal(prefix.at(every_bucket), streamed.at(every_bucket))
    np.testing.assert_array_equal(prefix.totals(), streamed.totals())
    tau = np.where(np.isfinite(newest), newest, 0.0) + 86_400.0
    got = prefix.decayed(every_bucket, tau, newest)
    want = streamed.decayed(every_bucket, tau, newest)
    np.testing.assert_allclose(got[0], want[0], rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=2e-5, atol=1e-6)
    # Pairs are not single keys: the second record differs from the first, and most
    # entries have two previous neighbours.
    assert streamed.totals().sum() > 0.9 * DenseTransitions(first, buckets, decay).totals().sum()
    assert not np.array_equal(streamed.at(every_bucket), first[:, :buckets])


def test_latest_transition_counts_by_hand():
    """a-x, b-x, a-y, b-y, a-y. When b goes x -> y (4th), a had gone x -> y once before:
    y's count at x was 1. When a goes y -> y (5th), nobody had reached y from y: 0. The
    items' side alike: at b-y, y's previous visitor a, and b had been reached from a
    once (at b-x, x's previous visitor was a). A node with no previous neighbour reads
    0."""
    a, b, x, y = 0, 1, 2, 3
    keys = [10, 11, 12, 13]
    latest: dict[int, int] = {}
    src, dst = [a, b, a, b, a], [x, x, y, y, y]
    for_src, for_dst = counterpart_previous([keys[n] for n in src], [keys[n] for n in dst], latest)
    met_src, met_dst = latest_transition_counts(None, src, dst, for_dst, for_src, 16)
    assert met_src == [0, 0, 0, 1, 0]
    assert met_dst == [0, 0, 0, 1, 0]
    # from records kept before: the same counts plus what they held
    counts = np.zeros((4, 16), dtype=np.float32)
    counts[y, keys[x] % 16] = 5
    again, _ = latest_transition_counts(counts, src, dst, for_dst, for_src, 16)
    assert again == [0, 0, 5, 6, 0]
    with pytest.raises(ValueError, match="needs them"):  # it reads the records
        ModelConfig(latest_transition_count=True)


@pytest.mark.parametrize("at_query", [False, True], ids=["from-the-event", "at-the-query"])
def test_latest_transition_counts_of_the_replay_equal_the_prefix_index(data_dir, at_query):
    """``ModelConfig.latest_transition_count``: the evaluator's replay (batches of
    uneven sizes, each read before its own adds) and the trainer's prefix index give
    every node the same value, on Can. Parl. (self-loops, many events at one time).
    ``latest_transition_at_query``: the replay reads each node's newest neighbour's
    record as it holds it, the prefix index that neighbour's record after the events the
    same query sees; the same again, and never less than the value kept from the event
    (it also counts the node's own transition and the ones after it)."""
    from model.link_model import DygMambaLinkModel
    from training.replay import StreamReplay

    d = IndexedStream.build(read_edge_stream(data_dir / "canparl"))
    cfg = ModelConfig(
        d_model=8,
        d_state=4,
        neighbour_list_len=4,
        transition_buckets=64,
        transition_order2=True,
        latest_transition_count=True,
        latest_transition_at_query=at_query,
    )
    replay = StreamReplay(DygMambaLinkModel(cfg), d)
    events = np.arange(20_000)
    index = NodeEventIndex.build(d, events)
    nodes = np.arange(d.num_nodes)
    lo = 0
    for hi in (1, 500, 7_777, 7_778, 13_000, 20_000):
        replay.ingest(events[lo:hi], bulk=True)
        lo = hi
        if hi not in (7_777, 20_000):
            continue

        def before(ns: np.ndarray, hi: int = hi) -> np.ndarray:
            return index.prefix_count_before_event(ns, np.full(len(ns), hi))

        at_event = index.transitions(nodes, before(nodes), 64, order2=True, latest=True).latest()
        prefix = index.latest_at_query(nodes, before(nodes), before, 64) if at_query else at_event
        served = replay.neighbour_lists(nodes).transitions
        assert served is not None
        np.testing.assert_array_equal(prefix, served.latest())
    assert (prefix > 0).mean() > 0.5  # most nodes' latest transition had been made before
    if at_query:
        two = before(nodes) >= 2
        assert (prefix[two] >= at_event[two]).all() and (prefix[two] > at_event[two]).any()


def test_latest_transition_at_query_needs_the_count_it_reads():
    with pytest.raises(ValueError, match="latest_transition_at_query"):
        ModelConfig(transition_buckets=16, latest_transition_at_query=True)
