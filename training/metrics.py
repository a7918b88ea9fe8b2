"""Link-prediction metrics: AP and AUC-ROC (scikit-learn's definitions), MRR (TGB's).

* ``average_precision``: sum over distinct thresholds of (R_n - R_{n-1}) * P_n, as
  ``sklearn.metrics.average_precision_score`` (no interpolation).
* ``roc_auc``: area under the ROC curve with ties handled as sklearn does
  (trapezoids between distinct thresholds).
* ``mrr``: TGB's rank of a positive among its K negatives, ties counted half
  (rank = 1 + #(neg > pos) + 0.5 * #(neg == pos)), averaged 1/rank.
* ``batched``: DyGLib's convention: split the evaluated events into consecutive
  batches of ``batch_size`` positives (each with its negatives), compute AP/AUC
  per batch, and average over batches. Also the global value over all queries.
"""

from __future__ import annotations

import numpy as np

DYGLIB_EVAL_BATCH = 200


def _curve(y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y, dtype=np.float64)
    s = np.asarray(s, dtype=np.float64)
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    distinct = np.where(np.diff(s))[0]
    thr = np.r_[distinct, len(y) - 1]
    tps = np.cumsum(y)[thr]
    fps = 1 + thr - tps
    return tps, fps


def average_precision(y: np.ndarray, s: np.ndarray) -> float:
    y = np.asarray(y)
    if len(y) == 0 or y.sum() == 0:
        return float("nan")
    tps, fps = _curve(y, s)
    precision = tps / (tps + fps)
    recall = tps / tps[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def roc_auc(y: np.ndarray, s: np.ndarray) -> float:
    y = np.asarray(y)
    n_pos = float(y.sum())
    if len(y) == 0 or n_pos == 0 or n_pos == len(y):
        return float("nan")
    tps, fps = _curve(y, s)
    tpr = np.r_[0.0, tps / tps[-1]]
    fpr = np.r_[0.0, fps / fps[-1]]
    return float(np.trapezoid(tpr, fpr))


def mrr(pos: np.ndarray, neg: np.ndarray) -> float:
    """pos: (P,) scores; neg: (P, K) scores of each positive's K negatives."""
    pos = np.asarray(pos, dtype=np.float64)
    neg = np.asarray(neg, dtype=np.float64)
    if len(pos) == 0:
        return float("nan")
    higher = (neg > pos[:, None]).sum(1)
    ties = (neg == pos[:, None]).sum(1)
    rank = 1.0 + higher + 0.5 * ties
    return float(np.mean(1.0 / rank))


def batched(
    pos: np.ndarray, neg: np.ndarray, batch_size: int = DYGLIB_EVAL_BATCH
) -> dict[str, float]:
    """AP/AUC of positives vs their negatives (one negative per positive, aligned),
    averaged over consecutive batches (DyGLib) and over everything (global)."""
    pos = np.asarray(pos, dtype=np.float64)
    neg = np.asarray(neg, dtype=np.float64)
    aps, aucs = [], []
    for start in range(0, len(pos), batch_size):
        p, n = pos[start : start + batch_size], neg[start : start + batch_size]
        y = np.r_[np.ones(len(p)), np.zeros(len(n))]
        s = np.r_[p, n]
        aps.append(average_precision(y, s))
        aucs.append(roc_auc(y, s))
    y_all = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    s_all = np.r_[pos, neg]
    return {
        "ap": float(np.nanmean(aps)) if aps else float("nan"),
        "auc": float(np.nanmean(aucs)) if aucs else float("nan"),
        "ap_global": average_precision(y_all, s_all),
        "auc_global": roc_auc(y_all, s_all),
        "n_positives": int(len(pos)),
        "n_batches": len(aps),
    }
