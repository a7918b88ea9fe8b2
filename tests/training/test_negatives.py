"""Negative samplers: seeded, no future edges, historical negatives really are past edges."""

from __future__ import annotations

import numpy as np
import pytest

from training.batches import IndexedStream
from training.data import chronological_split, read_edge_stream
from training.negatives import (
    EvalNegativeSampler,
    TrainNegativeSampler,
    mrr_negatives,
    train_negatives,
)
from training.replay import build_queries


@pytest.fixture(scope="module")
def uci(data_dir):
    stream = read_edge_stream(data_dir / "uci" / "edges.csv.gz", limit=4000)
    return IndexedStream.build(stream), chronological_split(stream)


def _sampler(data, split, strategy, seed=0):
    last = float(data.t[split.train].max())
    return EvalNegativeSampler(data.src, data.dst, data.t, data.num_nodes, last, strategy, seed)


@pytest.mark.parametrize("strategy", ["historical", "inductive"])
def test_pair_negatives_are_past_edges_absent_from_the_batch(uci, strategy) -> None:
    data, split = uci
    ev = np.where(split.test)[0]
    sampler = _sampler(data, split, strategy)
    first_seen = {}
    for e in range(len(data)):
        first_seen.setdefault((int(data.src[e]), int(data.dst[e])), float(data.t[e]))
    observed = {
        (int(data.src[e]), int(data.dst[e]))
        for e in np.where(data.t <= float(data.t[split.train].max()))[0]
    }
    n_from_pool = 0
    for b in range(0, len(ev), 200):
        batch = ev[b : b + 200]
        start, end = float(data.t[batch[0]]), float(data.t[batch[-1]])
        in_window = {
            (int(data.src[e]), int(data.dst[e]))
            for e in np.where((data.t >= start) & (data.t <= end))[0]
        }
        pool = {
            (int(c // data.num_nodes), int(c % data.num_nodes))
            for c in (
                sampler.historical_pool(start, end)
                if strategy == "historical"
                else sampler.inductive_pool(start, end)
            )
        }
        s, d = sampler.sample(data.src[batch], data.dst[batch], data.t[batch])
        assert len(s) == len(batch)
        for pair in zip(s.tolist(), d.tolist(), strict=True):
            if pair in pool:
                n_from_pool += 1
                # a real edge, seen strictly before the batch (so before every query), not in the batch
                assert first_seen[pair] < start
                assert pair not in in_window
                if strategy == "inductive":
                    assert pair not in observed
        # pool items are never future edges either
        for pair in pool:
            assert first_seen[pair] < start and pair not in in_window
    assert n_from_pool > 0


def test_top_up_with_random_avoids_positives(uci) -> None:
    data, split = uci
    ev = np.where(split.val)[0][:200]
    sampler = _sampler(data, split, "inductive")
    # first validation batch: nothing was seen after training yet -> all random
    s, d = sampler.sample(data.src[ev], data.dst[ev], data.t[ev])
    assert len(s) == len(ev)
    positives = set(zip(data.src[ev].tolist(), data.dst[ev].tolist(), strict=True))
    assert not positives & set(zip(s.tolist(), d.tolist(), strict=True))


def test_samplers_are_seeded(uci) -> None:
    data, split = uci
    q1 = build_queries(data, split, ("test",), mrr_k=5)
    q2 = build_queries(data, split, ("test",), mrr_k=5)
    assert (
        np.array_equal(q1.src, q2.src)
        and np.array_equal(q1.dst, q2.dst)
        and np.array_equal(q1.t, q2.t)
    )
    rng1, rng2 = np.random.default_rng([0, 1]), np.random.default_rng([0, 1])
    pool = np.unique(data.dst[split.train])
    assert np.array_equal(train_negatives(rng1, pool, 50), train_negatives(rng2, pool, 50))


def test_random_negatives_keep_source_and_time(uci) -> None:
    data, split = uci
    q = build_queries(data, split, ("test",), ("transductive",), ("random",), 0)
    pos = q.kind == "pos"
    neg = q.kind == "random"
    assert np.array_equal(q.src[pos], q.src[neg]) and np.array_equal(q.t[pos], q.t[neg])
    assert set(q.dst[neg].tolist()) <= set(np.unique(data.dst).tolist())


def test_mrr_negatives_exclude_the_positive() -> None:
    cands = np.arange(10)
    pos = np.array([1, 2, 3, 4])
    neg = mrr_negatives(pos, cands, 8, seed=0)
    assert neg.shape == (4, 8)
    assert not (neg == pos[:, None]).any()


def test_training_negatives_mix_in_past_pairs_absent_from_the_batch(uci) -> None:
    data, split = uci
    ev = np.where(split.train)[0]
    src, dst = data.src[ev], data.dst[ev]
    sampler = TrainNegativeSampler(src, dst, data.num_nodes, historical_fraction=0.5)
    rng = np.random.default_rng(0)
    b0, b1 = 1000, 1200
    ns, nd, _ = sampler.sample(rng, b0, b1)
    past = set(zip(src[:b0].tolist(), dst[:b0].tolist(), strict=True))
    batch = set(zip(src[b0:b1].tolist(), dst[b0:b1].tolist(), strict=True))
    moved = ns != src[b0:b1]  # whole-pair negatives (another source than the positive's)
    pairs = set(zip(ns[moved].tolist(), nd[moved].tolist(), strict=True))
    # About half are past pairs; every one of them was seen before the batch, none in it.
    assert 0.3 * (b1 - b0) < moved.sum() < 0.7 * (b1 - b0)
    assert pairs <= past and not pairs & batch
    # The others keep the positive's source and draw a training destination.
    assert set(nd[~moved].tolist()) <= set(np.unique(dst).tolist())


def test_training_negatives_without_history_are_the_random_ones(uci) -> None:
    data, split = uci
    ev = np.where(split.train)[0]
    plain = TrainNegativeSampler(data.src[ev], data.dst[ev], data.num_nodes, 0.0)
    mixed = TrainNegativeSampler(data.src[ev], data.dst[ev], data.num_nodes, 0.5)
    # The first batch has no past pairs to draw; with the mix off the draws are unchanged.
    a = plain.sample(np.random.default_rng(3), 0, 100)
    b = mixed.sample(np.random.default_rng(3), 0, 100)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert np.array_equal(a[0], data.src[ev[:100]])
    with pytest.raises(ValueError):
        TrainNegativeSampler(data.src[ev], data.dst[ev], data.num_nodes, 1.5)


def test_extra_historical_negatives_keep_every_random_one(uci) -> None:
    data, split = uci
    ev = np.where(split.train)[0]
    src, dst = data.src[ev], data.dst[ev]
    b0, b1 = 1000, 1200
    replace = TrainNegativeSampler(src, dst, data.num_nodes, 0.5)
    extra = TrainNegativeSampler(src, dst, data.num_nodes, 0.5, historical_extra=True)
    rs, rd, r_rows = replace.sample(np.random.default_rng(7), b0, b1)
    es, ed, e_rows = extra.sample(np.random.default_rng(7), b0, b1)
    n = b1 - b0
    # The first n are each positive's random negative (its source, a training
    # destination), in order; the historical pairs the replacing sampler swapped in
    # come after them, each tagged with the positive it was drawn for.
    assert np.array_equal(es[:n], src[b0:b1]) and np.array_equal(e_rows[:n], np.arange(n))
    assert np.array_equal(r_rows, np.arange(n))
    moved = e_rows[n:]  # the positives whose random negative the replacing one swapped
    assert len(moved) > 0.3 * n and np.array_equal(moved, np.unique(moved))
    assert np.array_equal(es[n:], rs[moved]) and np.array_equal(ed[n:], rd[moved])
    kept = np.setdiff1d(np.arange(n), moved)
    assert np.array_equal(ed[kept], rd[kept]) and np.array_equal(rs[kept], src[b0:b1][kept])


def test_several_negatives_per_positive_are_rounds_of_the_same_mix(uci) -> None:
    data, split = uci
    ev = np.where(split.train)[0]
    src, dst = data.src[ev], data.dst[ev]
    b0, b1, n = 1000, 1200, 200
    one = TrainNegativeSampler(src, dst, data.num_nodes, 0.5)
    three = TrainNegativeSampler(src, dst, data.num_nodes, 0.5, per_positive=3)
    os_, od, o_rows = one.sample(np.random.default_rng(5), b0, b1)
    ts, td, t_rows = three.sample(np.random.default_rng(5), b0, b1)
    # the first round is the one-each draw; then two more rounds, each one per positive
    # in order, each with historical pairs mixed in at the same share
    assert np.array_equal(ts[:n], os_) and np.array_equal(td[:n], od)
    assert np.array_equal(o_rows, np.arange(n)) and np.array_equal(t_rows, np.tile(o_rows, 3))
    past = set((src[:b0] * data.num_nodes + dst[:b0]).tolist())
    for k in (1, 2):
        s_k, d_k = ts[k * n : (k + 1) * n], td[k * n : (k + 1) * n]
        random_ones = s_k == src[b0:b1]
        assert np.isin(d_k[random_ones], np.unique(dst)).all()
        swapped = ~random_ones  # historical pairs: another source, an edge seen before
        assert 0.2 * n < swapped.sum() < 0.8 * n
        assert all(int(c) in past for c in s_k[swapped] * data.num_nodes + d_k[swapped])
    assert not np.array_equal(td[n : 2 * n], td[2 * n :])  # drawn again, not repeated
    with pytest.raises(ValueError):
        TrainNegativeSampler(src, dst, data.num_nodes, per_positive=0)
