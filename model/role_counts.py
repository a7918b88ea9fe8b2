"""Per-node role counts: a node's events as destination ("in") and as source ("out"),
per snapshot and over its whole history, kept beside its neighbour list
(``ModelConfig.role_counts``).

The neighbour list holds a node's last L events; a Can. Parl. bill sponsor has 40-330
in-events a year, so the list cannot say how many, nor how long ago the node was last
a destination. Causal statistics of exactly that (per-node in- and out-degree per year)
beat our model by 3-4 AP there (docs/results/visibility-experiments.md), and a prototype
that gave the head such counts lifted its test AP by 3 / 3.4 / 12 points (random /
historical / inductive negatives; docs/results/role_counts.py).

The record is a recurrence, one update per event, that reads nothing but the node's
own events (DESIGN's invariants hold: no other node's state is read). It keeps the
node's four latest distinct event times with its in- and out-events at each (on a
snapshot stream: its last four active snapshots), its totals, and the time of its
latest in-event. Columns, float64::

    0..3    the latest distinct event times, newest first (-inf: empty)
    4..7    in-events at each of them          8..11  out-events at each
    12      in-events, total                   13     out-events, total
    14      time of the latest in-event (-inf: none)

A query at tau reads, per endpoint and role, in snapshots of ``role_count_unit`` (the
trainer sets it to the stream's snapshot spacing; a slot's distance is its age in
units, rounded): its events in the query's snapshot so far, in the one before, in the
three before, and before the query's snapshot altogether; then the time since its
latest in-event, in units, and whether there was none. That is 10 head inputs per
endpoint, the eight counts and the time log1p'd. Four slots hold every snapshot
within three of the query's. On a stream without snapshots every event has its own
time and the slots hold the last four events; the trainer keeps the counts to
snapshot streams.

Three writers keep the same record with one step function (``_step``): the service's
apply and the evaluator's replay (``advance_records``) and the trainer's index
(``prefix_records``, every prefix of every node). The counts are integers, so the
three agree exactly (tests/model/test_role_counts.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .roles import ROLE_DST

SLOTS = 4  # distinct times kept: the query's snapshot and the three before
TIMES = slice(0, SLOTS)
IN_AT = slice(SLOTS, 2 * SLOTS)
OUT_AT = slice(2 * SLOTS, 3 * SLOTS)
IN_TOTAL = 3 * SLOTS
OUT_TOTAL = IN_TOTAL + 1
LATEST_IN = OUT_TOTAL + 1
RECORD_WIDTH = LATEST_IN + 1
ROLE_COUNT_FEATURES = 10  # per endpoint: 4 counts per role, time since the latest in, none


def empty_records(n: int) -> np.ndarray:
    """(n, RECORD_WIDTH) records of nodes with no events."""
    records = np.zeros((n, RECORD_WIDTH), dtype=np.float64)
    records[:, TIMES] = -np.inf
    records[:, LATEST_IN] = -np.inf
    return records


def _step(records: np.ndarray, t: np.ndarray, is_in: np.ndarray) -> None:
    """Count one event (time ``t``, a destination where ``is_in``) into each row, in place."""
    new_time = t != records[:, TIMES.start]
    for block in (TIMES, IN_AT, OUT_AT):  # a new time shifts the slots, the oldest drops
        shifted = records[new_time, block.start : block.stop - 1]
        records[new_time, block.start + 1 : block.stop] = shifted
    records[new_time, TIMES.start] = t[new_time]
    records[new_time, IN_AT.start] = 0.0
    records[new_time, OUT_AT.start] = 0.0
    records[is_in, IN_AT.start] += 1.0
    records[~is_in, OUT_AT.start] += 1.0
    records[is_in, IN_TOTAL] += 1.0
    records[~is_in, OUT_TOTAL] += 1.0
    records[is_in, LATEST_IN] = t[is_in]


def advance_records(records: np.ndarray, per_node: Sequence[Sequence[Any]]) -> np.ndarray:
    """The records after each node's new events (objects with ``t`` and ``role``, in
    (t, seq) order), vectorised over nodes by rank. A copy; rows without events keep
    their record."""
    out = np.array(records, dtype=np.float64, copy=True)
    sizes = np.fromiter((len(e) for e in per_node), dtype=np.int64, count=len(per_node))
    for k in range(int(sizes.max()) if len(sizes) else 0):
        rows = np.nonzero(sizes > k)[0]
        events = [per_node[r][k] for r in rows.tolist()]
        t = np.fromiter((e.t for e in events), dtype=np.float64, count=len(rows))
        is_in = np.fromiter((e.role == ROLE_DST for e in events), dtype=bool, count=len(rows))
        block = out[rows]
        _step(block, t, is_in)
        out[rows] = block
    return out


def prefix_records(offsets: np.ndarray, t: np.ndarray, role: np.ndarray) -> np.ndarray:
    """(M, RECORD_WIDTH): row offsets[n] + k - 1 is node n's record after its first k
    entries, for per-node entry lists in CSR form (times ``t`` and roles ``role`` in
    (t, seq) order per node), vectorised over nodes by rank."""
    out = np.empty((len(t), RECORD_WIDTH), dtype=np.float64)
    sizes = np.diff(offsets)
    for k in range(int(sizes.max()) if len(sizes) else 0):
        at = offsets[np.nonzero(sizes > k)[0]] + k
        block = empty_records(len(at)) if k == 0 else out[at - 1].copy()
        _step(block, t[at], role[at] == ROLE_DST)
        out[at] = block
    return out


def role_count_features(records: np.ndarray, tau: np.ndarray, unit: float) -> np.ndarray:
    """(N, ``ROLE_COUNT_FEATURES``) float32 head inputs of N records at query times
    ``tau`` (the module docstring says which). numpy for every caller, the torch
    paths included: the inputs are counts, with no gradient to carry."""
    times = records[:, TIMES]
    held = np.isfinite(times)
    tau_col = tau[:, None]
    # Snapshots between each slot and the query (a slot after tau, from a query behind
    # the node's latest event, counts as the query's snapshot).
    ago = np.where(held, np.round((tau_col - np.where(held, times, tau_col)) / unit), -1.0)
    ago = np.where(held, np.maximum(ago, 0.0), ago)
    now, last, last3 = ago == 0, ago == 1, (ago >= 1) & (ago <= 3)
    columns = []
    for at, total in (
        (records[:, IN_AT], records[:, IN_TOTAL]),
        (records[:, OUT_AT], records[:, OUT_TOTAL]),
    ):
        this = (at * now).sum(1)
        columns += [this, (at * last).sum(1), (at * last3).sum(1), total - this]
    latest_in = records[:, LATEST_IN]
    has_in = np.isfinite(latest_in)
    since_in = np.where(has_in, np.maximum(tau - np.where(has_in, latest_in, tau), 0.0) / unit, 0.0)
    counts = np.log1p(np.stack([*columns, since_in], axis=1))
    return np.concatenate([counts, (~has_in)[:, None]], axis=1).astype(np.float32)
