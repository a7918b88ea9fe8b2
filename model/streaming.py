"""The operations a streaming consumer of the model runs, shared by the offline
evaluator and the HTTP service so that both compute exactly the same numbers:

* ``advance``: apply each node's new events (in (t, seq) order) to its state, all
  nodes at once (each backend its own way: the torch model packs them rank-major,
  ``model.rank_plan``; the ONNX graph steps rank by rank).
* ``score``: logits for (u, v, tau) pairs from the nodes' states (decayed to tau)
  and their recent-neighbour lists (pair features). Never writes anything.
* ``score_nodes``: ``score`` of pairs given as rows of one set of node states (the
  service reads each distinct node once).

The model is any ``ServedModel`` (``model.protocol``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .events import NodeEvent
from .node_state import NeighbourLists, NodeStates
from .pair_features import pair_inputs
from .protocol import ServedModel


@torch.no_grad()
def advance(
    model: ServedModel, states: NodeStates, per_node: Sequence[Sequence[NodeEvent]]
) -> NodeStates:
    """Apply each node's events (already in (t, seq) order) to its state. Every
    backend's advance is tested equal to the plain fold of ``step``."""
    if len(states) == 0:
        return states
    return model.advance(states, per_node)


@torch.no_grad()
def score(
    model: ServedModel,
    su: NodeStates,
    sv: NodeStates,
    key_u: torch.Tensor,
    key_v: torch.Tensor,
    tau: torch.Tensor,
    nu: NeighbourLists,
    nv: NeighbourLists,
) -> torch.Tensor:
    """Logits of N candidate links (u_i, v_i, tau_i)."""
    pair, ids = pair_inputs(
        model.config, key_u, key_v, tau, nu, nv, su.n_events, sv.n_events, su.t_last, sv.t_last
    )
    return model.score_states(su, sv, tau.to(torch.float64), pair, ids)


@torch.no_grad()
def score_nodes(
    model: ServedModel,
    states: NodeStates,
    lists: NeighbourLists,
    keys: torch.Tensor,
    iu: torch.Tensor,
    iv: torch.Tensor,
    tau: torch.Tensor,
) -> torch.Tensor:
    """``score`` of pairs given as rows ``iu``, ``iv`` of one set of node states
    (equal to ``score`` on the gathered states, tested)."""
    return model.score_nodes(states, lists, keys, iu, iv, tau)


def score_gathered(
    model: ServedModel,
    states: NodeStates,
    lists: NeighbourLists,
    keys: torch.Tensor,
    iu: torch.Tensor,
    iv: torch.Tensor,
    tau: torch.Tensor,
) -> torch.Tensor:
    """``score_nodes`` the plain way: gather each pair's two states, then ``score``."""
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
