"""A CPU budget for background work that must not take CPU from the request path."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class CpuBudget:
    """At most ``share`` of one core on average for some background work (the live
    evaluation): every second of wall time adds ``share`` seconds of CPU to an allowance
    (capped at ``BURST_S`` seconds' worth, so bursts stay short), each piece of work
    spends its thread's CPU time, and none starts while the allowance is spent. The
    caller skips work it is not allowed (and counts it) instead of taking CPU from the
    request path; ``share`` >= 1 never refuses."""

    BURST_S = 2.0

    def __init__(
        self,
        share: float,
        wall: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.share = share
        self.allowance = share * self.BURST_S
        self.spent = 0.0  # CPU seconds of work so far
        self._wall, self._cpu = wall, cpu
        self._at = wall()

    def allows(self) -> bool:
        if self.share >= 1.0:
            return True
        now = self._wall()
        self.allowance = min(
            self.share * self.BURST_S, self.allowance + (now - self._at) * self.share
        )
        self._at = now
        return self.allowance > 0

    @contextmanager
    def spending(self) -> Iterator[None]:
        start = self._cpu()
        try:
            yield
        finally:
            cpu = self._cpu() - start
            self.allowance -= cpu
            self.spent += cpu
