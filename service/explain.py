"""``GET /v1/score?...&explain=k``: each endpoint's k past events that the logit owes
most to (the method and what it holds fixed: ``model.explain``).

Blocking (torch, sync store reads): run it in a worker thread. It reads the two
nodes' states as scoring does (a cold node is rebuilt on the way), then their stored
histories; each state is rebuilt from its history event by event to split it into
the events' terms. The torch model does it whatever the serving backend (the ONNX
graphs have no gradients); the numbers are those of the same weights.
"""

from __future__ import annotations

import torch

from model.explain import contributions, decayed_terms, state_sensitivity
from model.link_model import DygMambaLinkModel
from model.node_ids import node_keys
from model.pair_features import pair_inputs_of_rows
from state_store.base import LoggedEvent

from .engine import Engine, distinct_nodes, node_events, timed_store
from .schemas import EndpointExplanation, ExplainedEvent, Explanation

METHOD = "gradient x input of each event's term in the decayed state"


def explain_pair(engine: Engine, src: str, dst: str, t: float, k: int) -> Explanation:
    rt = engine.runtime
    model = rt.checkpoint.model
    if not rt.config.use_state:  # a pair-features-only model: no event reaches the logit
        return Explanation(
            method="none: this model reads no node state",
            logit=None,
            src=EndpointExplanation(
                node=src, events=[], events_in_state=0, total=0.0, unexplained=0.0
            ),
            dst=EndpointExplanation(
                node=dst, events=[], events_in_state=0, total=0.0, unexplained=0.0
            ),
        )
    dev = next(model.parameters()).device
    nodes = distinct_nodes([(src, dst, t)])
    states, lists, _ = engine.load_states(rt, nodes)
    with timed_store("read_histories"):
        histories = dict(zip(nodes, engine.store.read_histories(nodes), strict=True))
    pos = {n: i for i, n in enumerate(nodes)}
    iu, iv = torch.tensor([pos[src]]), torch.tensor([pos[dst]])
    keys = torch.from_numpy(node_keys(nodes))
    tau = torch.tensor([t], dtype=torch.float64)
    with torch.no_grad():
        pair, ids = pair_inputs_of_rows(rt.config, states, lists, keys, iu, iv, tau)
    sens = state_sensitivity(
        model,
        states.select(iu).to(dev),
        states.select(iv).to(dev),
        tau.to(dev),
        None if pair is None else pair.to(dev),
        None if ids is None else ids.to(dev),
    )
    ends = []
    for node, grad, state in ((src, sens.grad_u, sens.state_u), (dst, sens.grad_v, sens.state_v)):
        last_seq = int(states.last_seq[pos[node]])
        in_state = [e for e in histories[node] if e.seq <= last_seq]
        ends.append(explain_node(model, node, in_state, t, grad.cpu(), state.cpu(), k))
    return Explanation(method=METHOD, logit=sens.logit, src=ends[0], dst=ends[1])


def explain_node(
    model: DygMambaLinkModel,
    node: str,
    events: list[LoggedEvent],
    tau: float,
    grad: torch.Tensor,
    state: torch.Tensor,
    k: int,
) -> EndpointExplanation:
    """The node's k events of largest |contribution|, given d logit / d h(tau) and the
    decayed state h(tau) the score read."""
    per_event = node_events(node, events)  # a self-loop is two entries, source first
    owner = [i for i, e in enumerate(events) for _ in range(2 if e.src == e.dst else 1)]
    terms = decayed_terms(model, per_event, tau)
    share = contributions(terms, grad)
    per_logged = torch.zeros(len(events), dtype=torch.float64)
    per_logged.index_add_(0, torch.tensor(owner, dtype=torch.int64), share.to(torch.float64))
    unexplained = float(((state - terms.sum(0)) * grad).sum())
    top = torch.argsort(per_logged.abs(), descending=True, stable=True)[:k].tolist()
    return EndpointExplanation(
        node=node,
        events=[describe(node, events[i], float(per_logged[i])) for i in top],
        events_in_state=len(events),
        total=float(per_logged.sum()),
        unexplained=unexplained,
    )


def describe(node: str, e: LoggedEvent, contribution: float) -> ExplainedEvent:
    if e.src == e.dst:
        role, other = "self", e.src
    elif e.src == node:
        role, other = "src", e.dst
    else:
        role, other = "dst", e.src
    return ExplainedEvent(
        t=e.t,
        counterpart=other,
        role=role,
        event_id=e.event_id or None,
        seq=e.seq,
        contribution=contribution,
    )
