"""The generic exactly-once applier (model-agnostic).

Log first, apply second (DESIGN "Batches, order, exactly once"). To apply, for a set
of nodes:

1. read their blobs (one round trip); a blob's header holds its watermark
   (t_last, last_seq) of the last applied event; no blob = a *cold* node;
2. read each node's history after its watermark seq (one round trip); a cold node
   reads its whole stored history (after seq -1) and is rebuilt from the initial
   state, never restarted from zero with only the new events;
3. skip nodes with nothing new; ``advance`` turns (blob or None, new events in seq
   order) into new blobs;
4. write them compare-and-set on the watermark read in 1 (one round trip). A node
   whose stored watermark moved meanwhile (another writer applied it, or rebuilt it)
   is a conflict: only those are re-read and re-applied, at most ``max_rounds``
   rounds in all. A node whose re-read watermark has reached the newest event this
   call brings it is done (the winner applied ours too).

Why this is exactly once: the store appends an event to both endpoints' histories in
the same atomic step that assigns its seq and refuses late events, so a node's
history is in (t, seq) order and "every event after the watermark seq" is exactly
the set not yet folded into the stored blob. The CAS guarantees that a blob is only
ever replaced by one computed from it, so no event is folded in twice and none is
lost, whatever the interleaving of writers.

``apply_logged`` then marks the events applied (drops them from the pending set)
under the model version that applied them (``state_store.versions.VersionMarks``);
``redrive`` applies everything still pending (after a crash between logging and
applying, or a failed apply). Marking is done only after both endpoints are written,
and re-applying is a no-op, so a crash anywhere is healed by the next re-drive. The
crash windows have fault points (``state_store.faults``), each with its own test.

A stale blob (its version was not serving while the node got events) needs no special
case here: step 2 reads everything after its watermark and folds it in, starting from
the blob. Only when that gap is as long as the history cap may the cap have trimmed
part of it; the node is then rebuilt from its kept history, as a cold node is
(``catch_up_start``), never advanced across a hole.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Protocol

from .base import AppendResult, HeldByDoubt, LoggedEvent, NewEvent, StateStore, StoreUnavailable
from .blob_header import read_watermark
from .faults import AFTER_PARTIAL_WRITE, BEFORE_MARK, fault_active, maybe_crash

# Upper bound of the random pause before re-reading conflicting nodes, per round so
# far: writers that keep colliding on a hub spread out instead of retrying in step.
CONFLICT_BACKOFF_S = 0.002


class Advance(Protocol):
    def __call__(
        self, nodes: list[str], blobs: list[bytes | None], new_events: list[list[LoggedEvent]]
    ) -> dict[str, bytes]:
        """New blob of each node after applying its new events (seq order) to its blob
        (None: to the initial state). Must return a blob for every node given."""
        ...


class ApplyConflictError(StoreUnavailable):
    """Some nodes still lost the compare-and-set after ``max_rounds`` rounds (a 503:
    the events stay pending, and a retry or the re-drive applies them)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="conflict")


@dataclass
class ApplyStats:
    nodes_applied: int = 0  # node blobs written
    events_applied: int = 0  # (event, endpoint) applications written
    # nodes written that had no blob but earlier history (rebuilt from it; a node whose
    # first events are the ones being applied is new, not rebuilt)
    cold_rebuilds: int = 0
    conflicts: int = 0  # lost compare-and-sets (each re-read and re-applied)
    # partitioned log: nodes held back a round because a copy after their watermark
    # was in doubt (re-read after a pause, as conflicts are)
    in_doubt_waits: int = 0
    # nodes left alone because another writer's blob already held every event this call
    # brought for them (it read the history after our append): nothing to do there
    covered_elsewhere: int = 0
    round_trips: int = 0  # store calls made (each one round trip, one per slot group on a cluster)
    rounds: int = 0  # read-advance-write rounds
    marked: int = 0  # events marked applied

    def add(self, other: ApplyStats) -> ApplyStats:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self


