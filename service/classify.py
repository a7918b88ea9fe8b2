"""Node classification from the cached states: "is this node in state y now?".

Blocking (torch, sync store): the routes call it in a worker thread. The states come
from ``Engine.load_states``, so cold nodes (history but no blob) and stale blobs are
rebuilt exactly as for link scores; the numbers come from ``model.node_head``'s
``node_head_inputs`` and the head, the functions the offline evaluator runs.

Refused as a whole, before any score (4xx, nothing written but cold rebuilds, which a
link score of the same nodes would write too): a checkpoint without a head (404), a
node the service has never seen an event for (404: it has no state to classify),
features where the head reads none or of the wrong length (422).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model.node_head import node_head_inputs

from .engine import Engine, ModelRuntime, RequestRefused, timed_store

# A node query: (node, t or None for the latest event time seen, features or None).
NodeQuery = tuple[str, float | None, Sequence[float] | None]
# Unknown nodes named in a refusal (the rest are counted).
NAMED_UNKNOWN = 5


@dataclass
class ClassifiedNode:
    node: str
    t: float
    logit: float
    state_age: float
    clamped: bool

    @property
    def probability(self) -> float:
        z = self.logit
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def no_head_message(rt: ModelRuntime) -> str:
    return (
        f"the serving checkpoint (model {rt.version}) has no node-classification head:"
        " serve or reload one trained with `dygserve train --task node-classification`"
    )


def _features(rt: ModelRuntime, queries: Sequence[NodeQuery]) -> torch.Tensor | None:
    assert rt.node_head is not None
    dim = rt.node_head.config.event_feature_dim
    for i, (_, _, f) in enumerate(queries):
        if dim == 0 and f is not None:
            raise RequestRefused(422, f"nodes[{i}].features: this node head reads no features")
        if dim and (f is None or len(f) != dim):
            have = "none" if f is None else f"length {len(f)}"
            raise RequestRefused(
                422, f"nodes[{i}].features: this node head reads {dim} features, got {have}"
            )
    if not dim:
        return None
    return torch.tensor([list(f or ()) for _, _, f in queries], dtype=torch.float32)


def classify_nodes(
    engine: Engine, queries: Sequence[NodeQuery]
) -> tuple[list[ClassifiedNode], str, str]:
    """Probabilities of the queried nodes at their times; the model and head versions."""
    rt = engine.runtime
    if rt.node_head is None:
        raise RequestRefused(404, no_head_message(rt))
    head = rt.node_head
    if not queries:
        return [], rt.version, head.version
    feats = _features(rt, queries)
    default_t = None
    if any(t is None for _, t, _ in queries):
        with timed_store("clock"):
            default_t = engine.store.last_event_time()
        default_t = 0.0 if default_t is None else default_t
    nodes = list(dict.fromkeys(q[0] for q in queries))
    states, lists, unknown = engine.load_states(rt, nodes, for_pairs=False)
    if unknown.any():
        names = [n for n, u in zip(nodes, unknown.tolist(), strict=True) if u]
        shown = ", ".join(repr(n) for n in names[:NAMED_UNKNOWN])
        more = f" and {len(names) - NAMED_UNKNOWN} more" if len(names) > NAMED_UNKNOWN else ""
        raise RequestRefused(404, f"unknown node(s) {shown}{more}: no event seen for them")
    pos = {n: i for i, n in enumerate(nodes)}
    idx = torch.tensor([pos[q[0]] for q in queries], dtype=torch.long)
    tau = torch.tensor([default_t if t is None else t for _, t, _ in queries], dtype=torch.float64)
    model = rt.advance_model  # the torch model on either backend: it holds the read-out
    with torch.no_grad():
        x = node_head_inputs(
            model,
            head.config,
            states.select(idx).to(rt.device),
            tau.to(rt.device),
            None if feats is None else feats.to(rt.device),
            lists.select(idx).to(rt.device) if head.config.reads_neighbour_lists else None,
        )
        logits = head.head(x.cpu()).tolist()
    t_last = states.t_last[idx].tolist()
    taus = tau.tolist()
    out = [
        ClassifiedNode(
            node=q[0],
            t=taus[k],
            logit=logits[k],
            state_age=max(taus[k] - t_last[k], 0.0),
            clamped=taus[k] < t_last[k],
        )
        for k, q in enumerate(queries)
    ]
    return out, rt.version, head.version
