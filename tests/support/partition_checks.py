"""Checks of a partitioned log after concurrent writers and crashes: every event is
in both endpoints' histories or in neither, nothing is in doubt or pending, and every
stored state equals a single-process replay of its node's history."""

from __future__ import annotations

import torch

from state_store.base import LoggedEvent, StateStore
from tests.support.store_model import VERSION, ModelAdvance

TOL = 1e-5


def histories_of(store: StateStore, nodes: list[str]) -> dict[str, list[LoggedEvent]]:
    return dict(zip(nodes, store.read_histories(nodes), strict=True))


def assert_both_endpoints_or_neither(hist: dict[str, list[LoggedEvent]]) -> set[str]:
    """Each event id found in any history is in the history of each of its endpoints,
    exactly once. Returns the ids found."""
    where: dict[str, list[str]] = {}
    ends: dict[str, set[str]] = {}
    for node, events in hist.items():
        for e in events:
            where.setdefault(e.event_id, []).append(node)
            ends[e.event_id] = {e.src, e.dst}
    for eid, nodes in where.items():
        assert sorted(nodes) == sorted(ends[eid]), f"{eid} in {nodes}, endpoints {ends[eid]}"
    return set(where)


def diff_ignoring_seq(advance: ModelAdvance, a: list[bytes | None], b: list[bytes | None]) -> float:
    """Max abs difference of two lists of blobs; inf if presence, event count or last
    time differ. Seqs are left out: a partitioned log numbers events differently."""
    if [x is None for x in a] != [x is None for x in b]:
        return float("inf")
    pa = [x for x in a if x is not None]
    pb = [x for x in b if x is not None]
    if not pa:
        return 0.0
    sa, sb = advance.codec.decode_many(pa), advance.codec.decode_many(pb)
    if not (torch.equal(sa.t_last, sb.t_last) and torch.equal(sa.n_events, sb.n_events)):
        return float("inf")
    return max(float((sa.h - sb.h).abs().max()), float((sa.conv - sb.conv).abs().max()))


def assert_states_equal_replay(store: StateStore, advance: ModelAdvance, nodes: list[str]) -> float:
    """Every node's stored state equals its history folded from the initial state in one
    process, and its event count is its history's length: nothing lost or doubled."""
    hist = store.read_histories(nodes)
    kept = [i for i, h in enumerate(hist) if h]  # a node whose only events were aborted has none
    assert all(b is None for i, b in enumerate(store.read_states(VERSION, nodes)) if not hist[i])
    nodes, hist = [nodes[i] for i in kept], [hist[i] for i in kept]
    want = advance(nodes, [None] * len(nodes), hist)
    got = store.read_states(VERSION, nodes)
    diff = diff_ignoring_seq(advance, got, [want[n] for n in nodes])
    assert diff <= TOL, f"max abs state difference {diff}"
    counts = advance.codec.decode_many([g for g in got if g is not None]).n_events.tolist()
    assert counts == [len(h) for h in hist]
    return diff


def assert_settled(store: StateStore) -> None:
    """Nothing pending, nothing in doubt."""
    assert store.pending(10) == []
    client = store.client  # type: ignore[attr-defined]
    for k in store._parts:  # type: ignore[attr-defined]
        assert client.execute_command("HLEN", k.doubt) == 0
