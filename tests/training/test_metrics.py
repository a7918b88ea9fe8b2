"""AP / AUC against scikit-learn, DeLong's paired AUC difference against its plain
O(positives x negatives) twin, MRR and DyGLib's batch averaging on hand cases."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from training.metrics import average_precision, batched, mrr, paired_auc_difference, roc_auc


def test_hand_case_matches_sklearn() -> None:
    y = np.array([1, 0, 1, 1, 0, 0, 1, 0])
    s = np.array([0.9, 0.8, 0.7, 0.7, 0.3, 0.7, 0.1, 0.05])  # ties across classes
    assert average_precision(y, s) == pytest.approx(average_precision_score(y, s), abs=1e-12)
    assert roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_perfect_and_reversed() -> None:
    y = np.array([1, 1, 0, 0])
    assert average_precision(y, np.array([4.0, 3, 2, 1])) == 1.0
    assert roc_auc(y, np.array([4.0, 3, 2, 1])) == 1.0
    assert roc_auc(y, np.array([1.0, 2, 3, 4])) == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_random_cases_match_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 300)
    y[0], y[1] = 0, 1
    s = np.round(rng.normal(size=300) + y, 1)  # rounding makes many ties
    assert average_precision(y, s) == pytest.approx(average_precision_score(y, s), abs=1e-12)
    assert roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_mrr_hand_case() -> None:
    pos = np.array([0.9, 0.5, 0.1])
    neg = np.array([[0.1, 0.2], [0.6, 0.5], [0.3, 0.4]])
    # ranks: 1; 1 + 1 + 0.5 = 2.5; 3
    assert mrr(pos, neg) == pytest.approx((1 + 1 / 2.5 + 1 / 3) / 3)


def test_batched_is_mean_of_per_batch_values() -> None:
    rng = np.random.default_rng(0)
    pos, neg = rng.normal(1, 1, 450), rng.normal(0, 1, 450)
    out = batched(pos, neg, batch_size=200)
    assert out["n_batches"] == 3
    per = []
    for b in range(0, 450, 200):
        p, n = pos[b : b + 200], neg[b : b + 200]
        per.append(average_precision_score(np.r_[np.ones(len(p)), np.zeros(len(n))], np.r_[p, n]))
    assert out["ap"] == pytest.approx(np.mean(per), abs=1e-12)
    y = np.r_[np.ones(450), np.zeros(450)]
    assert out["ap_global"] == pytest.approx(average_precision_score(y, np.r_[pos, neg]), abs=1e-12)
    assert out["auc_global"] == pytest.approx(roc_auc_score(y, np.r_[pos, neg]), abs=1e-12)


def plain_paired_auc_difference(y, s_a, s_b) -> tuple[float, float]:
    """DeLong's estimate written out over every (positive, negative) pair."""

    def placements(s):
        pos, neg = s[y == 1], s[y == 0]
        psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
        return psi.mean(1), psi.mean(0)  # per positive, per negative

    (a10, a01), (b10, b01) = placements(s_a), placements(s_b)
    m, n = len(a10), len(a01)
    cov10 = np.cov(np.stack([a10, b10]))  # ddof 1
    cov01 = np.cov(np.stack([a01, b01]))
    var = (cov10[0, 0] + cov10[1, 1] - 2 * cov10[0, 1]) / m
    var += (cov01[0, 0] + cov01[1, 1] - 2 * cov01[0, 1]) / n
    return b10.mean() - a10.mean(), float(np.sqrt(var))


@pytest.mark.parametrize("seed", range(4))
def test_paired_auc_difference_matches_its_plain_twin(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = (rng.random(400) < 0.15).astype(np.int64)
    s_a = np.round(rng.normal(size=400) + y, 1)  # ties, within and across classes
    s_b = np.round(s_a + rng.normal(size=400) * 0.7 + 0.4 * y, 1)
    gain, error = paired_auc_difference(y, s_a, s_b)
    want_gain, want_error = plain_paired_auc_difference(y, s_a, s_b)
    assert gain == pytest.approx(roc_auc(y, s_b) - roc_auc(y, s_a), abs=1e-12)
    assert gain == pytest.approx(want_gain, abs=1e-12)
    assert error == pytest.approx(want_error, rel=1e-9)
    assert error > 0


def test_paired_auc_difference_of_a_scorer_with_itself_is_zero_and_without_a_class_nan() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 100)
    s = rng.normal(size=100)
    assert paired_auc_difference(y, s, s) == (0.0, 0.0)
    # a monotone transform ranks the same: no difference either
    assert paired_auc_difference(y, s, np.exp(s)) == (0.0, 0.0)
    gain, error = paired_auc_difference(np.zeros(100, dtype=np.int64), s, s + 1)
    assert np.isnan(gain) and np.isnan(error)
