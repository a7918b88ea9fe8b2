"""Events as the model consumes them: one endpoint's view of an event (``NodeEvent``),
batched inputs (``EventInputs``, padded per node or packed rank-major), and the
plain segmented-step fold over them.

An event (u, v, t, e) is one ``NodeEvent`` for u (role source, other = v) and one
for v (role destination, other = u); a self-loop (u, u) is both, for u, source first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import torch

from .config import ModelConfig
from .node_state import NodeStates
from .rank_plan import RankPlan
from .roles import ROLE_DST as ROLE_DST  # re-exported: events are where roles are used
from .roles import ROLE_SRC as ROLE_SRC


@dataclass
class EventInputs:
    """The per-endpoint inputs of events, for a batch of nodes (shape (N,) or (N, T))."""

    other_key: torch.Tensor  # int64 key of the other endpoint
    role: torch.Tensor  # int64: ROLE_SRC or ROLE_DST
    features: torch.Tensor  # float32 (..., edge_feature_dim)
    t: torch.Tensor  # float64 event times
    seq: torch.Tensor  # int64 log sequence numbers

    def to(self, device: torch.device | str) -> EventInputs:
        if self.t.device == torch.device(device):
            return self
        return EventInputs(
            *(x.to(device) for x in (self.other_key, self.role, self.features, self.t, self.seq))
        )


class NodeEvent(NamedTuple):
    """One event as seen from one endpoint (a tuple: ingest builds two per event)."""

    other_key: int
    role: int  # ROLE_SRC if this node was the source
    features: Sequence[float]
    t: float
    seq: int


def endpoint_events(
    src_key: int, dst_key: int, features: Sequence[float], t: float, seq: int
) -> tuple[NodeEvent, NodeEvent]:
    """The event (src, dst, t) as seen from the source and from the destination."""
    return NodeEvent(dst_key, ROLE_SRC, features, t, seq), NodeEvent(
        src_key, ROLE_DST, features, t, seq
    )


def pad_events(
    per_node: Sequence[Sequence[NodeEvent]], feature_dim: int
) -> tuple[EventInputs, torch.Tensor]:
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
            feats[rows, cols] = np.asarray([e.features for e in flat], dtype=np.float32).reshape(
                -1, feature_dim
            )
    ev = EventInputs(
        other_key=torch.from_numpy(other),
        role=torch.from_numpy(role),
        features=torch.from_numpy(feats),
        t=torch.from_numpy(times),
        seq=torch.from_numpy(seqs),
    )
    return ev, torch.from_numpy(lengths)


def pack_events(
    per_node: Sequence[Sequence[NodeEvent]], plan: RankPlan, feature_dim: int
) -> EventInputs:
    """Per-node event lists -> (E,) inputs packed rank-major by ``plan``."""
    e = plan.num_events
    flat = [ev for i in plan.order.tolist() for ev in per_node[i]]
    pos = plan.packed_pos
    other = np.empty(e, dtype=np.int64)
    role = np.empty(e, dtype=np.int64)
    times = np.empty(e, dtype=np.float64)
    seqs = np.empty(e, dtype=np.int64)
    feats = np.zeros((e, feature_dim), dtype=np.float32)
    other[pos] = [x.other_key for x in flat]
    role[pos] = [x.role for x in flat]
    times[pos] = [x.t for x in flat]
    seqs[pos] = [x.seq for x in flat]
    if feature_dim and e:
        feats[pos] = np.asarray([x.features for x in flat], dtype=np.float32).reshape(
            e, feature_dim
        )
    return EventInputs(
        other_key=torch.from_numpy(other),
        role=torch.from_numpy(role),
        features=torch.from_numpy(feats),
        t=torch.from_numpy(times),
        seq=torch.from_numpy(seqs),
    )


class Steppable(Protocol):
    """A model that applies one event to each of a batch of nodes."""

    config: ModelConfig

    def step(self, states: NodeStates, ev: EventInputs) -> NodeStates: ...


def advance_stepwise(
    model: Steppable, states: NodeStates, per_node: Sequence[Sequence[NodeEvent]]
) -> NodeStates:
    """The segmented step: rank k applies the k-th event of every node that has one,
    one vectorised ``step`` per rank. The plain fold that the rank-major kernel is
    tested against, and the ONNX backend's advance (its graph is the step)."""
    lengths = [len(e) for e in per_node]
    rows = [i for i, n in enumerate(lengths) if n > 0]
    out = states.clone()
    if not rows:
        return out
    ev, lens = pad_events([per_node[i] for i in rows], model.config.edge_feature_dim)
    cur = states.select(rows)
    for k in range(int(ev.t.shape[1])):
        active = torch.nonzero(lens > k).squeeze(1)
        step_in = EventInputs(
            ev.other_key[active, k],
            ev.role[active, k],
            ev.features[active, k],
            ev.t[active, k],
            ev.seq[active, k],
        )
        _assign(cur, active, model.step(cur.select(active), step_in))
    _assign(out, torch.tensor(rows), cur)
    return out


def _assign(target: NodeStates, rows: torch.Tensor, source: NodeStates) -> None:
    target.h[rows], target.conv[rows] = source.h, source.conv
    target.t_last[rows], target.last_seq[rows], target.n_events[rows] = (
        source.t_last,
        source.last_seq,
        source.n_events,
    )
