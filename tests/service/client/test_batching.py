"""Cutting ingests and score calls under the limits, ids, and the plan's bookkeeping
(no network: the end-to-end checks against the service are in tests/service/test_client.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.client import BatchLimits, PayloadTooLarge, ValidationFailed, event_id_from_key
from service.client.batching import (
    EVENTS_ENVELOPE,
    IngestPlan,
    body_of,
    cut,
    encode_rows,
    node_query_requests,
    node_query_rows,
    prepare_events,
    random_event_ids,
)
from service.schemas import EventIn, EventsResponse, NodeQueryIn, Rejected


@given(
    sizes=st.lists(st.integers(1, 300), max_size=200),
    max_items=st.integers(1, 40),
    max_bytes=st.integers(320, 5000),
)
def test_cut_gives_consecutive_slices_under_both_limits(sizes, max_items, max_bytes):
    slices = cut(sizes, max_items, max_bytes, EVENTS_ENVELOPE, "events")
    assert [i for r in slices for i in r] == list(range(len(sizes)))  # all, in order, once
    for r in slices:
        body = EVENTS_ENVELOPE + sum(sizes[i] for i in r) + len(r) - 1
        assert 0 < len(r) <= max_items and body <= max_bytes
    for a, b in zip(slices, slices[1:], strict=False):  # each slice is as full as it can be
        grown = EVENTS_ENVELOPE + sum(sizes[i] for i in a) + len(a) + sizes[b.start]
        assert len(a) == max_items or grown > max_bytes


def test_an_item_alone_over_the_byte_limit_is_refused():
    with pytest.raises(PayloadTooLarge, match=r"events\[2\]") as caught:
        cut([10, 10, 990], 100, 1000, EVENTS_ENVELOPE, "events")
    assert caught.value.local and caught.value.status == 413


def test_prepared_events_are_validated_copied_and_given_ids():
    given_rows = [
        {"src": 7, "dst": "b", "t": 1},  # an integer id and time, as JSON allows
        {"src": "a", "dst": "b", "t": 2.0, "event_id": "mine"},
        EventIn(src="c", dst="d", t=3.0, features=[1.0]),
    ]
    rows = prepare_events(given_rows)
    assert rows[0]["src"] == "7" and rows[0]["t"] == 1.0 and "features" not in rows[0]
    assert rows[1]["event_id"] == "mine"
    assert len(rows[0]["event_id"]) == 32 and rows[0]["event_id"] != rows[2]["event_id"]
    assert "event_id" not in given_rows[0]  # the caller's mapping is not changed
    assert "event_id" not in prepare_events(given_rows[:1], assign_ids=False)[0]
    with pytest.raises(ValidationFailed) as caught:
        prepare_events([{"src": "a", "dst": "b", "t": 1.0}, {"src": "", "dst": "b", "t": 1.0}])
    assert caught.value.local and caught.value.issues[0].loc == ["body", "events", 1, "src"]


def test_ids():
    ids = random_event_ids(1000)
    assert len(set(ids)) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert event_id_from_key("orders", 42) == event_id_from_key("orders", "42")
    assert event_id_from_key("orders", 42) != event_id_from_key("orders4", 2)  # parts kept apart


def test_plan_bodies_are_the_rows_and_answers_map_back_to_input_indices():
    events = [{"src": f"n{i % 3}", "dst": "hub", "t": float(i)} for i in range(7)]
    plan = IngestPlan.build(events, BatchLimits(max_batch_events=3), validate=True, assign_ids=True)
    assert [b.rows for b in plan.batches] == [range(0, 3), range(3, 6), range(6, 7)]
    assert [e for b in plan.batches for e in json.loads(b.body)["events"]] == plan.rows
    assert plan.batches[0].nodes == {"n0", "n1", "n2", "hub"} and plan.batches[0].resendable
    # answers arrive out of order (the async client's concurrency)
    plan.record(
        plan.batches[1],
        EventsResponse(
            accepted=2, duplicates=0, applied=True, rejected=[Rejected(index=1, reason="late")]
        ),
    )
    progress = plan.progress()
    assert progress.remaining_index == [0, 1, 2, 6]
    assert [r["t"] for r in progress.remaining] == [0.0, 1.0, 2.0, 6.0]
    plan.record(
        plan.batches[0], EventsResponse(accepted=0, duplicates=3, rejected=[], applied=True)
    )
    plan.record(
        plan.batches[2], EventsResponse(accepted=1, duplicates=0, rejected=[], applied=False)
    )
    result = plan.result()
    assert (result.accepted, result.duplicates, result.requests) == (3, 3, 3)
    assert result.rejected == [Rejected(index=4, reason="late")] and not result.applied
    assert result.event_ids == [r["event_id"] for r in plan.rows]


def test_a_call_that_fits_is_one_request_with_the_same_bytes():
    events = [
        {"src": f"n{i}", "dst": "hub", "t": i * 0.1, "features": [1e-300, -2.5]} for i in range(50)
    ]
    one = IngestPlan.build(events, BatchLimits(), validate=True, assign_ids=True)
    assert len(one.batches) == 1 and one.batches[0].rows == range(50)
    assert one.batches[0].body == body_of(b"events", encode_rows(one.rows))
    assert json.loads(one.batches[0].body)["events"] == one.rows  # floats exact
    tight = BatchLimits(max_body_bytes=len(one.batches[0].body) - 1)  # one byte short
    two = IngestPlan.build(one.rows, tight, validate=True, assign_ids=True)
    assert len(two.batches) == 2 and two.rows == one.rows
    assert IngestPlan.build([], BatchLimits(), validate=True, assign_ids=True).batches == []


def test_node_queries_from_tuples_mappings_and_models_are_cut_under_the_limits():
    rows = node_query_rows(
        [("a", 1.0), {"node": "b", "t": None}, NodeQueryIn(node="c", t=2.0, features=[0.5])]
    )
    assert rows == [
        {"node": "a", "t": 1.0},
        {"node": "b"},  # no t: the service's latest event time
        {"node": "c", "t": 2.0, "features": [0.5]},
    ]
    requests = node_query_requests(rows * 3, BatchLimits(max_classify_nodes=4))
    assert [n for _, n in requests] == [4, 4, 1]
    sent = [q for body, _ in requests for q in json.loads(body)["nodes"]]
    assert sent == rows * 3
    with pytest.raises(ValidationFailed) as refused:
        node_query_rows([("a", float("nan"))])
    assert refused.value.local and refused.value.issues[0].loc[:3] == ["body", "nodes", 0]
