"""Link-prediction metrics: AP and AUC-ROC (scikit-learn's definitions), MRR (TGB's).

* ``average_precision``: sum over distinct thresholds of (R_n - R_{n-1}) * P_n, as
  ``sklearn.metrics.average_precision_score`` (no interpolation).
* ``roc_auc``: area under the ROC curve with ties handled as sklearn does
  (trapezoids between distinct thresholds).
* ``paired_auc_difference``: the difference of two scorers' AUC-ROC on the same
  labelled events and its standard error (DeLong, DeLong & Clarke-Pearson 1988, with
  midranks for ties as in Sun & Xu 2014): how far apart two models are beyond what the
  events' sampling would move them.
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


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``, ties given the mean of the ranks they span."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    # start and end (exclusive) of each run of equal values, for every sorted position
    starts = np.r_[0, np.flatnonzero(np.diff(xs)) + 1]
    ends = np.r_[starts[1:], len(xs)]
    run = np.repeat(np.arange(len(starts)), ends - starts)
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = 0.5 * (starts[run] + ends[run] + 1)
    return ranks


def _structural_components(y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeLong's placements: for each positive the share of negatives it outscores (ties
    half), for each negative the share of positives that outscore it (ties half)."""
    pos, neg = s[y == 1], s[y == 0]
    m, n = len(pos), len(neg)
    all_ranks = _midranks(np.r_[pos, neg])
    v10 = (all_ranks[:m] - _midranks(pos)) / n
    v01 = 1.0 - (all_ranks[m:] - _midranks(neg)) / m
    return v10, v01


def paired_auc_difference(y: np.ndarray, s_a: np.ndarray, s_b: np.ndarray) -> tuple[float, float]:
    """(AUC(s_b) - AUC(s_a), its standard error) on the same events, DeLong's paired
    estimate; (nan, nan) without both classes (at least two of each for the error)."""
    y = np.asarray(y).astype(np.int64)
    m, n = int(y.sum()), int(len(y) - y.sum())
    if m < 2 or n < 2:
        return float("nan"), float("nan")
    a10, a01 = _structural_components(y, np.asarray(s_a, dtype=np.float64))
    b10, b01 = _structural_components(y, np.asarray(s_b, dtype=np.float64))
    d10, d01 = b10 - a10, b01 - a01  # the difference's own placements
    diff = float(d10.mean())
    var = float(d10.var(ddof=1) / m + d01.var(ddof=1) / n)
    return diff, float(np.sqrt(max(var, 0.0)))


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
