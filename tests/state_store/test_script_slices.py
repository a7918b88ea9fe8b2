"""Script slices (``RedisStoreConfig.script_slice``): an ingest's append and
compare-and-set sent as several short script calls instead of one long one, so that a
read waits for one slice at most. A sliced batch must answer and store exactly what
one call does, and the applier's fast path must stay right when another writer logs
between two slices."""

from __future__ import annotations

from typing import Any

import pytest

from state_store.append_script import combine_slices
from state_store.applier import apply_logged, logged_events
from state_store.base import AppendResult, NewEvent
from state_store.config import RedisStoreConfig
from state_store.redis_store import RedisStore
from tests.state_store.test_store_semantics import blob
from tests.support.store_model import VERSION, ModelAdvance, build_model, max_state_diff, uci_events

ON_ONE_REDIS = pytest.mark.parametrize("backend", ["redis"])  # the single-slot log's option


@pytest.fixture(scope="module")
def advance() -> ModelAdvance:
    return ModelAdvance(build_model())


def _logged(store: RedisStore, nodes: list[str]) -> list[list[tuple[Any, ...]]]:
    """The nodes' histories, without the ids a store assigned (random per store)."""
    return [
        [(e.seq, e.src, e.dst, e.t, e.features) for e in h] for h in store.read_histories(nodes)
    ]


def _batch() -> list[NewEvent]:
    """Events whose answers depend on earlier events of the batch in an earlier slice
    (slices of 3): an id resent (index 3, a duplicate of index 0), an event made late
    by index 2 (index 4), events with and without ids, a self-loop."""
    return [
        NewEvent("a", "b", 1.0, event_id="e1"),
        NewEvent("b", "c", 2.0),
        NewEvent("d", "a", 3.0, event_id="e3"),
        NewEvent("a", "b", 1.0, event_id="e1"),
        NewEvent("a", "e", 2.5),
        NewEvent("c", "c", 2.0, event_id="e2"),
        NewEvent("e", "f", 4.0, event_id="e4"),
        NewEvent("b", "d", 5.0),
    ]


@ON_ONE_REDIS
def test_a_sliced_append_answers_and_logs_what_one_call_does(make) -> None:
    whole, sliced = make(key_prefix="whole"), make(key_prefix="sliced", script_slice=3)
    assert isinstance(sliced, RedisStore) and sliced.config.script_slice == 3
    nodes = ["a", "b", "c", "d", "e", "f"]
    answers = []
    for _ in range(2):  # the second time, every given id is known and the rest are late
        got, want = sliced.append_events(_batch()), whole.append_events(_batch())
        assert got.seqs == want.seqs
        assert got.duplicates == want.duplicates and got.late == want.late
        assert got.previous_seq == want.previous_seq
        assert _logged(sliced, nodes) == _logged(whole, nodes)
        answers.append(got)
    assert answers[0].duplicates == [3] and [i for i, _ in answers[0].late] == [4]
    assert answers[1].duplicates == [0, 2, 3, 5, 6] and [i for i, _ in answers[1].late] == [1, 4]
    assert answers[1].seqs == [None] * 7 + [7]  # at b's last time: not late


@ON_ONE_REDIS
def test_slices_match_one_call_on_a_real_stream(make) -> None:
    whole, sliced = make(key_prefix="whole"), make(key_prefix="sliced", script_slice=7)
    events = uci_events(400)
    for lo in range(0, len(events), 100):
        batch = events[lo : lo + 100]
        got, want = sliced.append_events(batch), whole.append_events(batch)
        assert (got.seqs, got.previous_seq, got.late) == (want.seqs, want.previous_seq, want.late)
    nodes = list(dict.fromkeys(n for e in events for n in (e.src, e.dst)))
    assert _logged(sliced, nodes) == _logged(whole, nodes)
    assert [e.seq for e in sliced.pending(1000)] == [e.seq for e in whole.pending(1000)]


class _InterleavingStore(RedisStore):
    """A real store that lets another writer log one event between its first and
    second slice (what a concurrent replica may do)."""

    def __init__(self, other: RedisStore, between: NewEvent, **options: Any) -> None:
        super().__init__(**options)
        self.other, self.between, self.slices = other, between, 0

    def _append_slice(self, events: list[NewEvent]) -> AppendResult:
        if self.slices == 1:
            self.other.append_events([self.between])
        self.slices += 1
        return super()._append_slice(events)


