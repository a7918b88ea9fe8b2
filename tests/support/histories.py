"""Per-node event histories of a real stream, as the model consumes them."""

from __future__ import annotations

from model.events import NodeEvent, endpoint_events
from model.node_ids import node_key
from training.data import EdgeStream


def stream_histories(stream: EdgeStream) -> tuple[list[str], list[list[NodeEvent]]]:
    """Every node of ``stream`` (in order of first appearance) and its events in stream
    order (seq = row), each seen from that node; a self-loop is two events of its node,
    the source's then the destination's (as the service and the evaluator see it)."""
    per: dict[str, list[NodeEvent]] = {}
    for i in range(len(stream)):
        src, dst = str(stream.src[i]), str(stream.dst[i])
        as_src, as_dst = endpoint_events(
            node_key(src), node_key(dst), stream.features[i].tolist(), float(stream.t[i]), i
        )
        per.setdefault(src, []).append(as_src)
        per.setdefault(dst, []).append(as_dst)
    return list(per), list(per.values())
