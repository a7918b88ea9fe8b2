"""The model work of the live evaluation (``service.live_eval``): the states of a
batch's sampled rows just before their times, and the scores of their pairs.

A row is a node at a time: a blob and the node's events of the batch to apply on top
(the ones before that time). The functions are the runtime's own (the rank-major
advance the apply runs, ``model.streaming.score_nodes`` the score routes run), so the
scores are those a ``GET /v1/score`` just before the event would have given.
"""

from __future__ import annotations

import numpy as np
import torch

from model.node_ids import node_keys
from model.node_state import NeighbourLists, NodeStates
from model.pair_features import pair_inputs_of_rows
from model.transition_counts import PAD, DenseTransitions
from state_store.base import LoggedEvent

from .engine import (
    UNKNOWN_NEIGHBOUR,
    ModelRuntime,
    counterparts_before,
    node_events,
    set_latest_at_query,
)

# A node's state just before a time: a blob and the events to apply on top of it.
Snapshot = tuple[bytes | None, list[LoggedEvent]]
# What an apply did to a node: its blob before, the events applied, its blob after.
Applied = tuple[bytes | None, list[LoggedEvent], bytes]


def states_before(
    rt: ModelRuntime,
    names: list[str],
    snapshots: list[Snapshot],
    applied: dict[str, Applied] | None = None,
) -> tuple[NodeStates, NeighbourLists, set[int]]:
    """The states and neighbour lists of rows (node, blob + events to apply on top):
    one decode, then one rank-major advance of every row that has events (the
    runtime's own, as the apply runs it; rows are independent, so a node may be in
    several rows, at several times). Scoring reads h, t_last and n_events of a state
    and the neighbour lists, never the conv tail.

    A model with transition counts also needs, per entry, where the event's other
    endpoint had been just before it: taken from ``applied`` (what the apply held:
    each node's blob before and its events), as the applier takes it from the nodes
    in hand. The third value: rows for which that was not in hand (the other endpoint
    not advanced by this apply, or past the event), whose lists are not exact."""
    states, lists = rt.decode([blob for blob, _ in snapshots])
    rows = [r for r, (_, events) in enumerate(snapshots) if events]
    if not rows:
        return states, lists, set()
    per_row = [node_events(names[r], snapshots[r][1]) for r in rows]
    previous, unknown = _counterparts(rt, names, snapshots, rows, applied or {})
    idx = torch.tensor(rows)
    new = rt.kernels.advance(states.select(idx).to(rt.device), per_row).to("cpu")
    states.h[idx], states.t_last[idx], states.n_events[idx] = new.h, new.t_last, new.n_events
    states.last_seq[idx] = new.last_seq
    lists.assign(idx, lists.select(idx).extended(per_row, *previous))
    return states, lists, unknown


def _counterparts(
    rt: ModelRuntime,
    names: list[str],
    snapshots: list[Snapshot],
    rows: list[int],
    applied: dict[str, Applied],
) -> tuple[tuple[list[list[int]] | None, list[list[int]] | None], set[int]]:
    """(previous, previous2) of ``NeighbourLists.extended`` for the rows with events,
    from the nodes the apply advanced (``counterparts_before`` with no log), and the
    rows with an entry it could not know. Only the rows' nodes and their events' other
    endpoints are decoded: a batch's few samples need those, not every node it touched."""
    cfg = rt.config
    if not cfg.transition_buckets:
        return (None, None), set()
    depth = 2 if cfg.transition_order2 else 1
    wanted = {names[r] for r in rows}
    wanted |= {e.src for r in rows for e in snapshots[r][1]}
    wanted |= {e.dst for r in rows for e in snapshots[r][1]}
    nodes = [n for n in wanted if n in applied]
    blobs = [applied[n][0] for n in nodes]
    keys = rt.decode(blobs)[1].keys if nodes else torch.empty(0, cfg.neighbour_list_len)
    tails = keys[:, -depth:].tolist()
    found = counterparts_before(None, nodes, [applied[n][1] for n in nodes], tails)
    at = {n: i for i, n in enumerate(nodes)}
    out: list[list[list[int]]] = [[] for _ in range(depth)]
    unknown: set[int] = set()
    for r in rows:
        node, events = names[r], snapshots[r][1]
        entries = sum(2 if e.src == e.dst else 1 for e in events)
        i = at.get(node)
        # (a row's events are the first of the node's applied ones: those before a time)
        if i is None or applied[node][1][: len(events)] != events:
            unknown.add(r)
        for d in range(depth):
            got = found[d][i][:entries] if i is not None else [UNKNOWN_NEIGHBOUR] * entries
            if UNKNOWN_NEIGHBOUR in got:
                unknown.add(r)
            out[d].append([PAD if k == UNKNOWN_NEIGHBOUR else k for k in got])
    return (out[0], out[1] if depth == 2 else None), unknown


def with_latest_at_query(
    rt: ModelRuntime, lists: NeighbourLists, newest_rows: list[int | None]
) -> None:
    """``latest_transition_at_query`` of every row, from the row of its newest
    neighbour (``newest_rows``; None: none, 0), set on ``lists`` for the pair features
    (what ``Engine.load_states`` does for the score routes)."""
    assert isinstance(lists.transitions, DenseTransitions)
    rows = np.array([0 if r is None else r for r in newest_rows], dtype=np.int64)
    has = np.array([r is not None for r in newest_rows], dtype=bool)
    set_latest_at_query(rt.config, lists, lists.transitions.counts[rows], has)


def score_rows(
    rt: ModelRuntime,
    names: list[str],
    states: NodeStates,
    lists: NeighbourLists,
    iu: list[int],
    iv: list[int],
    tau: list[float],
) -> np.ndarray:
    """Logits of the pairs (row iu, row iv) at tau: ``DygMambaLinkModel.score_nodes``
    with one query time per row rather than per call (a row is a node at one sample's
    time, and each sample's pairs share that time), so each row is decayed and read out
    once, not once per pair (a third of the cost for a sample's 1 + K pairs). The torch
    model whatever the scoring backend (the ONNX graphs are tested equal to it)."""
    model = rt.advance_model
    dev = rt.device
    row_tau = torch.zeros(len(names), dtype=torch.float64)
    row_tau[torch.tensor(iu)] = torch.tensor(tau, dtype=torch.float64)
    row_tau[torch.tensor(iv)] = torch.tensor(tau, dtype=torch.float64)
    keys = torch.from_numpy(node_keys(names)).to(dev)
    su, sv = torch.tensor(iu, device=dev), torch.tensor(iv, device=dev)
    states, lists = states.to(dev), lists.to(dev)
    with torch.no_grad():
        pair, ids = pair_inputs_of_rows(
            rt.config,
            states,
            lists,
            keys,
            su,
            sv,
            torch.tensor(tau, dtype=torch.float64, device=dev),
        )
        z_u = z_v = None
        if rt.config.use_state:
            z = model.node_readout_chunked(states.h, states.t_last, row_tau.to(dev))
            z_u, z_v = z[su], z[sv]
        return model.head_logit(z_u, z_v, pair, ids).to(torch.float64).cpu().numpy()
