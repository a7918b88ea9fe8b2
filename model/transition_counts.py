"""Per-node transition counts: which neighbours an endpoint's counterparts came from
(``ModelConfig.transition_buckets``).

For an event (u, v), let p be u's latest neighbour *before* the event (u's previous
item, on a student-item stream). The event adds one to v's count at p's bucket, and
symmetrically one to u's count at the bucket of v's previous neighbour. So v's record
says, over its whole history, where its visitors had been just before: the column of
the online "which item follows which" table that belongs to v. On MOOC that table alone
ranks the next item at 94.6 AP (docs/results/mooc-experiments.md), and nothing in a
node's own events can learn it: what follows p is written by *other* students.

The record is a hashed count vector (``bucket_of``: the 63-bit node key modulo the
number of buckets), float32 counts, kept beside the neighbour list. A query (u, v, tau)
reads v's counts at the buckets of u's latest ``TRANSITION_DEPTH`` visible neighbours,
and u's at v's, plus each record's total: ``transition_features``.

p is a property of the event stream, not of u's model state: u's previous event in
the log. Writers therefore get it from the events themselves (``counterpart_previous``),
in (t, seq) order, whatever model version applies them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

TRANSITION_DEPTH = 3  # the other endpoint's latest neighbours a query looks up
PAD = -1  # no previous neighbour (the counterpart's first event)


def transition_feature_dim(buckets: int) -> int:
    """Head inputs per pair: per direction the counts at the other endpoint's latest
    ``TRANSITION_DEPTH`` neighbours, and the record's total."""
    return 2 * (TRANSITION_DEPTH + 1) if buckets else 0


def bucket_of(keys: np.ndarray, buckets: int) -> np.ndarray:
    """Bucket of each node key (PAD stays PAD)."""
    keys = np.asarray(keys, dtype=np.int64)
    return np.where(keys >= 0, keys % buckets, PAD)


def empty_counts(n: int, buckets: int) -> np.ndarray:
    return np.zeros((n, buckets), dtype=np.float32)


def advance_counts(
    counts: np.ndarray, rows: np.ndarray, previous: np.ndarray, buckets: int
) -> np.ndarray:
    """A copy of ``counts`` with one added per entry (``rows[i]``, bucket of
    ``previous[i]``); entries with no previous neighbour add nothing."""
    out = np.array(counts, dtype=np.float32, copy=True)
    add_counts(out, rows, previous, buckets)
    return out


def add_counts(counts: np.ndarray, rows: np.ndarray, previous: np.ndarray, buckets: int) -> None:
    """``advance_counts`` in place."""
    b = bucket_of(previous, buckets)
    has = b >= 0
    np.add.at(counts, (np.asarray(rows)[has], b[has]), 1.0)


def counterpart_previous(
    src: Sequence[int], dst: Sequence[int], latest: dict[int, int]
) -> tuple[list[int], list[int]]:
    """For events (src[i], dst[i]) (node keys) in (t, seq) order: the previous
    neighbour of the destination (what the source's record counts) and of the source
    (the destination's), each before its event. ``latest`` maps a node key to the key
    of its latest neighbour so far (missing: none) and is updated in place."""
    for_src, for_dst = [], []
    for u, v in zip(src, dst, strict=True):
        pu, pv = latest.get(u, PAD), latest.get(v, PAD)
        for_src.append(pv)
        for_dst.append(pu)
        latest[u] = v
        latest[v] = u
    return for_src, for_dst


def transition_features(
    records_u: TransitionCounts,
    records_v: TransitionCounts,
    latest_u: np.ndarray,
    latest_v: np.ndarray,
    buckets: int,
) -> np.ndarray:
    """(N, transition_feature_dim) float32 head inputs of pairs (u_i, v_i): log1p of v's
    counts at the buckets of u's latest neighbours (``latest_u``: (N, TRANSITION_DEPTH)
    keys, PAD where fewer) and of v's total, then u's at v's. The torch and numpy
    scorers both call it with their own latest neighbours."""
    cols = [
        records_v.at(bucket_of(latest_u, buckets)),
        records_v.totals()[:, None],
        records_u.at(bucket_of(latest_v, buckets)),
        records_u.totals()[:, None],
    ]
    return np.log1p(np.concatenate(cols, axis=1).astype(np.float32))


class TransitionCounts(Protocol):
    """Rows of transition-count records, however they are held."""

    def select(self, index: np.ndarray) -> TransitionCounts: ...

    def at(self, buckets: np.ndarray) -> np.ndarray:
        """(N, K) counts of row i at buckets[i, k] (PAD: 0)."""
        ...

    def totals(self) -> np.ndarray:
        """(N,) each row's total."""
        ...


class DenseTransitions:
    """Records held whole: (N, buckets) float32, as the blob and the replay keep them."""

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = counts

    def select(self, index: np.ndarray) -> DenseTransitions:
        return DenseTransitions(self.counts[np.asarray(index)])

    def at(self, buckets: np.ndarray) -> np.ndarray:
        rows = np.arange(len(self.counts))[:, None]
        got = self.counts[rows, np.maximum(buckets, 0)]
        return np.where(buckets >= 0, got, 0.0).astype(np.float32)

    def totals(self) -> np.ndarray:
        return self.counts.sum(1, dtype=np.float64).astype(np.float32)
