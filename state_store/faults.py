"""Fault injection for crash tests: ``DYGSERVE_FAULT=<point>[,<point>...]``.

Each point is one crash window of "log first, apply second" (DESIGN invariant 5), and
each has its own test (tests/reliability/test_crash_windows.py). With the variable
set to a point, the process exits there at once (``os._exit(86)``: no cleanup, no
flush, like a kill):

* ``after_log``: between ``append_events`` and the apply: events logged, no state
  written. ``applier.redrive`` must apply them exactly once.
* ``after_partial_write``: after the compare-and-set write of only part of a batch's
  node states (the first half, in the applier's order): some endpoints advanced,
  others not, nothing marked applied. The re-drive must advance only the others.
* ``before_mark``: after every state write, before the events are marked applied:
  the states are current, the events still pending. The re-drive must find nothing
  left to apply for them (no event folded in twice) and only mark them.
* ``at_reload``: after ``POST /v1/admin/reload`` has made the new version the store's
  serving version, before the process that handled it switches or answers. Every
  worker, the restarted one included, must then serve the new version.

The partitioned log's two points (tested in tests/state_store/test_partitioned_log.py,
on a real 3-master cluster; after_log, after_partial_write and before_mark are tested
there too):

* ``between_partition_appends`` (partitioned log): the copies of a batch's events
  are logged in the first partition only, the process exits before the other
  partitions' appends. Those copies are in doubt; the resolver (or a client retry)
  must abort them (fenced: the missing copy can never appear), so that no endpoint
  ever applies them.
* ``before_commit`` (partitioned log): both copies of every event are logged, in
  doubt, and the process exits before clearing the doubt. The resolver (or a retry)
  must commit them, and the re-drive apply each endpoint once.
"""

from __future__ import annotations

import os

FAULT_ENV = "DYGSERVE_FAULT"
CRASH_EXIT_CODE = 86
AFTER_LOG = "after_log"
AFTER_PARTIAL_WRITE = "after_partial_write"
BEFORE_MARK = "before_mark"
AT_RELOAD = "at_reload"
BETWEEN_PARTITION_APPENDS = "between_partition_appends"
BEFORE_COMMIT = "before_commit"


def fault_active(point: str) -> bool:
    spec = os.environ.get(FAULT_ENV, "")
    return bool(spec) and point in (p.strip() for p in spec.split(","))


def maybe_crash(point: str) -> None:
    if fault_active(point):
        os._exit(CRASH_EXIT_CODE)
