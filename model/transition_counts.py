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

**Second order** (``ModelConfig.transition_order2``): a second record of the same shape,
after the first, counts where the visitors came from *two steps back*: the event
(u, v) also adds one to v's second record at the bucket of the pair (p2, p1), u's two
latest neighbours before it (``pair_keys``), and a query reads v's second record at
the pair of u's two latest visible neighbours, and u's at v's. Which item follows the
student's last *two* says more than the last one: on MOOC the model's random-negative
AP rose from 94.72 to 94.96 over 3 seeds (docs/results/mooc-experiments.md, eighth
round). Writers get p2 as they get p1, from the events (``counterpart_previous_two``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

TRANSITION_DEPTH = 3  # the other endpoint's latest neighbours a query looks up
PAD = -1  # no previous neighbour (the counterpart's first event)


def transition_feature_dim(
    buckets: int, decay: float = 0.0, order2: bool = False, latest: bool = False
) -> int:
    """Head inputs per pair: per direction the counts at the other endpoint's latest
    ``TRANSITION_DEPTH`` neighbours, and the record's total; with ``order2`` the second
    record's count at the other endpoint's latest pair; with ``decay``, the decayed
    ones again; with ``latest``, each endpoint's latest transition count."""
    per_direction = TRANSITION_DEPTH + 1 + (1 if order2 else 0)
    if not buckets:
        return 0
    return (2 if decay else 1) * 2 * per_direction + (2 if latest else 0)


def record_width(buckets: int, decay: float = 0.0, order2: bool = False) -> int:
    """float32 columns of one node's record: the raw counts, then with ``decay`` the
    decayed counts and their total; with ``order2`` the second record's, after them."""
    one = buckets + (buckets + 1 if decay else 0) if buckets else 0
    return 2 * one if order2 else one


def pair_keys(older: np.ndarray, newer: np.ndarray) -> np.ndarray:
    """A 63-bit key of each ordered pair of node keys (PAD where either is PAD), for the
    second-order record's buckets."""
    older = np.asarray(older, dtype=np.int64)
    newer = np.asarray(newer, dtype=np.int64)
    mixed = older.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + newer.astype(np.uint64)
    key = (mixed >> np.uint64(1)).astype(np.int64)
    return np.where((older >= 0) & (newer >= 0), key, PAD)


def bucket_of(keys: np.ndarray, buckets: int) -> np.ndarray:
    """Bucket of each node key (PAD stays PAD)."""
    keys = np.asarray(keys, dtype=np.int64)
    return np.where(keys >= 0, keys % buckets, PAD)


def empty_counts(n: int, buckets: int, decay: float = 0.0, order2: bool = False) -> np.ndarray:
    return np.zeros((n, record_width(buckets, decay, order2)), dtype=np.float32)


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


def add_transitions(
    counts: np.ndarray,
    rows: np.ndarray,
    previous: np.ndarray,
    buckets: int,
    decay: float = 0.0,
    t: np.ndarray | None = None,
    t_newest: np.ndarray | None = None,
    previous_pair: np.ndarray | None = None,
) -> None:
    """``add_counts`` into the first record, and, where the records keep a second one
    (twice ``record_width`` columns), the pairs ``previous_pair`` (``pair_keys`` of each
    entry's two previous neighbours) into it."""
    one = record_width(buckets, decay)
    if counts.shape[1] == one:
        add_counts(counts, rows, previous, buckets, decay, t, t_newest)
        return
    if previous_pair is None:
        raise ValueError("these records keep second-order counts: pass the previous pairs")
    add_counts(counts[:, :one], rows, previous, buckets, decay, t, t_newest)
    add_counts(counts[:, one:], rows, previous_pair, buckets, decay, t, t_newest)


def counterpart_previous_two(
    src: Sequence[int], dst: Sequence[int], latest: dict[int, int], before: dict[int, int]
) -> tuple[list[int], list[int], list[int], list[int]]:
    """``counterpart_previous``, and the neighbour before that one: for events (src[i],
    dst[i]) in (t, seq) order, the destination's previous neighbour and the one before
    it (what the source's records count), then the source's. ``latest`` and ``before``
    map a node key to its latest and second-latest neighbour's key so far (missing:
    none), updated in place; a self-loop is two entries of the node itself."""
    p1_src, p1_dst, p2_src, p2_dst = [], [], [], []
    for u, v in zip(src, dst, strict=True):
        pu, pv = latest.get(u, PAD), latest.get(v, PAD)
        p1_src.append(pv)
        p2_src.append(before.get(v, PAD))
        p1_dst.append(pu)
        p2_dst.append(before.get(u, PAD))
        if u == v:
            before[u], latest[u] = u, u
        else:
            before[u], latest[u] = pu, v
            before[v], latest[v] = pv, u
    return p1_src, p1_dst, p2_src, p2_dst


def counterpart_previous(
    src: Sequence[int], dst: Sequence[int], latest: dict[int, int]
) -> tuple[list[int], list[int]]:
    """For events (src[i], dst[i]) (node keys) in (t, seq) order: the previous
    neighbour of the destination (what the source's record counts) and of the source
    (the destination's), each before its event. ``latest`` maps a node key to the key
    of its latest neighbour so far (missing: none) and is updated in place."""
    for_src, for_dst, _, _ = counterpart_previous_two(src, dst, latest, {})
    return for_src, for_dst


def latest_transition_counts(
    counts: np.ndarray | None,
    src_rows: Sequence[int],
    dst_rows: Sequence[int],
    src_previous: Sequence[int],
    dst_previous: Sequence[int],
    buckets: int,
) -> tuple[list[float], list[float]]:
    """Per event (src_rows[i], dst_rows[i]) in (t, seq) order: how often the source's
    latest transition (its own previous neighbour, ``src_previous[i]``, then the
    destination) had been made before this event, which is the destination's raw
    transition count at the bucket of ``src_previous[i]`` before the event's own adds;
    and the same for the destination. ``counts``: the records before these events (None:
    all empty); PAD previous: 0.

    ``ModelConfig.latest_transition_count`` (an experiment; served only when read at the
    query, ``latest_transition_at_query``): it normalises
    the second-order counts (how often anyone took this path), which on MOOC a probe
    found worth 0.5 AP and gave the model +0.43 over 3 seeds
    (docs/results/mooc-experiments.md, ninth round). It is the
    one value here that a writer takes from its counterpart's record, so every writer
    must see the counterpart's record as of the event; the trainer and the replay do,
    the service's writers (which may advance one endpoint without the other) do not
    yet."""
    added: dict[tuple[int, int], int] = {}
    met_src: list[float] = []
    met_dst: list[float] = []
    for s, d, ps, pd in zip(src_rows, dst_rows, src_previous, dst_previous, strict=True):
        bs = ps % buckets if ps >= 0 else -1
        bd = pd % buckets if pd >= 0 else -1
        for row, b, out in ((d, bs, met_src), (s, bd, met_dst)):
            if b < 0:
                out.append(0.0)
                continue
            start = float(counts[row, b]) if counts is not None else 0.0
            out.append(start + added.get((row, b), 0))
        for row, b in ((d, bs), (s, bd)):
            if b >= 0:
                added[(row, b)] = added.get((row, b), 0) + 1
    return met_src, met_dst


def latest_transition_at_query(
    newest_records: TransitionCounts, second_keys: np.ndarray, buckets: int, has: np.ndarray
) -> np.ndarray:
    """(N,) float32: each node's latest transition count read at the query
    (``ModelConfig.latest_transition_at_query``): its newest neighbour l1's raw count at
    the bucket of the neighbour before it (``second_keys``: l2's key, PAD where the node
    has fewer than two), from l1's record as it stands (``newest_records``: row i is the
    i-th node's l1); 0 where the node has no neighbour (``has`` False).

    Against ``latest_transition_counts`` it also counts the node's own transition and
    those made after it, and it needs no writer to take anything from a counterpart's
    record: what a service can serve with one more read, for l1's record."""
    second = bucket_of(np.asarray(second_keys, dtype=np.int64), buckets)[:, None]
    value = newest_records.at(second)[:, 0]
    return np.where(np.asarray(has, dtype=bool), value, 0.0).astype(np.float32)


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
    order2: bool = False,
    latest: bool = False,
) -> np.ndarray:
    """(N, transition_feature_dim) float32 head inputs of pairs (u_i, v_i): log1p of v's
    counts at the buckets of u's latest neighbours (``latest_u``: (N, TRANSITION_DEPTH)
    keys, newest first, PAD where fewer) and of v's total, then u's at v's; with
    ``order2``, v's second record at the pair of u's two latest, and u's at v's; with
    ``decay``, the same from the decayed counts at the query times ``tau``, each record
    read from its node's newest entry time (``newest_u``, ``newest_v``: the lists'
    newest column); with ``latest``, u's and v's latest transition counts
    (``latest_transition_counts``). The torch and numpy scorers both call it with their
    own latest neighbours."""
    bu, bv = bucket_of(latest_u, buckets), bucket_of(latest_v, buckets)
    cols = [
        records_v.at(bu),
        records_v.totals()[:, None],
        records_u.at(bv),
        records_u.totals()[:, None],
    ]
    if order2:
        pu = bucket_of(pair_keys(latest_u[:, 1], latest_u[:, 0]), buckets)[:, None]
        pv = bucket_of(pair_keys(latest_v[:, 1], latest_v[:, 0]), buckets)[:, None]
        second_u, second_v = records_u.second(), records_v.second()
        cols += [second_v.at(pu), second_u.at(pv)]
    if decay:
        if tau is None or newest_u is None or newest_v is None:
            raise ValueError("decayed transition counts need the query and the records' times")
        at_v, total_v = records_v.decayed(bu, tau, newest_v)
        at_u, total_u = records_u.decayed(bv, tau, newest_u)
        cols += [at_v, total_v[:, None], at_u, total_u[:, None]]
        if order2:
            cols += [second_v.decayed(pu, tau, newest_v)[0], second_u.decayed(pv, tau, newest_u)[0]]
    if latest:
        cols += [records_u.latest()[:, None], records_v.latest()[:, None]]
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

    def second(self) -> TransitionCounts:
        """The same rows' second-order records (``ModelConfig.transition_order2``)."""
        ...

    def latest(self) -> np.ndarray:
        """(N,) each row's latest transition count (``latest_transition_counts``)."""
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

    def __init__(
        self,
        counts: np.ndarray,
        buckets: int,
        decay: float = 0.0,
        latest: np.ndarray | None = None,
    ) -> None:
        self.counts, self.buckets, self.decay = counts, buckets, decay
        self.latest_counts = latest  # (N,) where kept (the replay's experiment)

    @classmethod
    def empty(
        cls, n: int, buckets: int, decay: float = 0.0, order2: bool = False
    ) -> DenseTransitions:
        return cls(empty_counts(n, buckets, decay, order2), buckets, decay)

    def like(self, counts: np.ndarray) -> DenseTransitions:
        return DenseTransitions(counts, self.buckets, self.decay)

    def select(self, index: np.ndarray) -> DenseTransitions:
        index = np.asarray(index)
        latest = None if self.latest_counts is None else self.latest_counts[index]
        return DenseTransitions(self.counts[index], self.buckets, self.decay, latest)

    def latest(self) -> np.ndarray:
        if self.latest_counts is None:
            raise ValueError("these records keep no latest transition counts")
        return self.latest_counts.astype(np.float32)

    def second(self) -> DenseTransitions:
        one = record_width(self.buckets, self.decay)
        if self.counts.shape[1] != 2 * one:
            raise ValueError("these records keep no second-order counts")
        return DenseTransitions(self.counts[:, one:], self.buckets, self.decay)

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
