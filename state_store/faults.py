"""Fault injection for crash tests: ``DYGSERVE_FAULT=<point>[,<point>...]``.

Whoever logs and then applies calls ``maybe_crash("after_log")`` between
``append_events`` and the apply. With the variable set to that point the process
exits at once (``os._exit(86)``: no cleanup, no flush, like a kill), leaving events
logged but not applied, which ``applier.redrive`` must then apply exactly once.
"""

from __future__ import annotations

import os

FAULT_ENV = "DYGSERVE_FAULT"
CRASH_EXIT_CODE = 86
AFTER_LOG = "after_log"


def maybe_crash(point: str) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if spec and point in (p.strip() for p in spec.split(",")):
        os._exit(CRASH_EXIT_CODE)
