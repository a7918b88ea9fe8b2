"""The two operations a streaming consumer of the model runs, shared by the offline
evaluator and the HTTP service so that both compute exactly the same numbers:

* ``advance``: apply each node's new events (in (t, seq) order) to its state, all
  nodes at once, packed rank-major (``model.rank_plan``).
* ``score``: logits for (u, v, tau) pairs from the nodes' states (decayed to tau)
  and their recent-neighbour lists (pair features). Never writes anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from .link_model import ROLE_DST, ROLE_SRC, DygMambaLinkModel, EventInputs
from .node_state import NeighbourLists, NodeStates
from .pair_features import pair_features, pair_identity_keys
from .rank_plan import RankPlan


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


@torch.no_grad()
def advance(
    model: DygMambaLinkModel, states: NodeStates, per_node: Sequence[Sequence[NodeEvent]]
) -> NodeStates:
    """Apply each node's events (already in (t, seq) order) to its state.

    All nodes at once: the events are packed rank-major and applied by
    ``model.apply_ranked`` (one pass over all events for everything but the
    recurrence, then one slice-multiply-add per rank). A model without that kernel
    (the ONNX backend) takes the segmented step: one vectorised ``step`` per rank.
    Ranked, step and scan are tested equal.
    """
    if len(states) == 0:
        return states
    if not hasattr(model, "apply_ranked"):
        return _advance_stepwise(model, states, per_node)
    plan = RankPlan.build([len(e) for e in per_node])
    return model.apply_ranked(
        states, pack_events(per_node, plan, model.config.edge_feature_dim), plan
    )


def _advance_stepwise(
    model: DygMambaLinkModel, states: NodeStates, per_node: Sequence[Sequence[NodeEvent]]
) -> NodeStates:
    """Segmented step: rank k applies the k-th event of every node that has one."""
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
            key_u,
            key_v,
            tau,
            nu.keys,
            nu.times,
            nv.keys,
            nv.times,
            su.n_events,
            sv.n_events,
            su.t_last,
            sv.t_last,
            model.config.time_norm,
        )
    ids = None
    if model.config.identity_match_dim:
        ids = pair_identity_keys(
            key_u,
            key_v,
            tau,
            nu.keys,
            nu.times,
            nv.keys,
            nv.times,
            model.config.identity_match_depth,
        )
    return model.score_states(su, sv, tau.to(torch.float64), pair, ids)


@torch.no_grad()
def score_nodes(
    model: DygMambaLinkModel,
    states: NodeStates,
    lists: NeighbourLists,
    keys: torch.Tensor,
    iu: torch.Tensor,
    iv: torch.Tensor,
    tau: torch.Tensor,
) -> torch.Tensor:
    """``score`` of pairs given as rows ``iu``, ``iv`` of one set of node states.

    The service loads each distinct node once; copying its state out per pair cost
    more than the read-out. When all pairs share one query time (a rank request, a
    batch at "now"), each node is decayed and read out once and the small read-outs
    are gathered per pair. Equal to ``score`` on the gathered states (tested).
    """
    if not isinstance(model, DygMambaLinkModel):  # the ONNX backend scores whole pairs
        return score(
            model,
            states.select(iu),
            states.select(iv),
            keys[iu],
            keys[iv],
            tau,
            lists.select(iu),
            lists.select(iv),
        )
    cfg = model.config
    tau = tau.to(torch.float64)
    pair = None
    if cfg.use_pair_features:
        pair = pair_features(
            keys[iu],
            keys[iv],
            tau,
            lists.keys[iu],
            lists.times[iu],
            lists.keys[iv],
            lists.times[iv],
            states.n_events[iu],
            states.n_events[iv],
            states.t_last[iu],
            states.t_last[iv],
            cfg.time_norm,
        )
    ids = None
    if cfg.identity_match_dim:
        ids = pair_identity_keys(
            keys[iu],
            keys[iv],
            tau,
            lists.keys[iu],
            lists.times[iu],
            lists.keys[iv],
            lists.times[iv],
            cfg.identity_match_depth,
        )
    if not cfg.use_state:
        return model.head_logit(None, None, pair, ids)
    if len(tau) and bool((tau == tau[0]).all()):
        z = model.node_readout_chunked(states.h, states.t_last, tau[:1].expand(len(states)))
        z_u, z_v = z[iu], z[iv]
    else:
        z_u = model.node_readout_chunked(states.h[iu], states.t_last[iu], tau)
        z_v = model.node_readout_chunked(states.h[iv], states.t_last[iv], tau)
    return model.head_logit(z_u, z_v, pair, ids)
