"""The live evaluation's pieces on their own: the deterministic sample, and the rolling
AP / AUC / MRR against scikit-learn's definitions (with each negative weighing 1/K)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from model.checkpoint import load_checkpoint
from service.live_eval import one_copy_per_event, reference_ap, sampled
from service.rolling_quality import RollingQuality
from service.settings import DEFAULT_CHECKPOINT
from state_store.base import LoggedEvent


def test_sample_is_a_deterministic_function_of_seq_and_seed():
    seqs = np.arange(200_000, dtype=np.int64)
    a = sampled(seqs, seed=3, rate=0.01)
    assert np.array_equal(a, sampled(seqs, seed=3, rate=0.01))
    # the same event is or is not sampled whatever batch it arrives in
    assert np.array_equal(a[1000:1100], sampled(seqs[1000:1100], seed=3, rate=0.01))
    assert not np.array_equal(a, sampled(seqs, seed=4, rate=0.01))
    assert abs(a.mean() - 0.01) < 0.001  # binomial sd is 0.00022
    assert sampled(seqs, seed=3, rate=1.0).all()
    assert not sampled(seqs, seed=3, rate=0.0).any()
    # a lower rate samples a subset of a higher one (one hash, one threshold)
    assert not (a & ~sampled(seqs, seed=3, rate=0.05)).any()


def test_rolling_quality_matches_sklearn_with_balanced_weights():
    rng = np.random.default_rng(0)
    k, window = 9, 300
    q = RollingQuality(window)
    pos_all = rng.normal(1.0, 1.0, 500)
    neg_all = rng.normal(0.0, 1.0, (500, k))
    neg_all[::7, 0] = pos_all[::7]  # some ties
    for p, n in zip(pos_all, neg_all, strict=True):
        q.add(float(p), n)
    pos, neg = pos_all[-window:], neg_all[-window:]
    y = np.r_[np.ones(window), np.zeros(window * k)]
    s = np.r_[pos, neg.reshape(-1)]
    w = np.r_[np.ones(window), np.full(window * k, 1.0 / k)]
    got = q.quality()
    assert got.samples == window
    assert got.ap == pytest.approx(average_precision_score(y, s, sample_weight=w), abs=1e-12)
    assert got.auc == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    rank = 1 + (neg > pos[:, None]).sum(1) + 0.5 * (neg == pos[:, None]).sum(1)
    assert got.mrr == pytest.approx(np.mean(1 / rank), abs=1e-12)


def test_rolling_quality_with_one_negative_is_the_plain_ap():
    rng = np.random.default_rng(1)
    q = RollingQuality(1000)
    pos, neg = rng.normal(0.5, 1, 200), rng.normal(0, 1, 200)
    for p, n in zip(pos, neg, strict=True):
        q.add(float(p), np.array([n]))
    y = np.r_[np.ones(200), np.zeros(200)]
    assert q.quality().ap == pytest.approx(average_precision_score(y, np.r_[pos, neg]), abs=1e-12)


def test_reference_ap_is_the_bundled_checkpoints_test_ap():
    metrics = load_checkpoint(DEFAULT_CHECKPOINT).metrics
    ap = reference_ap(metrics)
    assert ap == metrics["evaluation"]["test"]["transductive"]["random"]["ap"]
    assert 0.9 < ap < 1.0
    assert reference_ap({}) is None


def test_an_event_logged_as_two_copies_counts_once_by_its_lower_seq():
    def ev(seq: int, eid: str) -> LoggedEvent:
        return LoggedEvent(seq, "a", "b", 1.0, (), eid)

    # copies of "x" (seqs 35 and 18 of a 16-partition log), "y" once, two id-less events
    batch = [ev(35, "x"), ev(7, "y"), ev(18, "x"), ev(3, ""), ev(4, "")]
    kept = one_copy_per_event(batch)
    assert [(e.seq, e.event_id) for e in kept] == [(18, "x"), (7, "y"), (3, ""), (4, "")]
    single = [ev(1, "p"), ev(2, "q"), ev(3, "")]
    assert one_copy_per_event(single) is single  # the single-slot log: nothing to drop
