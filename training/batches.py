"""Index structures over an edge stream, shared by the trainer, evaluator and baselines.

* ``IndexedStream``: the stream with node ids mapped to dense indices (for arrays)
  and to the stable 63-bit keys the model sees (``node_key``), plus event order
  (row index = sequence number).
* ``NodeEventIndex``: per-node event lists (CSR) over a subset of the events, in
  (t, seq) order. An event (u, v) is one entry in u's list (role src) and one in
  v's (role dst); a self-loop (u, u) gives u two entries, src first then dst, which
  is the order ``events.endpoint_events`` produces them in.
  ``prefix_count(node, t)`` = how many of a node's events have time < t, i.e. which
  state a query at t reads under exact visibility; ``neighbour_lists`` gathers the
  last L (key, t) entries before such a prefix, exactly what the service's
  recent-neighbour list holds when it scores a query at t.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from model.events import ROLE_DST, ROLE_SRC, EventInputs
from model.node_ids import node_keys
from model.pair_features import PAD_KEY
from model.role_counts import empty_records, prefix_records
from model.streaming import NeighbourLists
from model.transition_counts import PAD as NO_PREVIOUS
from model.transition_counts import (
    bucket_of,
    counterpart_previous,
    decay_factor,
    latest_transition_at_query,
    latest_transition_counts,
    pair_keys,
)

from .data import EdgeStream


@dataclass
class IndexedStream:
    stream: EdgeStream
    node_ids: np.ndarray  # (N,) object: canonical id strings, sorted
    keys: np.ndarray  # (N,) int64 node_key of each node
    src: np.ndarray  # (E,) int64 node index
    dst: np.ndarray  # (E,) int64 node index
    t: np.ndarray  # (E,) float64
    features: np.ndarray  # (E, F) float32

    @classmethod
    def build(cls, stream: EdgeStream) -> IndexedStream:
        ids = np.unique(np.concatenate([stream.src, stream.dst]).astype(str))
        lookup = {n: i for i, n in enumerate(ids)}
        src = np.fromiter((lookup[s] for s in stream.src), dtype=np.int64, count=len(stream))
        dst = np.fromiter((lookup[d] for d in stream.dst), dtype=np.int64, count=len(stream))
        return cls(
            stream=stream,
            node_ids=ids.astype(object),
            keys=node_keys(ids),
            src=src,
            dst=dst,
            t=stream.t.astype(np.float64),
            features=stream.features.astype(np.float32),
        )

    @property
    def num_nodes(self) -> int:
        return int(self.keys.shape[0])

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])

    def __len__(self) -> int:
        return int(self.t.shape[0])


@dataclass
class NodeEventIndex:
    """Per-node event lists (CSR) over the events ``events`` (indices, in stream order)."""

    num_nodes: int
    offsets: np.ndarray  # (N+1,) int64
    event: np.ndarray  # (M,) int64 stream index of each entry
    role: np.ndarray  # (M,) int64
    other: np.ndarray  # (M,) int64 node index of the other endpoint
    other_key: np.ndarray  # (M,) int64
    t: np.ndarray  # (M,) float64
    # For vectorised prefix counts: composite sort key (node, rank of t).
    _unique_t: np.ndarray
    _comp: np.ndarray
    # Role-count records at every prefix (built on first use).
    _records: np.ndarray | None = None
    # Transition counts at every prefix, per number of buckets (built on first use).
    _transitions: dict[tuple[int, float, int], PrefixTransitionIndex] | None = None
    # Latest transition counts per entry, per number of buckets (built on first use).
    _latest_counts: dict[int, np.ndarray] | None = None

    @classmethod
    def build(cls, data: IndexedStream, events: np.ndarray) -> NodeEventIndex:
        events = np.asarray(events, dtype=np.int64)
        n = data.num_nodes
        ev2 = np.concatenate([events, events])
        node = np.concatenate([data.src[events], data.dst[events]])
        other = np.concatenate([data.dst[events], data.src[events]])
        role = np.concatenate(
            [np.full(len(events), ROLE_SRC), np.full(len(events), ROLE_DST)]
        ).astype(np.int64)
        order = np.lexsort((role, ev2, node))  # by node, then event (t, seq), then src before dst
        node, ev2, other, role = node[order], ev2[order], other[order], role[order]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(node, minlength=n), out=offsets[1:])
        t = data.t[ev2]
        unique_t = np.unique(data.t)
        comp = node * (len(unique_t) + 1) + np.searchsorted(unique_t, t)
        return cls(n, offsets, ev2, role, other, data.keys[other], t, unique_t, comp)

    def count(self, nodes: np.ndarray) -> np.ndarray:
        return self.offsets[nodes + 1] - self.offsets[nodes]

    def prefix_count(self, nodes: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Number of each node's events with time strictly < t (vectorised)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        rank = np.searchsorted(self._unique_t, np.asarray(t, dtype=np.float64), side="left")
        pos = np.searchsorted(self._comp, nodes * (len(self._unique_t) + 1) + rank, side="left")
        return pos - self.offsets[nodes]

    def prefix_count_before_event(self, nodes: np.ndarray, event: np.ndarray) -> np.ndarray:
        """Number of each node's entries from stream events with index < ``event``."""
        out = np.empty(len(nodes), dtype=np.int64)
        for i, (n, e) in enumerate(zip(nodes.tolist(), event.tolist(), strict=True)):
            lo, hi = self.offsets[n], self.offsets[n + 1]
            out[i] = np.searchsorted(self.event[lo:hi], e, side="left")
        return out

    def counterpart_previous_keys(self, back: int = 1) -> np.ndarray:
        """(M,) per entry: the key of the other endpoint's latest neighbour before the
        entry's event (``back`` = 2: the one before that; NO_PREVIOUS: none), over this
        index's events: what ``transition_counts.counterpart_previous`` (and
        ``counterpart_previous_two``) give a writer in stream order."""
        m = len(self.event)
        pos = np.arange(m)
        local = np.searchsorted(np.unique(self.event), self.event)
        src_entry = np.zeros(local.max() + 1 if m else 0, dtype=np.int64)
        dst_entry = np.zeros_like(src_entry)
        src_entry[local[self.role == ROLE_SRC]] = pos[self.role == ROLE_SRC]
        dst_entry[local[self.role == ROLE_DST]] = pos[self.role == ROLE_DST]
        counterpart_entry = np.where(self.role == ROLE_SRC, dst_entry[local], src_entry[local])
        # A self-loop's two entries are the node's own; its first (src) one is where the
        # node's earlier events end.
        self_loop = self.other == np.repeat(np.arange(self.num_nodes), np.diff(self.offsets))
        first = np.where(self_loop, src_entry[local], counterpart_entry)
        has = first - back >= self.offsets[self.other]
        return np.where(has, self.other_key[np.maximum(first - back, 0)], NO_PREVIOUS)

    def transitions(
        self,
        nodes: np.ndarray,
        m: np.ndarray,
        buckets: int,
        decay: float = 0.0,
        order2: bool = False,
        latest: bool = False,
    ) -> PrefixTransitions:
        """Each node's transition counts after its first ``m`` events (and, with
        ``order2``, its second-order ones; with ``latest``, its latest transition count
        after them)."""
        if self._transitions is None:
            self._transitions = {}
        for order in (1, 2) if order2 else (1,):
            if (buckets, decay, order) not in self._transitions:
                self._transitions[(buckets, decay, order)] = PrefixTransitionIndex.build(
                    self, buckets, decay, second=order == 2
                )
        second = self._transitions[(buckets, decay, 2)] if order2 else None
        counts = None
        if latest:
            per_entry = self.latest_transition_counts(buckets)
            nodes, m = np.asarray(nodes), np.asarray(m)
            at = np.maximum(self.offsets[nodes] + m - 1, 0)
            counts = np.where(m > 0, per_entry[at] if len(per_entry) else 0.0, 0.0)
        return PrefixTransitions(self._transitions[(buckets, decay, 1)], nodes, m, second, counts)

    def newest_two(self, nodes: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Among each node's first ``m`` entries: the node index of its newest entry's
        other endpoint (-1: none) and the key of the one before (NO_PREVIOUS: none)."""
        nodes, m = np.asarray(nodes, dtype=np.int64), np.asarray(m, dtype=np.int64)
        if len(self.event) == 0:
            return np.full(len(nodes), -1), np.full(len(nodes), NO_PREVIOUS)
        start = self.offsets[nodes]
        newest = np.where(m >= 1, self.other[np.maximum(start + m - 1, 0)], -1)
        second = np.where(m >= 2, self.other_key[np.maximum(start + m - 2, 0)], NO_PREVIOUS)
        return newest, second

    def latest_at_query(
        self,
        nodes: np.ndarray,
        m: np.ndarray,
        seen: Callable[[np.ndarray], np.ndarray],
        buckets: int,
        decay: float = 0.0,
    ) -> np.ndarray:
        """``ModelConfig.latest_transition_at_query`` of nodes after their first ``m``
        entries: their newest neighbour's record after ``seen(newest)`` of its own
        entries (what the same query sees of it)."""
        newest, second = self.newest_two(nodes, m)
        has = newest >= 0
        newest = np.maximum(newest, 0)
        records = self.transitions(newest, seen(newest), buckets, decay)
        return latest_transition_at_query(records, second, buckets, has)

    def latest_transition_counts(self, buckets: int) -> np.ndarray:
        """(M,) per entry: the node's latest transition count after it
        (``transition_counts.latest_transition_counts``, walked over this index's events
        in stream order)."""
        if self._latest_counts is None:
            self._latest_counts = {}
        if buckets not in self._latest_counts:
            node_of = np.repeat(np.arange(self.num_nodes), np.diff(self.offsets))
            src_e = np.flatnonzero(self.role == ROLE_SRC)
            dst_e = np.flatnonzero(self.role == ROLE_DST)
            src_e = src_e[np.argsort(self.event[src_e], kind="stable")]
            dst_e = dst_e[np.argsort(self.event[dst_e], kind="stable")]
            src, dst = node_of[src_e], node_of[dst_e]
            src_key, dst_key = self.other_key[dst_e], self.other_key[src_e]
            # each endpoint's own previous neighbour: what the other endpoint's record counts
            for_src, for_dst = counterpart_previous(src_key.tolist(), dst_key.tolist(), {})
            met_src, met_dst = latest_transition_counts(
                None, src.tolist(), dst.tolist(), for_dst, for_src, buckets
            )
            out = np.zeros(len(self.event))
            out[src_e], out[dst_e] = met_src, met_dst
            self._latest_counts[buckets] = out
        return self._latest_counts[buckets]

    def neighbour_lists(
        self,
        nodes: np.ndarray,
        m: np.ndarray,
        length: int,
        role_counts: bool = False,
        transition_buckets: int = 0,
        transition_decay: float = 0.0,
        transition_order2: bool = False,
        latest_transition_count: bool = False,
    ) -> NeighbourLists:
        """Last ``length`` (other key, t) entries among each node's first ``m`` events;
        with ``role_counts``, also each node's role-count record after them, and with
        ``transition_buckets`` its transition counts."""
        nodes = np.asarray(nodes, dtype=np.int64)
        m = np.asarray(m, dtype=np.int64)
        records = self.role_count_records(nodes, m) if role_counts else None
        transitions = (
            self.transitions(
                nodes,
                m,
                transition_buckets,
                transition_decay,
                transition_order2,
                latest_transition_count,
            )
            if transition_buckets
            else None
        )
        j = np.arange(length)
        idx = self.offsets[nodes][:, None] + m[:, None] - length + j[None, :]
        valid = j[None, :] >= (length - m)[:, None]
        idx = np.where(valid, idx, 0)
        if len(self.other_key) == 0:
            valid = np.zeros_like(valid)
            keys = np.full(valid.shape, PAD_KEY, dtype=np.int64)
            times = np.full(valid.shape, np.inf)
        else:
            keys = np.where(valid, self.other_key[idx], PAD_KEY)
            times = np.where(valid, self.t[idx], np.inf)
        return NeighbourLists(
            torch.from_numpy(keys.astype(np.int64)),
            torch.from_numpy(times.astype(np.float64)),
            records,
            transitions,
        )

    def role_count_records(self, nodes: np.ndarray, m: np.ndarray) -> torch.Tensor:
        """(len(nodes), RECORD_WIDTH) role-count records after each node's first ``m``
        events (the recurrence at every prefix, computed on first use)."""
        if self._records is None:
            self._records = prefix_records(self.offsets, self.t, self.role)
        records = self._records
        out = empty_records(len(nodes))
        has = m > 0
        out[has] = records[self.offsets[nodes[has]] + m[has] - 1]
        return torch.from_numpy(out)

    def last_time(self, nodes: np.ndarray, m: np.ndarray) -> np.ndarray:
        """Time of each node's m-th event (the last one of the prefix), -inf when m == 0."""
        idx = self.offsets[nodes] + m - 1
        return np.where(
            m > 0,
            self.t[np.clip(idx, 0, max(len(self.t) - 1, 0))] if len(self.t) else -np.inf,
            -np.inf,
        )

    def event_inputs(
        self, data: IndexedStream, nodes: np.ndarray, start: np.ndarray, stop: np.ndarray
    ) -> tuple[EventInputs, torch.Tensor]:
        """Padded (n, T) inputs of each node's entries [start, stop) and their lengths."""
        lengths = (stop - start).astype(np.int64)
        t_len = int(lengths.max()) if len(lengths) else 0
        j = np.arange(t_len)
        valid = j[None, :] < lengths[:, None]
        idx = np.where(valid, self.offsets[nodes][:, None] + start[:, None] + j[None, :], 0)
        if len(self.event) == 0:
            idx = np.zeros_like(idx)
            valid = np.zeros_like(valid)
        ev = self.event[idx] if len(self.event) else np.zeros(idx.shape, dtype=np.int64)
        other = np.where(valid, self.other_key[idx] if len(self.event) else 0, 0)
        role = np.where(valid, self.role[idx] if len(self.event) else 0, 0)
        t = np.where(valid, self.t[idx] if len(self.event) else 0.0, 0.0)
        feats = data.features[ev] * valid[..., None]
        inputs = EventInputs(
            other_key=torch.from_numpy(other.astype(np.int64)),
            role=torch.from_numpy(role.astype(np.int64)),
            features=torch.from_numpy(feats.astype(np.float32)),
            t=torch.from_numpy(t.astype(np.float64)),
            seq=torch.from_numpy(np.where(valid, ev, 0).astype(np.int64)),
        )
        return inputs, torch.from_numpy(lengths)


@dataclass
class PrefixTransitionIndex:
    """Every node's transition counts at every prefix of its entries, without holding
    them: the entries with a previous neighbour, sorted by (node, bucket, position), so
    a count is two binary searches. With ``decay``, each sorted entry also holds its
    bucket's decayed count as of its own time (``decayed``), and each entry, in node
    order, the node's decayed total as of its time (``decayed_total``): a read at tau
    scales the latest of them by exp(-(tau - its time) / decay), as the writers'
    records do (``model/transition_counts.py``)."""

    offsets: np.ndarray
    buckets: int
    span: int  # > any node's entry count
    sorted_keys: np.ndarray  # (node * buckets + bucket) * span + position in the node
    with_previous: np.ndarray  # (M + 1,) running count of entries that have one
    decay: float = 0.0
    sorted_t: np.ndarray | None = None  # time of each sorted entry
    decayed: np.ndarray | None = None  # (sorted) decayed count of its bucket at its time
    entry_t: np.ndarray | None = None  # (M,) time of each entry, node order
    decayed_total: np.ndarray | None = None  # (M,) decayed total at each entry's time

    @classmethod
    def build(
        cls, index: NodeEventIndex, buckets: int, decay: float = 0.0, second: bool = False
    ) -> PrefixTransitionIndex:
        """The first-order records (the bucket of the counterpart's previous neighbour)
        or, with ``second``, the second-order ones (of its two previous ones' pair)."""
        previous = index.counterpart_previous_keys()
        if second:
            previous = pair_keys(index.counterpart_previous_keys(back=2), previous)
        b = bucket_of(previous, buckets)
        sizes = np.diff(index.offsets)
        node = np.repeat(np.arange(index.num_nodes), sizes)
        position = np.arange(len(b)) - index.offsets[node]
        span = int(sizes.max()) + 1 if len(sizes) else 1
        has = b >= 0
        keys = (node[has] * buckets + b[has]) * span + position[has]
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        running = np.concatenate([[0], np.cumsum(has)])
        out = cls(index.offsets, buckets, span, keys, running)
        if decay:
            out.decay = decay
            out.sorted_t = index.t[has][order]
            out.decayed = decayed_runs(keys // span, out.sorted_t, np.ones(len(keys)), decay)
            out.entry_t = index.t
            out.decayed_total = decayed_runs(node, index.t, has.astype(np.float64), decay)
        return out


def decayed_runs(group: np.ndarray, t: np.ndarray, add: np.ndarray, decay: float) -> np.ndarray:
    """Along runs of equal ``group`` (times non-decreasing within a run): after each
    element, the sum of the run's ``add`` so far, each weighted by exp(-(t_now - t_j) /
    decay). A plain loop: a running product would under- or overflow over a stream."""
    out = np.empty(len(t), dtype=np.float64)
    factor = np.exp(-np.diff(t, prepend=t[:1] if len(t) else t) / decay)
    same = np.r_[False, group[1:] == group[:-1]] if len(t) else np.zeros(0, dtype=bool)
    value = 0.0
    for i, (f, s, a) in enumerate(zip(factor.tolist(), same.tolist(), add.tolist(), strict=True)):
        value = value * f + a if s else a
        out[i] = value
    return out


class PrefixTransitions:
    """``TransitionCounts`` of nodes after their first ``m`` entries (the trainer's)."""

    def __init__(
        self,
        index: PrefixTransitionIndex,
        nodes: np.ndarray,
        m: np.ndarray,
        second_index: PrefixTransitionIndex | None = None,
        latest: np.ndarray | None = None,
    ) -> None:
        self.index, self.nodes, self.m = index, np.asarray(nodes), np.asarray(m)
        self.second_index = second_index
        self.latest_counts = latest

    def select(self, index: np.ndarray) -> PrefixTransitions:
        latest = None if self.latest_counts is None else self.latest_counts[index]
        return PrefixTransitions(
            self.index, self.nodes[index], self.m[index], self.second_index, latest
        )

    def second(self) -> PrefixTransitions:
        if self.second_index is None:
            raise ValueError("these records keep no second-order counts")
        return PrefixTransitions(self.second_index, self.nodes, self.m)

    def latest(self) -> np.ndarray:
        if self.latest_counts is None:
            raise ValueError("these records keep no latest transition counts")
        return np.asarray(self.latest_counts, dtype=np.float32)

    def _ranges(self, buckets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ix = self.index
        base = (self.nodes[:, None] * ix.buckets + np.maximum(buckets, 0)) * ix.span
        hi = np.searchsorted(ix.sorted_keys, base + self.m[:, None], side="left")
        lo = np.searchsorted(ix.sorted_keys, base, side="left")
        return lo, np.where(buckets >= 0, hi, lo)

    def at(self, buckets: np.ndarray) -> np.ndarray:
        lo, hi = self._ranges(buckets)
        return (hi - lo).astype(np.float32)

    def totals(self) -> np.ndarray:
        start = self.index.offsets[self.nodes]
        w = self.index.with_previous
        return (w[start + self.m] - w[start]).astype(np.float32)

    def decayed(
        self, buckets: np.ndarray, tau: np.ndarray, newest: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """As the writers keep them: each value as of the node's newest entry
        (``newest``), then scaled to ``tau``."""
        ix = self.index
        assert ix.decayed is not None and ix.sorted_t is not None
        assert ix.decayed_total is not None and ix.entry_t is not None
        tau, newest = np.asarray(tau, dtype=np.float64), np.asarray(newest, dtype=np.float64)
        to_tau = decay_factor(tau - newest, ix.decay)
        lo, hi = self._ranges(buckets)
        last = np.maximum(hi - 1, 0)
        value = ix.decayed[last] * decay_factor(newest[:, None] - ix.sorted_t[last], ix.decay)
        at = np.where(hi > lo, value * to_tau[:, None], 0.0)
        entry = self.index.offsets[self.nodes] + self.m - 1
        safe = np.maximum(entry, 0)
        total = ix.decayed_total[safe] * decay_factor(newest - ix.entry_t[safe], ix.decay)
        totals = np.where(self.m > 0, total * to_tau, 0.0)
        return at.astype(np.float32), totals.astype(np.float32)
