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

**Decayed counts** (``ModelConfig.transition_decay`` = T > 0): the record also keeps a
second row of the same counts, each weighted by exp(-age / T), and its decayed total,
so that where visitors came from *lately* can outweigh where they came from a month
ago (on Wikipedia a linear probe gained 0.30 AP from them over the raw counts;
docs/results/mooc-experiments.md, sixth round). The row is kept as of the node's newest
entry, whose time every writer already has: the newest column of the node's neighbour
list. A writer scales the row by exp(-(t_new - t_newest) / T) and adds each new entry
with weight exp(-(t_new - t_entry) / T); a query at tau reads it scaled by
exp(-max(tau - t_newest, 0) / T). The record is then ``B`` raw counts, ``B`` decayed
ones and the decayed total: ``record_width``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

TRANSITION_DEPTH = 3  # the other endpoint's latest neighbours a query looks up
PAD = -1  # no previous neighbour (the counterpart's first event)


def transition_feature_dim(buckets: int, decay: float = 0.0) -> int:
    """Head inputs per pair: per direction the counts at the other endpoint's latest
    ``TRANSITION_DEPTH`` neighbours, and the record's total; with ``decay``, the
    decayed ones again."""
    return (2 if decay else 1) * 2 * (TRANSITION_DEPTH + 1) if buckets else 0


def record_width(buckets: int, decay: float = 0.0) -> int:
    """float32 columns of one node's record: the raw counts, then with ``decay`` the
    decayed counts and their total."""
    return buckets + (buckets + 1 if decay else 0) if buckets else 0


def bucket_of(keys: np.ndarray, buckets: int) -> np.ndarray:
    """Bucket of each node key (PAD stays PAD)."""
    keys = np.asarray(keys, dtype=np.int64)
    return np.where(keys >= 0, keys % buckets, PAD)


def empty_counts(n: int, buckets: int, decay: float = 0.0) -> np.ndarray:
    return np.zeros((n, record_width(buckets, decay)), dtype=np.float32)


def decay_factor(age: np.ndarray, decay: float) -> np.ndarray:
    """exp(-max(age, 0) / decay) in float64: an age of +inf (nothing yet) gives 0, and a
    negative or NaN one (a query behind the newest entry; +inf from +inf) gives 1."""
    return np.exp(-np.fmax(np.asarray(age, dtype=np.float64), 0.0) / decay)


def add_counts(
    counts: np.ndarray,
    rows: np.ndarray,
    previous: np.ndarray,
    buckets: int,
    decay: float = 0.0,
    t: np.ndarray | None = None,
    t_newest: np.ndarray | None = None,
) -> None:
    """Add one per entry (``rows[i]``, bucket of ``previous[i]``), in place; entries
    with no previous neighbour add nothing. With ``decay`` the decayed row moves from
    each row's newest time before these entries (``t_newest``, (N,); +inf where the
    node has none) to its newest entry's time (``t``, per entry), whatever the order of
    the entries: a weighted sum does not depend on it."""
    rows = np.asarray(rows, dtype=np.int64)
    b = bucket_of(previous, buckets)
    has = b >= 0
    np.add.at(counts, (rows[has], b[has]), 1.0)
    if not decay:
        return
    if t is None or t_newest is None:
        raise ValueError("decayed transition counts need the entries' and the records' times")
    t = np.asarray(t, dtype=np.float64)
    touched, at = np.unique(rows, return_inverse=True)
    before = np.asarray(t_newest, dtype=np.float64)[touched]  # +inf: an empty record
    after = np.where(np.isfinite(before), before, -np.inf)
    np.maximum.at(after, at, t)
    scale = decay_factor(after - before, decay).astype(np.float32)[:, None]
    if len(touched) == len(counts):  # every row (an apply's nodes): no gather and scatter
        counts[:, buckets:] *= scale
    else:
        counts[touched, buckets:] *= scale
    weight = decay_factor(after[at] - t, decay)[has].astype(np.float32)
    np.add.at(counts, (rows[has], buckets + b[has]), weight)
    np.add.at(counts, (rows[has], np.full(int(has.sum()), 2 * buckets)), weight)


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
    decay: float = 0.0,
    tau: np.ndarray | None = None,
    newest_u: np.ndarray | None = None,
    newest_v: np.ndarray | None = None,
) -> np.ndarray:
    """(N, transition_feature_dim) float32 head inputs of pairs (u_i, v_i): log1p of v's
    counts at the buckets of u's latest neighbours (``latest_u``: (N, TRANSITION_DEPTH)
    keys, PAD where fewer) and of v's total, then u's at v's; with ``decay``, the same
    from the decayed counts at the query times ``tau``, each record read from its
    node's newest entry time (``newest_u``, ``newest_v``: the lists' newest column).
    The torch and numpy scorers both call it with their own latest neighbours."""
    bu, bv = bucket_of(latest_u, buckets), bucket_of(latest_v, buckets)
    cols = [
        records_v.at(bu),
        records_v.totals()[:, None],
        records_u.at(bv),
        records_u.totals()[:, None],
    ]
    if decay:
        if tau is None or newest_u is None or newest_v is None:
            raise ValueError("decayed transition counts need the query and the records' times")
        at_v, total_v = records_v.decayed(bu, tau, newest_v)
        at_u, total_u = records_u.decayed(bv, tau, newest_u)
        cols += [at_v, total_v[:, None], at_u, total_u[:, None]]
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

    def decayed(
        self, buckets: np.ndarray, tau: np.ndarray, newest: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(N, K) decayed counts at buckets[i, k] and (N,) decayed totals, read at
        ``tau`` from records kept as of ``newest`` (each node's newest entry time)."""
        ...


class DenseTransitions:
    """Records held whole: (N, ``record_width``) float32, as the blob and the replay
    keep them."""

    def __init__(self, counts: np.ndarray, buckets: int, decay: float = 0.0) -> None:
        self.counts, self.buckets, self.decay = counts, buckets, decay

    @classmethod
    def empty(cls, n: int, buckets: int, decay: float = 0.0) -> DenseTransitions:
        return cls(empty_counts(n, buckets, decay), buckets, decay)

    def like(self, counts: np.ndarray) -> DenseTransitions:
        return DenseTransitions(counts, self.buckets, self.decay)

    def select(self, index: np.ndarray) -> DenseTransitions:
        return self.like(self.counts[np.asarray(index)])

    def _pick(self, columns: np.ndarray, buckets: np.ndarray) -> np.ndarray:
        rows = np.arange(len(columns))[:, None]
        got = columns[rows, np.maximum(buckets, 0)]
        return np.where(buckets >= 0, got, 0.0).astype(np.float32)

    def at(self, buckets: np.ndarray) -> np.ndarray:
        return self._pick(self.counts[:, : self.buckets], buckets)

    def totals(self) -> np.ndarray:
        return self.counts[:, : self.buckets].sum(1, dtype=np.float64).astype(np.float32)

    def decayed(
        self, buckets: np.ndarray, tau: np.ndarray, newest: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        scale = decay_factor(np.asarray(tau) - np.asarray(newest), self.decay)
        rows = self.counts[:, self.buckets :].astype(np.float64) * scale[:, None]
        return self._pick(rows, buckets), rows[:, self.buckets].astype(np.float32)
