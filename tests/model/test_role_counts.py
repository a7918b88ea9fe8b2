"""model.role_counts: the record's one step, its writers against each other, and the
head inputs it gives (the torch and numpy scorers read them alike:
tests/model/test_numpy_scorer.py, "role_counts")."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from model.role_counts import (
    IN_TOTAL,
    LATEST_IN,
    OUT_TOTAL,
    ROLE_COUNT_FEATURES,
    TIMES,
    advance_records,
    empty_records,
    prefix_records,
    role_count_features,
)
from model.roles import ROLE_DST, ROLE_SRC


def _events(n_nodes: int, rng: np.random.Generator) -> list[list[SimpleNamespace]]:
    """Per node, 0-60 events at integer times 0-9 (many sharing a time), random roles."""
    out = []
    for _ in range(n_nodes):
        t = np.sort(rng.integers(0, 10, rng.integers(0, 60)))
        out.append([SimpleNamespace(t=float(x), role=int(rng.integers(0, 2))) for x in t])
    return out


def test_batches_of_advances_equal_the_prefix_records():
    """The service applies a node's events a batch at a time; the trainer reads the
    record after every prefix. Both must hold the same numbers, exactly."""
    rng = np.random.default_rng(0)
    per_node = _events(7, rng)
    sizes = np.array([len(e) for e in per_node])
    offsets = np.r_[0, np.cumsum(sizes)]
    flat = [e for events in per_node for e in events]
    prefix = prefix_records(
        offsets, np.array([e.t for e in flat]), np.array([e.role for e in flat])
    )
    records = empty_records(7)
    done = np.zeros(7, dtype=np.int64)
    while (done < sizes).any():
        take = np.minimum(sizes - done, rng.integers(0, 9, 7))
        batch = [per_node[i][done[i] : done[i] + take[i]] for i in range(7)]
        records = advance_records(records, batch)
        done += take
        for i in np.nonzero(done)[0]:
            np.testing.assert_array_equal(records[i], prefix[offsets[i] + done[i] - 1])
    assert (records[sizes == 0] == empty_records(int((sizes == 0).sum()))).all()


def test_the_record_of_a_small_history():
    ev = [(0.0, ROLE_DST), (1.0, ROLE_SRC), (1.0, ROLE_DST), (1.0, ROLE_DST), (2.0, ROLE_SRC)]
    ev += [(3.0, ROLE_SRC), (4.0, ROLE_DST)]
    rec = advance_records(empty_records(1), [[SimpleNamespace(t=t, role=r) for t, r in ev]])[0]
    assert rec[TIMES].tolist() == [4.0, 3.0, 2.0, 1.0]  # the oldest time (0) has dropped
    assert rec[4:8].tolist() == [1, 0, 0, 2]  # in-events at those times
    assert rec[8:12].tolist() == [0, 1, 1, 1]  # out-events
    assert (rec[IN_TOTAL], rec[OUT_TOTAL], rec[LATEST_IN]) == (4, 3, 4.0)


def _features(rec: np.ndarray, tau: float) -> list[float]:
    cols = role_count_features(rec[None], np.array([tau]), 1.0)
    assert cols.shape == (1, ROLE_COUNT_FEATURES) and cols.dtype == np.float32
    return [float(c) for c in cols[0]]


def test_head_inputs_count_snapshots_back_from_the_query():
    ev = [(1.0, ROLE_DST), (2.0, ROLE_DST), (2.0, ROLE_DST), (3.0, ROLE_SRC), (5.0, ROLE_DST)]
    rec = advance_records(empty_records(1), [[SimpleNamespace(t=t, role=r) for t, r in ev]])[0]
    got = np.expm1(_features(rec, 5.0)[:9])
    # in: this snapshot 1 (t=5), the one before 0 (t=4), the three before 2 (t=2..4),
    # before this one 3; out: 0, 0, 1, 1; since the latest in-event 0 snapshots
    np.testing.assert_allclose(got, [1, 0, 2, 3, 0, 0, 1, 1, 0], atol=1e-6)
    later = np.expm1(_features(rec, 7.0)[:9])
    np.testing.assert_allclose(later, [0, 0, 1, 4, 0, 0, 0, 1, 2], atol=1e-6)
    none = _features(empty_records(1)[0], 3.0)
    assert none[:9] == [0.0] * 9 and none[9] == 1.0  # no events, never a destination
    # a query behind the node's latest event (a clamped one) counts it as this snapshot
    assert abs(np.expm1(_features(rec, 4.6)[0]) - 1.0) < 1e-6
