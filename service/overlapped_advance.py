"""An ingest's advance, computed while its append runs in Redis.

An ingest is an append (Redis runs the Lua script while this process waits on the
socket) and then an apply (read the states, advance them, compare-and-set). The
advance needs the states and the events, not the seqs that the append assigns: a seq
only ends up in its node's blob as the watermark. So for a batch the engine reads the
endpoints' states, sends the append without waiting for its answer
(``StateStore.begin_append``), and advances the states with placeholder seqs while
Redis runs the script (``prepare``); then it reads the answer. (All on the request's
thread: a second thread for the append gained half as much, its Python and the
advance's fighting over the GIL.) The applier's first round
then takes a prepared blob only where what it is about to advance is exactly what was
prepared: the same blob before and the same events, checked by their real seqs
(``PreparedAdvance``); the real seq is then written into the watermark. Anything else
(a duplicate or late event, a cold node whose history must be read, another writer in
between) goes to the plain advance, so the blobs are the plain path's; only the time
differs.

What keeps it exactly once is unchanged: nothing is written before the append has
answered (logged before applied), and the compare-and-set expects the marks read
before the append, so a write by anyone in between fails it and the applier re-reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from state_store.applier import Advance
from state_store.base import EventLog, LoggedEvent, NewEvent
from state_store.blob_header import with_watermark_seq

# Far above any seq a log hands out: only ever in a blob that is patched or dropped.
PLACEHOLDER_SEQ = 1 << 60
# Below this many events the extra read before the append and the matching cost
# about what the overlap saves (Redis runs a small append in well under a ms).
MIN_OVERLAP_EVENTS = 32


class Advancer(Protocol):
    """What advances blobs (``engine.ModelRuntime``)."""

    def advance_blobs(
        self,
        nodes: list[str],
        blobs: list[bytes | None],
        new_events: list[list[LoggedEvent]],
        log: EventLog | None = None,
    ) -> dict[str, bytes]: ...


class NeedsTheLog(Exception):
    """Preparing would have asked the log (a transition-count lookup): not prepared."""


class _NoLog:
    """The log as ``prepare`` sees it: not there. Every event of the batch has both
    endpoints in the prepared call, so a transition-count model asks it nothing; if
    it ever would, the batch takes the plain path."""

    def neighbours_before(self, *_: object) -> list[str | None]:
        raise NeedsTheLog

    def two_neighbours_before(self, *_: object) -> list[tuple[str | None, str | None]]:
        raise NeedsTheLog


@dataclass(frozen=True)
class Prepared:
    """Each endpoint's blob before the batch (as read before the append), its blob
    after all of the batch's events (placeholder seq in the watermark) and the batch
    positions of its events, in order."""

    before: dict[str, bytes | None]
    after: dict[str, bytes]
    rows: dict[str, list[int]]


def batch_rows(events: Sequence[NewEvent]) -> dict[str, list[int]]:
    """Per endpoint, the positions of its events (a self-loop once, as the log keeps it)."""
    rows: dict[str, list[int]] = {}
    for i, ev in enumerate(events):
        rows.setdefault(ev.src, []).append(i)
        if ev.dst != ev.src:
            rows.setdefault(ev.dst, []).append(i)
    return rows


def prepare(
    rt: Advancer,
    before: dict[str, bytes | None],
    events: Sequence[NewEvent],
    rows: dict[str, list[int]],
) -> Prepared | None:
    """Advance every endpoint of ``events`` (``rows``: ``batch_rows(events)``) from
    ``before`` by all of its events."""
    placeholder = [
        LoggedEvent(PLACEHOLDER_SEQ + i, ev.src, ev.dst, ev.t, ev.features, ev.event_id or "")
        for i, ev in enumerate(events)
    ]
    nodes = list(rows)
    try:
        after = rt.advance_blobs(
            nodes,
            [before[n] for n in nodes],
            [[placeholder[i] for i in rows[n]] for n in nodes],
            log=_NoLog(),  # type: ignore[arg-type]
        )
    except NeedsTheLog:
        return None
    return Prepared(before, after, rows)


class PreparedAdvance:
    """The applier's ``advance``: the prepared blobs where they apply, else ``inner``."""

    def __init__(
        self,
        prepared: Prepared,
        seqs: Sequence[int | None],
        inner: Advance,
        reads_counterparts: bool,
    ) -> None:
        self.prepared = prepared
        self.seqs = seqs
        self.inner = inner
        # A transition-count model's blob of a node also depends on where each
        # counterpart had been: take the prepared blobs only for the very same call.
        self.reads_counterparts = reads_counterparts
        self.taken = 0  # nodes given a prepared blob (tests and the bench read it)

    def __call__(
        self, nodes: list[str], blobs: list[bytes | None], new_events: list[list[LoggedEvent]]
    ) -> dict[str, bytes]:
        if not self._applies(nodes, blobs, new_events):
            return self.inner(nodes, blobs, new_events)
        self.taken += len(nodes)
        p, seqs = self.prepared, self.seqs
        return {
            n: with_watermark_seq(p.after[n], seqs[p.rows[n][-1]])  # type: ignore[arg-type]
            for n in nodes
        }

    def _applies(
        self, nodes: list[str], blobs: list[bytes | None], new_events: list[list[LoggedEvent]]
    ) -> bool:
        p = self.prepared
        if self.reads_counterparts and set(nodes) != set(p.after):
            return False
        for node, blob, events in zip(nodes, blobs, new_events, strict=True):
            rows = p.rows.get(node)
            if rows is None or len(rows) != len(events):
                return False
            was = p.before[node]
            if not (blob is was or blob == was):
                return False
            if any(e.seq != self.seqs[i] for e, i in zip(events, rows, strict=True)):
                return False
        return True