@ON_ONE_REDIS
def test_a_node_another_writer_logged_between_slices_takes_the_history_path(
    make, store_url, advance
) -> None:
    other = make()
    store = _InterleavingStore(other, NewEvent("u", "z", 1.5), url=store_url, script_slice=2)
    batch = [
        NewEvent("u", "v", 1.0),
        NewEvent("w", "x", 1.0),
        NewEvent("u", "w", 2.0),  # second slice: z's event (seq 3) came before it
        NewEvent("v", "y", 2.0),
    ]
    try:
        res = store.append_events(batch)
        assert res.seqs == [1, 2, 4, 5]
        # u was logged by both slices with the other writer's event between them: its
        # batch events do not follow its previous seq, so it is not reported; v and w
        # were too, but nothing came between for them; y is new in the second slice
        assert res.previous_seq == {"v": -1, "w": -1, "x": -1, "y": -1}
        apply_logged(
            store, VERSION, logged_events(batch, res), advance, previous_seq=res.previous_seq
        )
        ref = make(key_prefix="ref")
        for part in ([batch[0], batch[1]], [NewEvent("u", "z", 1.5)], batch[2:]):
            ref_res = ref.append_events(part)
            apply_logged(ref, VERSION, logged_events(part, ref_res), advance)
        # u's blob holds z's event too (read from its history), as in the one-writer replay
        got, want = store.read_states(VERSION, ["u"]), ref.read_states(VERSION, ["u"])
        assert got[0] is not None and max_state_diff(advance.codec, got, want) <= 1e-6
    finally:
        store.close()


def test_combine_keeps_each_nodes_first_previous_seq() -> None:
    first = AppendResult(seqs=[7, None], duplicates=[1], event_ids=["i", "j"])
    first.previous_seq = {"a": 3, "b": -1}
    second = AppendResult(seqs=[None, 9], late=[(0, "late: x")], event_ids=["k", "l"])
    second.previous_seq = {"a": 7, "c": 5}
    out = combine_slices(
        [
            ([NewEvent("a", "b", 1.0), NewEvent("a", "b", 1.0)], first),
            ([NewEvent("c", "a", 0.5), NewEvent("a", "c", 2.0)], second),
        ]
    )
    assert out.seqs == [7, None, None, 9] and out.event_ids == ["i", "j", "k", "l"]
    assert out.duplicates == [1] and out.late == [(2, "late: x")]
    assert out.previous_seq == {"a": 3, "b": -1, "c": 5}
    second.previous_seq = {"a": 8, "c": 5}  # someone logged a's seq 8 between the slices
    out = combine_slices(
        [([NewEvent("a", "b", 1.0)] * 2, first), ([NewEvent("a", "c", 2.0)] * 2, second)]
    )
    assert out.previous_seq == {"b": -1, "c": 5}


@ON_ONE_REDIS
def test_a_sliced_compare_and_set_writes_what_one_call_does(make) -> None:
    whole, sliced = make(key_prefix="whole"), make(key_prefix="sliced", script_slice=2)
    blobs = {f"n{i}": blob(float(i), i, fill=i) for i in range(5)}
    newer = {n: blob(float(i) + 10, i + 10, fill=i + 1) for i, n in enumerate(blobs)}
    for store in (whole, sliced):
        assert store.write_states(VERSION, blobs, dict.fromkeys(blobs)).written == list(blobs)
    expected: dict[str, tuple[float, int] | None] = {n: (float(i), i) for i, n in enumerate(blobs)}
    expected["n3"] = (99.0, 99)  # a stale expectation: this one must conflict
    got = sliced.write_states(VERSION, newer, expected)
    want = whole.write_states(VERSION, newer, expected)
    assert (got.written, got.conflicts) == (want.written, want.conflicts)
    assert got.conflicts == ["n3"]
    assert sliced.read_states(VERSION, list(blobs)) == whole.read_states(VERSION, list(blobs))


def test_a_partitioned_log_refuses_script_slices() -> None:
    assert RedisStoreConfig(script_slice=5).script_slice == 5
    with pytest.raises(ValueError, match="single-slot log only"):
        RedisStoreConfig(script_slice=5, partitions=4)
