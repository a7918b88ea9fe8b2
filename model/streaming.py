"""The two operations a streaming consumer of the model runs, shared by the offline
evaluator and the HTTP service so that both compute exactly the same numbers:

* ``advance``: apply each node's new events (in (t, seq) order) to its state, all
  nodes at once, as a segmented step over event ranks.
* ``score``: logits for (u, v, tau) pairs from the nodes' states (decayed to tau)
  and their recent-neighbour lists (pair features). Never writes anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .link_model import ROLE_DST, ROLE_SRC, DygMambaLinkModel, EventInputs
from .node_state import NodeStates
from .pair_features import PAD_KEY, pair_features


@dataclass(frozen=True)
class NodeEvent:
    """One event as seen from one endpoint."""

    other_key: int
    role: int  # ROLE_SRC if this node was the source
    features: Sequence[float]
    t: float
    seq: int


def endpoint_events(src_key: int, dst_key: int, features: Sequence[float], t: float, seq: int) -> tuple[NodeEvent, NodeEvent]:
    """The event (src, dst, t) as seen from the source and from the destination."""
    return NodeEvent(dst_key, ROLE_SRC, features, t, seq), NodeEvent(src_key, ROLE_DST, features, t, seq)


def pad_events(per_node: Sequence[Sequence[NodeEvent]], feature_dim: int) -> tuple[EventInputs, torch.Tensor]:
    """Per-node event lists -> padded (N, T) inputs and lengths."""
    n = len(per_node)
    lengths = np.fromiter((len(e) for e in per_node), dtype=np.int64, count=n)
    t_len = int(lengths.max()) if n else 0
    other = np.zeros((n, t_len), dtype=np.int64)
    role = np.zeros((n, t_len), dtype=np.int64)
    feats = np.zeros((n, t_len, feature_dim), dtype=np.float32)
    times = np.zeros((n, t_len), dtype=np.float64)
    seqs = np.zeros((n, t_len), dtype=np.int64)
    flat = [e for events in per_node for e in events]
    if flat:
        rows = np.repeat(np.arange(n), lengths)
        cols = np.concatenate([np.arange(k) for k in lengths])
        other[rows, cols] = [e.other_key for e in flat]
        role[rows, cols] = [e.role for e in flat]
        times[rows, cols] = [e.t for e in flat]
        seqs[rows, cols] = [e.seq for e in flat]
        if feature_dim:
            feats[rows, cols] = np.asarray([e.features for e in flat], dtype=np.float32).reshape(-1, feature_dim)
    ev = EventInputs(
        other_key=torch.from_numpy(other),
        role=torch.from_numpy(role),
        features=torch.from_numpy(feats),
        t=torch.from_numpy(times),
        seq=torch.from_numpy(seqs),
    )
    return ev, torch.from_numpy(lengths)


# Nodes with more new events than this (hubs in a busy batch, cold rebuilds from a
# long history) go through the associative scan, parallel over time; the rest
# through a segmented step, one vectorised step per event rank (each step costs a
# fixed ~0.7 ms of framework overhead on this CPU, so a long loop of tiny steps is
# what the scan avoids). On CUDA the scan pays off sooner.
SCAN_FROM_EVENTS_CPU = 32
SCAN_FROM_EVENTS_CUDA = 4


@torch.no_grad()
def advance(model: DygMambaLinkModel, states: NodeStates, per_node: Sequence[Sequence[NodeEvent]]) -> NodeStates:
    """Apply each node's events (already in (t, seq) order) to its state.

    Segmented step: rank k applies the k-th event of every node that has one, in
    one vectorised step; nodes with many events (hubs, cold rebuilds) go through
    one batch scan together instead. Step and scan are tested equal.
    """
    if len(states) == 0:
        return states
    lengths = [len(e) for e in per_node]
    threshold = SCAN_FROM_EVENTS_CUDA if states.h.is_cuda else SCAN_FROM_EVENTS_CPU
    long_rows = [i for i, n in enumerate(lengths) if n > threshold]
    short_rows = [i for i, n in enumerate(lengths) if 0 < n <= threshold]
    out = states.clone()
    dim = model.config.edge_feature_dim
    # Long rows scan in buckets of similar length (within 2x), so that a 100-event hub
    # does not pad forty 35-event nodes to 100 positions.
    long_rows.sort(key=lambda i: lengths[i])
    while long_rows:
        limit = 2 * lengths[long_rows[0]]
        bucket = [i for i in long_rows if lengths[i] <= limit]
        long_rows = long_rows[len(bucket) :]
        ev, lens = pad_events([per_node[i] for i in bucket], dim)
        final, _ = model.scan(states.select(bucket), ev, lens)
        _assign(out, torch.tensor(bucket), final)
    if short_rows:
        ev, lens = pad_events([per_node[i] for i in short_rows], dim)
        cur = states.select(short_rows)
        for k in range(int(ev.t.shape[1])):
            rows = torch.nonzero(lens > k).squeeze(1)
            step_in = EventInputs(ev.other_key[rows, k], ev.role[rows, k], ev.features[rows, k], ev.t[rows, k], ev.seq[rows, k])
            _assign(cur, rows, model.step(cur.select(rows), step_in))
        _assign(out, torch.tensor(short_rows), cur)
    return out


def _assign(target: NodeStates, rows: torch.Tensor, source: NodeStates) -> None:
    target.h[rows], target.conv[rows] = source.h, source.conv
    target.t_last[rows], target.last_seq[rows], target.n_events[rows] = source.t_last, source.last_seq, source.n_events


@dataclass
class NeighbourLists:
    """Recent neighbours of N nodes: keys (N, L) int64 (PAD_KEY = empty), times float64."""

    keys: torch.Tensor
    times: torch.Tensor

    @classmethod
    def from_lists(cls, keys: Sequence[Sequence[int]], times: Sequence[Sequence[float]], length: int) -> NeighbourLists:
        n = len(keys)
        k = np.full((n, length), PAD_KEY, dtype=np.int64)
        t = np.full((n, length), np.inf, dtype=np.float64)
        for i, (ki, ti) in enumerate(zip(keys, times, strict=True)):
            ki, ti = list(ki)[-length:], list(ti)[-length:]
            if ki:
                k[i, length - len(ki) :] = ki
                t[i, length - len(ti) :] = ti
        return cls(torch.from_numpy(k), torch.from_numpy(t))


@torch.no_grad()
def score(
    model: DygMambaLinkModel,
    su: NodeStates,
    sv: NodeStates,
    key_u: torch.Tensor,
    key_v: torch.Tensor,
    tau: torch.Tensor,
    nu: NeighbourLists,
    nv: NeighbourLists,
) -> torch.Tensor:
    """Logits of N candidate links (u_i, v_i, tau_i)."""
    pair = None
    if model.config.use_pair_features:
        pair = pair_features(
            key_u, key_v, tau, nu.keys, nu.times, nv.keys, nv.times,
            su.n_events, sv.n_events, su.t_last, sv.t_last, model.config.time_norm,
        )  # fmt: skip
    return model.score_states(su, sv, tau.to(torch.float64), pair)