def logged_events(events: list[NewEvent], result: AppendResult) -> list[LoggedEvent]:
    """The events ``append_events`` logged (duplicates and refused ones left out), as
    ``LoggedEvent``s with their seqs, ready for ``apply_logged``."""
    out = []
    for i, (ev, seq) in enumerate(zip(events, result.seqs, strict=True)):
        if seq is not None:
            eid = result.event_ids[i] if result.event_ids else (ev.event_id or "")
            feats = tuple(float(x) for x in ev.features)
            out.append(LoggedEvent(seq, ev.src, ev.dst, float(ev.t), feats, eid))
            other = result.other_seqs.get(i)
            if other is not None:  # its copy in the destination's partition
                out.append(LoggedEvent(other, ev.src, ev.dst, float(ev.t), feats, eid))
    return out


def _unique(nodes: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(nodes))


@dataclass
class LoggedBatch:
    """The events one append logged, with what the append told about their nodes.

    ``events`` may also hold events of the request that an earlier attempt logged and
    that are still pending (a retry applies them: read-your-writes); the fast path is
    safe with them, since their seqs lie at or below ``previous_seq`` of their nodes.
    """

    events: list[LoggedEvent]
    previous_seq: dict[str, int] = field(default_factory=dict)  # AppendResult.previous_seq
    # duplicates of the request whose pending state was not looked up (a pending set
    # longer than the caller's scan): the request cannot say they are applied
    unconfirmed: int = 0
    # the append's seq for each event of the request, in its order (None: not logged)
    seqs: list[int | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.events)


@dataclass(frozen=True)
class JustLogged:
    """What one append told about a node: the seq of its last event before the batch,
    and the batch's events of the node in seq order."""

    previous_seq: int
    events: list[LoggedEvent]


def just_logged(
    events: list[LoggedEvent], previous_seq: dict[str, int], store: StateStore | None = None
) -> dict[str, JustLogged]:
    """Per node, the batch's events of it; on a partitioned log (``store`` given, P > 1)
    only its own copies (those in its partition), never the other endpoint's copy."""
    per_node: dict[str, list[LoggedEvent]] = {}
    P = getattr(store, "partitions", 1)
    if P > 1:
        assert store is not None
        part = {}
        for e in events:
            for n in (e.src, e.dst):
                if n not in part:
                    part[n] = store.partition_of(n)
            if part[e.src] == e.seq % P:
                per_node.setdefault(e.src, []).append(e)
            if e.dst != e.src and part[e.dst] == e.seq % P:
                per_node.setdefault(e.dst, []).append(e)
        for evs in per_node.values():  # a caller may list the copies in any order
            evs.sort(key=lambda e: e.seq)
        return {
            n: JustLogged(previous_seq[n], evs) for n, evs in per_node.items() if n in previous_seq
        }
    for e in events:
        per_node.setdefault(e.src, []).append(e)
        if e.dst != e.src:
            per_node.setdefault(e.dst, []).append(e)
    return {n: JustLogged(previous_seq[n], evs) for n, evs in per_node.items() if n in previous_seq}


def catch_up_start(blob: bytes | None, events_after: list[LoggedEvent], cap: int) -> bytes | None:
    """The blob to fold a history read after its watermark into: the blob itself, or
    None (rebuild from the kept history, as a cold node) when the read returned a
    full history's worth of events, so the cap may have dropped some in the gap."""
    return None if blob is not None and len(events_after) >= cap else blob


def _new_events(
    store: StateStore,
    todo: list[str],
    after: list[int],
    known: dict[str, JustLogged] | None,
    held: set[str],
) -> tuple[list[list[LoggedEvent]], list[int], int]:
    """Each node's events after its watermark seq, which of them were read from the
    stored history (the others came whole from the batch), and the round trips spent.

    Fast path: a node whose watermark is at or past its seq before the batch it was
    just logged in needs exactly that batch's events after the watermark (nothing else
    can be missing; a later concurrent batch is its writer's to apply). Every other
    node (cold, behind, or not just logged) reads its stored history.
    """
    out: list[list[LoggedEvent] | None] = [None] * len(todo)
    slow = []
    for i, n in enumerate(todo):
        k = known.get(n) if known else None
        if k is not None and after[i] >= 0 and after[i] >= k.previous_seq:
            out[i] = [e for e in k.events if e.seq > after[i]]
        elif k is not None and after[i] < 0 and k.previous_seq < 0:
            out[i] = list(k.events)  # a new node: the batch is its whole history
        else:
            slow.append(i)
    if slow:
        nodes, after_slow = [todo[i] for i in slow], [after[i] for i in slow]
        read_committed = getattr(store, "read_committed", None)
        if read_committed is not None:  # partitioned log: copies in doubt hold their node
            read, in_doubt = read_committed(nodes, after_slow)
            held.update(in_doubt)
        else:
            read = store.read_histories(nodes, after_seq=after_slow)
        for i, h in zip(slow, read, strict=True):
            out[i] = h
    return [h or [] for h in out], slow, int(bool(slow))


