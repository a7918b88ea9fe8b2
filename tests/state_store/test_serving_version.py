"""The store's serving-version key and per-version apply marks, on every backend
(in-process, one Redis, a 3-master cluster): what the model follower and the stale-state
check read (state_store.versions)."""

from __future__ import annotations

from state_store.base import NewEvent
from state_store.versions import NO_MARK, ServingModel, VersionMarks


def log(store, n: int, prefix: str = "e") -> list[int]:
    res = store.append_events(
        [NewEvent(f"u{i % 3}", f"v{i}", float(i), (), f"{prefix}{i}") for i in range(n)]
    )
    return [s for s in res.seqs if s is not None]


def test_the_serving_key_is_claimed_once_and_replaced_by_a_reload(make) -> None:
    store = make()
    assert store.read_serving().serving is None
    a = ServingModel("a" * 16, "a")
    b = ServingModel("b" * 16, "models/b")
    assert store.publish_serving(a, only_if_absent=True) == a
    assert store.publish_serving(b, only_if_absent=True) == a  # a worker starting later
    assert store.read_serving().serving == a
    assert store.publish_serving(b) == b  # a reload
    assert store.read_serving().serving == b


def test_marks_record_the_highest_seq_each_version_applied(make) -> None:
    store = make()
    seqs = log(store, 10)
    store.mark_applied(seqs[:4], "A")
    store.mark_applied(seqs[4:7], "B")
    store.mark_applied(seqs[2:3], "A")  # a lower mark never lowers it
    store.mark_applied(seqs[7:])  # no version: pending only (the old interface)
    marks = store.read_serving().marks
    assert marks.applied_max == {"A": seqs[3], "B": seqs[6]}
    assert marks.missed_upto("A") == seqs[6]  # B's events may be missing from A's blobs
    assert marks.missed_upto("B") == seqs[3]
    assert marks.missed_upto("C") == seqs[6]
    assert store.pending(100) == []


def test_one_version_alone_leaves_nothing_to_check() -> None:
    marks = VersionMarks().with_mark("A", 100).with_mark("A", 50)
    assert marks.applied_max == {"A": 100} and marks.missed_upto("A") == NO_MARK
    assert marks.merged(VersionMarks({"A": 20, "B": 7})).applied_max == {"A": 100, "B": 7}


def test_pending_pages_by_seq(make) -> None:
    store = make()
    seqs = log(store, 25)
    first = store.pending(10)
    assert [e.seq for e in first] == seqs[:10]
    second = store.pending(10, after_seq=first[-1].seq)
    assert [e.seq for e in second] == seqs[10:20]
    assert [e.seq for e in store.pending(10, after_seq=seqs[-1])] == []
