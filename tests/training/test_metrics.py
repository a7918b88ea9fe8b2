"""AP / AUC against scikit-learn, MRR and DyGLib's batch averaging on hand cases."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from training.metrics import average_precision, batched, mrr, roc_auc


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
