"""Per-node role counts: a node's events as destination ("in") and as source ("out"),
per snapshot and over its whole history, kept beside its neighbour list
(``ModelConfig.role_counts``).

The neighbour list holds a node's last L events; a Can. Parl. bill sponsor has 40-330
in-events a year, so the list cannot say how many, nor how long ago the node was last
a destination. Causal statistics of exactly that (per-node in- and out-degree per year)
beat our model by 3-4 AP there (docs/results/visibility-experiments.md), and a prototype
that gave the head such counts lifted its test AP by 3 / 3.4 / 12 points (random /
historical / inductive negatives; docs/results/role_counters.py).

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

Three writers keep the same record with one step function (``_step``, a run of
events at one time): the service's apply (``advance_flat``, from the flat events that
``NeighbourLists.extended`` already holds) and the evaluator's replay
(``advance_records``), a node's events of one time as one run, and the trainer's index
(``prefix_records``, every prefix of every node, one event at a time). The counts are
integers, so the three agree exactly (tests/model/test_role_counts.py).
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


def _step(records: np.ndarray, t: np.ndarray, n_in: np.ndarray, n_out: np.ndarray) -> None:
    """Count a run of events at one time ``t`` per row (``n_in`` of them as destination,
    ``n_out`` as source) into each row, in place."""
    new_time = t != records[:, TIMES.start]
    for block in (TIMES, IN_AT, OUT_AT):  # a new time shifts the slots, the oldest drops
        shifted = records[new_time, block.start : block.stop - 1]
        records[new_time, block.start + 1 : block.stop] = shifted
    records[new_time, TIMES.start] = t[new_time]
    records[new_time, IN_AT.start] = 0.0
    records[new_time, OUT_AT.start] = 0.0
    records[:, IN_AT.start] += n_in
    records[:, OUT_AT.start] += n_out
    records[:, IN_TOTAL] += n_in
    records[:, OUT_TOTAL] += n_out
    has_in = n_in > 0
    records[has_in, LATEST_IN] = t[has_in]


def advance_records(records: np.ndarray, per_node: Sequence[Sequence[Any]]) -> np.ndarray:
    """The records after each node's new events (objects with ``t`` and ``role``, in
    (t, seq) order): ``advance_flat`` of them. A copy; rows without events keep theirs."""
    sizes = np.fromiter((len(e) for e in per_node), dtype=np.int64, count=len(per_node))
    flat = [e for events in per_node for e in events]
    t = np.fromiter((e.t for e in flat), dtype=np.float64, count=len(flat))
    is_in = np.fromiter((e.role == ROLE_DST for e in flat), dtype=bool, count=len(flat))
    return advance_flat(records, np.repeat(np.arange(len(per_node)), sizes), t, is_in)


def advance_flat(
    records: np.ndarray, rows: np.ndarray, t: np.ndarray, is_in: np.ndarray
) -> np.ndarray:
    """The records after new events given flat: each event's row (grouped, rows in any
    order), time and whether it is an in-event, in (t, seq) order within a row. A copy.
    A node's events at one time are counted as one run (on a snapshot stream a batch is
    one or two runs per node, however many events a hub has), vectorised over nodes by
    run rank."""
    out = np.array(records, dtype=np.float64, copy=True)
    if len(rows) == 0:
        return out
    weight_in = is_in.astype(np.float64)
    starts = np.r_[True, (rows[1:] != rows[:-1]) | (t[1:] != t[:-1])]
    run = np.cumsum(starts) - 1
    run_row, run_t = rows[starts], t[starts]
    run_in = np.bincount(run, weights=weight_in)
    run_out = np.bincount(run, weights=1.0 - weight_in)
    first_run = np.r_[True, run_row[1:] != run_row[:-1]]
    rank = np.arange(len(run_row)) - np.maximum.accumulate(
        np.where(first_run, np.arange(len(run_row)), 0)
    )
    for k in range(int(rank.max()) + 1):
        at = np.nonzero(rank == k)[0]
        block = out[run_row[at]]
        _step(block, run_t[at], run_in[at], run_out[at])
        out[run_row[at]] = block
    return out


def prefix_records(offsets: np.ndarray, t: np.ndarray, role: np.ndarray) -> np.ndarray:
    """(M, RECORD_WIDTH): row offsets[n] + k - 1 is node n's record after its first k
    entries, for per-node entry lists in CSR form (times ``t`` and roles ``role`` in
    (t, seq) order per node), one event at a time, vectorised over nodes by rank."""
    out = np.empty((len(t), RECORD_WIDTH), dtype=np.float64)
    sizes = np.diff(offsets)
    for k in range(int(sizes.max()) if len(sizes) else 0):
        at = offsets[np.nonzero(sizes > k)[0]] + k
        block = empty_records(len(at)) if k == 0 else out[at - 1].copy()
        is_in = (role[at] == ROLE_DST).astype(np.float64)
        _step(block, t[at], is_in, 1.0 - is_in)
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
