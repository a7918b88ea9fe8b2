"""The applier's fast path: an append reports each endpoint's seq before the batch
(``AppendResult.previous_seq``), and ``apply_logged`` skips the history read of nodes
whose stored watermark is already there. It must give exactly the states of the
history-reading path, and fall back whenever a node is behind or cold."""

from __future__ import annotations

import pytest

from state_store.applier import apply_logged, apply_nodes, logged_events
from state_store.base import NewEvent
from tests.support.store_model import VERSION, ModelAdvance, build_model, max_state_diff, uci_events


@pytest.fixture(scope="module")
def advance() -> ModelAdvance:
    return ModelAdvance(build_model())


def test_previous_seq_is_each_nodes_last_seq_before_the_batch(make) -> None:
    store = make()
    first = store.append_events([NewEvent("u", "v", 1.0), NewEvent("v", "w", 2.0)])
    assert first.previous_seq == {"u": -1, "v": -1, "w": -1}
    second = store.append_events(
        [
            NewEvent("u", "x", 3.0),
            NewEvent("v", "v", 3.0),
            NewEvent("u", "v", 2.5),
            NewEvent("x", "u", 4.0),
        ]
    )
    # u's last event before this batch was seq 1, v's seq 2; x is new; the late (u, v, 2.5)
    # is refused and changes nothing; nodes of refused events only are not reported.
    assert second.seqs == [3, 4, None, 5]
    assert second.previous_seq == {"u": 1, "x": -1, "v": 2}
    dup = store.append_events(
        [NewEvent("a", "b", 5.0, event_id="e1"), NewEvent("a", "b", 5.0, event_id="e1")]
    )
    assert dup.previous_seq == {"a": -1, "b": -1} and len(dup.duplicates) == 1


def test_fast_path_equals_the_history_path_with_fewer_round_trips(make, advance) -> None:
    fast_store, slow_store = make(key_prefix="fast"), make(key_prefix="slow")
    events = uci_events(1500)
    fast_trips = slow_trips = 0
    for lo in range(0, len(events), 300):
        batch = events[lo : lo + 300]
        res_f, res_s = fast_store.append_events(batch), slow_store.append_events(batch)
        fast_trips += apply_logged(
            fast_store,
            VERSION,
            logged_events(batch, res_f),
            advance,
            previous_seq=res_f.previous_seq,
        ).round_trips
        slow_trips += apply_logged(
            slow_store, VERSION, logged_events(batch, res_s), advance
        ).round_trips
    nodes = list(dict.fromkeys(n for e in events for n in (e.src, e.dst)))
    fast_blobs = fast_store.read_states(VERSION, nodes)
    slow_blobs = slow_store.read_states(VERSION, nodes)
    assert all(b is not None for b in fast_blobs)
    assert max_state_diff(advance.codec, fast_blobs, slow_blobs) == 0.0  # same events, same batches
    assert fast_trips == slow_trips - 5  # one history read saved per batch


def test_fast_path_falls_back_for_a_node_that_is_behind(make, advance) -> None:
    store, ref = make(key_prefix="s"), make(key_prefix="r")
    a = [NewEvent("u", "v", 1.0), NewEvent("u", "w", 2.0)]
    b = [NewEvent("u", "x", 3.0), NewEvent("y", "z", 3.0)]
    res_a = store.append_events(a)  # logged, never applied (as after a crash)
    res_b = store.append_events(b)
    stats = apply_logged(
        store, VERSION, logged_events(b, res_b), advance, previous_seq=res_b.previous_seq
    )
    # u is behind (its blob lacks batch a) and x, y, z are new: u must read its history
    assert stats.events_applied == 3 + 1 + 2  # u: 1, 2, 3; x: 3; y and z: 3
    for batch in (a, b):
        res = ref.append_events(batch)
        apply_logged(ref, VERSION, logged_events(batch, res), advance)
    nodes = ["u", "v", "w", "x", "y", "z"]
    got, want = (
        store.read_states(VERSION, ["u", "x", "y", "z"]),
        ref.read_states(VERSION, ["u", "x", "y", "z"]),
    )
    # u's three events ran as one pass here and as two passes in ref: batches of other
    # shapes may round differently in the last float32 bits (CPU-dependent kernels).
    assert max_state_diff(advance.codec, got, want) <= 1e-6
    # v and w (batch a only) were not touched by batch b's apply; a re-drive of a heals them
    assert store.read_states(VERSION, ["v", "w"]) == [None, None]
    apply_nodes(store, VERSION, nodes, advance)
    assert (
        max_state_diff(
            advance.codec, store.read_states(VERSION, nodes), ref.read_states(VERSION, nodes)
        )
        <= 1e-6
    )
    assert res_a.previous_seq == {"u": -1, "v": -1, "w": -1}