def apply_nodes(
    store: StateStore,
    version: str,
    nodes: list[str],
    advance: Advance,
    max_rounds: int = 8,
    known: dict[str, JustLogged] | None = None,
    bringing: frozenset[int] | None = None,
    newest_brought: dict[str, int] | None = None,
    first_read: dict[str, bytes | None] | None = None,
) -> ApplyStats:
    """Bring the stored blobs of ``nodes`` up to date with their histories.

    ``known`` (from the append that just logged events of these nodes) lets the first
    round skip the history read of nodes that were up to date before that append.
    ``bringing``: the seqs of the events this call applies (just logged, or pending);
    a node without a blob whose history starts with one of them is new, not a cold
    rebuild. None: every node written without a blob counts as rebuilt (a backfill).
    ``newest_brought``: per node, the newest seq of its history this call brings. A
    node whose stored watermark already reached it is done: another writer folded our
    events in. Without this, a writer that loses the compare-and-set on a hub would
    have to catch up with every later event of every other writer before it may stop,
    and under a steady stream of writers to one hub it could run out of rounds.
    ``first_read``: the nodes' blobs as read before the append that logged ``known``'s
    events (the engine reads them first to advance while the append runs); the first
    round starts from them instead of reading. Safe: the fast path needs a watermark
    at or past the node's seq before that append, which a read before it can only
    show if nothing was logged for the node in between, and the compare-and-set
    expects these marks, so a write in between fails it and the next round re-reads.
    """
    stats = ApplyStats()
    todo = _unique(nodes)
    for _ in range(max_rounds):
        if not todo:
            return stats
        stats.rounds += 1
        if first_read is not None and all(n in first_read for n in todo):
            blobs = [first_read[n] for n in todo]
        else:
            blobs = store.read_states(version, todo)
        first_read = None
        marks = [None if b is None else read_watermark(b) for b in blobs]
        after = [-1 if m is None else int(m[1]) for m in marks]
        if newest_brought:
            keep = [i for i, n in enumerate(todo) if after[i] < newest_brought.get(n, after[i] + 1)]
            if len(keep) < len(todo):
                stats.covered_elsewhere += len(todo) - len(keep)
                todo = [todo[i] for i in keep]
                blobs, marks, after = (
                    [blobs[i] for i in keep],
                    [marks[i] for i in keep],
                    [after[i] for i in keep],
                )
                if not todo:
                    return stats
        held: set[str] = set()
        histories, read, trips = _new_events(store, todo, after, known, held)
        known = None  # later rounds (conflicts) re-read everything
        stats.round_trips += 1 + trips
        sel = [i for i, h in enumerate(histories) if h]
        if not sel and not held:
            return stats
        if not sel:  # only nodes held by a copy in doubt: wait as for a conflict
            stats.in_doubt_waits += len(held)
            todo = [n for n in todo if n in held]
            time.sleep(random.uniform(0, CONFLICT_BACKOFF_S * stats.rounds))
            continue
        sel_nodes = [todo[i] for i in sel]
        # only a read of the stored history can have lost events to the cap
        starts = list(blobs)
        for i in read:
            starts[i] = catch_up_start(blobs[i], histories[i], store.history_cap)
        try:
            new = advance(sel_nodes, [starts[i] for i in sel], [histories[i] for i in sel])
        except HeldByDoubt:
            # a transition-count lookup met a copy in doubt (partitioned log): wait a
            # round, as for nodes held by one, and read again
            stats.in_doubt_waits += len(sel)
            time.sleep(random.uniform(0, CONFLICT_BACKOFF_S * stats.rounds))
            continue
        missing = [n for n in sel_nodes if n not in new]
        if missing:
            raise ValueError(f"advance returned no blob for {missing[:5]}")
        expected = {todo[i]: marks[i] for i in sel}
        if fault_active(AFTER_PARTIAL_WRITE):  # crash test: only the first half lands
            half = sel_nodes[: max(1, len(sel_nodes) // 2)]
            store.write_states(version, {n: new[n] for n in half}, expected)
            maybe_crash(AFTER_PARTIAL_WRITE)
        outcome = store.write_states(version, {n: new[n] for n in sel_nodes}, expected)
        stats.round_trips += 1
        written = set(outcome.written)
        for i in sel:
            if todo[i] in written:
                stats.nodes_applied += 1
                stats.events_applied += len(histories[i])
                stats.cold_rebuilds += blobs[i] is None and (
                    bringing is None or histories[i][0].seq not in bringing
                )
        stats.conflicts += len(outcome.conflicts)
        stats.in_doubt_waits += len(held)
        todo = list(outcome.conflicts) + [n for n in todo if n in held]
        if todo:  # another writer won these nodes: let it finish before re-reading
            time.sleep(random.uniform(0, CONFLICT_BACKOFF_S * stats.rounds))
    if todo:
        raise ApplyConflictError(
            f"{len(todo)} node(s) still conflicting (or held by a copy in doubt) after {max_rounds} rounds, e.g. {todo[:5]}"
        )
    return stats


def _owners(store: StateStore, e: LoggedEvent) -> tuple[str, ...]:
    """The endpoints this entry is to be applied to: both on one log; on a partitioned
    log those in the entry's partition (the other endpoint has its own copy, applied
    with it or by its partition's re-drive, and may be held by a copy in doubt there)."""
    P = getattr(store, "partitions", 1)
    if P == 1:
        return (e.src, e.dst)
    p = e.seq % P
    return tuple(n for n in (e.src, e.dst) if store.partition_of(n) == p)


def apply_logged(
    store: StateStore,
    version: str,
    events: list[LoggedEvent],
    advance: Advance,
    max_rounds: int = 8,
    previous_seq: dict[str, int] | None = None,
    first_read: dict[str, bytes | None] | None = None,
) -> ApplyStats:
    """Apply the endpoints of just-logged events, then mark the events applied.

    ``previous_seq``: ``AppendResult.previous_seq`` of the append that logged exactly
    these events (enables the fast path of ``apply_nodes``); None for re-drives.
    ``first_read``: the blobs read before that append (``apply_nodes``).
    """
    newest: dict[str, int] = {}
    for e in events:
        for n in _owners(store, e):
            newest[n] = max(newest.get(n, -1), e.seq)
    nodes = list(newest)
    known = just_logged(events, previous_seq, store) if previous_seq else None
    stats = apply_nodes(
        store,
        version,
        nodes,
        advance,
        max_rounds=max_rounds,
        known=known,
        bringing=frozenset(e.seq for e in events),
        newest_brought=newest,
        first_read=first_read if previous_seq else None,
    )
    if events:
        maybe_crash(BEFORE_MARK)
        store.mark_applied([e.seq for e in events], version)
        stats.round_trips += 1
        stats.marked += len(events)
    return stats


def redrive(
    store: StateStore, version: str, advance: Advance, batch: int = 1000, max_rounds: int = 8
) -> ApplyStats:
    """Apply every pending (logged, not yet marked applied) event, oldest first, then
    mark it applied. Safe to run at any time and concurrently with other writers."""
    stats = ApplyStats()
    resolve_doubts = getattr(store, "resolve_doubts", None)
    if resolve_doubts is not None:  # partitioned log: decide copies left in doubt
        resolve_doubts()
        stats.round_trips += 1
    last_first: int | None = None
    while True:
        pend = store.pending(batch)
        stats.round_trips += 1
        if not pend:
            return stats
        if pend[0].seq == last_first:  # mark_applied made no progress
            raise RuntimeError(f"re-drive made no progress at seq {last_first}")
        last_first = pend[0].seq
        stats.add(apply_logged(store, version, pend, advance, max_rounds=max_rounds))
