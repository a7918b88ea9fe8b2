"""Rolling link-prediction quality over the last N live samples: AP, AUC, MRR.

A sample is one ingested event scored as a positive against K negatives. AP and AUC
follow scikit-learn's definitions (the same as ``training.metrics``, which the
service may not import); each negative weighs 1/K, so the positives and negatives
weigh the same in all and the AP sits on the scale of the checkpoint's 1:1 test AP
whatever K is (with K = 1 it is the plain AP). MRR is TGB's: the positive's rank
among its own K negatives, ties counted half.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


def _weighted_curve(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted true and false positives at each distinct threshold, highest first."""
    order = np.argsort(-s, kind="mergesort")
    s, y, w = s[order], y[order], w[order]
    thr = np.r_[np.where(np.diff(s))[0], len(s) - 1]
    tps = np.cumsum(w * y)[thr]
    fps = np.cumsum(w * (1.0 - y))[thr]
    return tps, fps


def average_precision(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> float:
    if len(y) == 0 or not (y > 0).any():
        return float("nan")
    tps, fps = _weighted_curve(y, s, w)
    precision = tps / (tps + fps)
    recall = tps / tps[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def roc_auc(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> float:
    if len(y) == 0 or (y > 0).all() or not (y > 0).any():
        return float("nan")
    tps, fps = _weighted_curve(y, s, w)
    tpr = np.r_[0.0, tps / tps[-1]]
    fpr = np.r_[0.0, fps / fps[-1]]
    return float(np.trapezoid(tpr, fpr))


def mean_reciprocal_rank(pos: np.ndarray, neg: np.ndarray) -> float:
    """pos: (P,); neg: (P, K)."""
    if len(pos) == 0:
        return float("nan")
    rank = 1.0 + (neg > pos[:, None]).sum(1) + 0.5 * (neg == pos[:, None]).sum(1)
    return float(np.mean(1.0 / rank))


@dataclass(frozen=True)
class Quality:
    ap: float
    auc: float
    mrr: float
    samples: int


class RollingQuality:
    """The last ``window`` samples (positive logit, K negative logits)."""

    def __init__(self, window: int) -> None:
        self._samples: deque[tuple[float, np.ndarray]] = deque(maxlen=window)

    def add(self, positive: float, negatives: np.ndarray) -> None:
        self._samples.append((positive, np.asarray(negatives, dtype=np.float64)))

    def __len__(self) -> int:
        return len(self._samples)

    def quality(self) -> Quality:
        if not self._samples:
            return Quality(float("nan"), float("nan"), float("nan"), 0)
        pos = np.array([p for p, _ in self._samples], dtype=np.float64)
        negs = [n for _, n in self._samples]
        neg = np.concatenate(negs)
        neg_w = np.concatenate([np.full(len(n), 1.0 / len(n)) for n in negs])
        y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
        s = np.r_[pos, neg]
        w = np.r_[np.ones(len(pos)), neg_w]
        # MRR needs the same K per sample; K only changes with a restart, but a window
        # that straddles a change keeps the samples whose K is the latest one.
        k = len(negs[-1])
        same = [i for i, n in enumerate(negs) if len(n) == k]
        mrr = mean_reciprocal_rank(pos[same], np.stack([negs[i] for i in same]))
        return Quality(average_precision(y, s, w), roc_auc(y, s, w), mrr, len(pos))
