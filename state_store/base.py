"""The state-store interfaces (after Feast's online store: small interfaces, one
config per backend, ``state_store.config``): ``StateTable`` (state blobs with
compare-and-set) and ``EventLog`` (log, histories, pending), which every backend
implements both of (``StateStore``).

Three kinds of data, with different keys and lifetimes:

* **Node state blobs** (``model.node_state``): one per node *and model version*;
  the only keys that may carry a TTL, so ``volatile-*`` eviction never touches the
  log. A missing blob for a node that has history is a *cold* node.
* **The event log**: the source of truth. Appending is one atomic step per batch:
  de-duplicate by event id (ids remembered for a TTL window), refuse events older
  than the last *logged* event of either endpoint (the late policy), assign
  increasing sequence numbers, and append each event to the global log and to the
  capped per-node history of both endpoints. Because the late check and the
  per-node append are atomic with the sequence assignment, each node's history is
  sorted by (t, seq), and an applier that applies "every history event after the
  node's watermark" can never skip an event that another writer logged first.
* **Pending set**: sequences logged but not yet applied to both endpoints; the
  service re-drives them on start and after a failed apply.

Writes of state blobs are compare-and-set on the watermark (t_last, last_seq) held
in the blob header: a write succeeds only if the stored blob still has the
watermark the writer read (or is still absent). A loser re-reads and re-applies.

Additions to the first version of this interface (nothing existing was renamed or
changed in meaning):

* ``StoreUnavailable``: raised by every backend when the store cannot do a call for
  a reason with a name (connection refused or lost, timeout, cluster down, read-only
  replica after a failover, out of memory, loading, busy, ...; its ``reason`` is one
  of ``STORE_ERROR_REASONS``). The service answers 503 with it. Other errors (bad
  arguments) stay ordinary exceptions.
* ``append_events`` may also refuse an event whose ``t`` lies more than the store's
  ``max_future_skew`` beyond the latest logged time; such events are listed in
  ``AppendResult.late`` too, with a reason starting ``"future: "`` (late ones start
  ``"late: "``), so callers only look in one place for per-event refusals.
  ``AppendResult.rejected`` is an alias of ``late`` for readers of the HTTP contract.
* ``AppendResult.event_ids``: the id of every input event, the client's or the one
  the store assigned (``event_id=None``), so callers can build ``LoggedEvent``s of
  what they logged (``applier.logged_events``).
* Dedupe markers (one per remembered client event id) carry a TTL too, the dedupe
  window; evicting one only shortens that window. Ids the store assigns are 128
  random bits that no client ever sees (the HTTP contract does not return them), so
  they are neither looked up nor remembered. The log, histories and pending set never
  carry a TTL.
* ``append_events`` raises ``ValueError`` (and changes nothing) for a non-finite
  ``t``; the service validates before, this is a last guard.
* ``StateStore.backend``: a short name of the backend ("memory", "redis",
  "redis-cluster") for logs and metrics.
* ``StateStore.memory()``: the store's memory use, limit and eviction count
  (``StoreMemory``; None for the embedded store), sampled for metrics.
* ``mark_applied(seqs, version)`` also records, per model version, the highest seq
  it marked (``state_store.versions.VersionMarks``): what tells a stale blob of a
  version that was not serving from a current one, at no cost while one version serves.
* ``pending(limit, after_seq)`` pages through the pending set (a retry of duplicates
  looks for its own events there).
* ``ServingRegistry``: the one serving-version key that every worker and replica
  follows, read together with the version marks in one round trip.
* ``StateStore.history_cap``: events kept per node history, so that a catch-up can
  tell a complete gap from one the cap has trimmed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from .blob_header import Watermark
from .versions import ServingModel, ServingState

# Why a store call failed, for every error with a name: the service answers each with
# a 503 and Retry-After (never a 500), and counts it by this reason.
STORE_ERROR_REASONS = (
    "connection",  # refused, reset, lost
    "timeout",
    "oom",  # maxmemory reached and nothing may be evicted (noeviction, or no TTL key left)
    "readonly",  # a replica, e.g. during a failover
    "loading",  # the server is loading its dataset after a restart
    "busy",  # a script runs past its time limit
    "masterdown",  # a replica that lost its master and serves no stale data
    "clusterdown",  # the cluster cannot serve (slots uncovered, no quorum)
    "tryagain",  # a multi-key command during a resharding
    "misconf",  # the server refuses writes because it cannot persist
    "conflict",  # a compare-and-set still losing after the applier's last round
)
# Of those, the ones where the store cannot be reached at all: the replica is then not
# ready (/readyz 503). A full or busy store still answers reads, so it stays ready.
UNREACHABLE_REASONS = frozenset(
    {"connection", "timeout", "loading", "masterdown", "clusterdown", "tryagain"}
)


class StoreUnavailable(Exception):
    """The store cannot do the call now, for a reason that has a name
    (``STORE_ERROR_REASONS``): connection refused or lost, timeout, cluster down,
    read-only replica, out of memory, busy, a compare-and-set conflict past its retries.

    The service maps it to HTTP 503 with Retry-After. The original error is chained as
    ``__cause__``. Nothing a failed call started is left half-done: appends and
    compare-and-set writes are atomic scripts, and logged events stay pending until
    both endpoints are applied.
    """

    def __init__(self, message: str, reason: str = "connection") -> None:
        super().__init__(message)
        if reason not in STORE_ERROR_REASONS:
            raise ValueError(f"unknown store error reason {reason!r}")
        self.reason = reason

    @property
    def unreachable(self) -> bool:
        return self.reason in UNREACHABLE_REASONS


class HeldByDoubt(StoreUnavailable):
    """A partitioned log cannot answer yet: the entry just before an event in a node's
    history is a copy in doubt, which may still be aborted. As for a node held by a
    copy in doubt, the apply waits a round and asks again (a 503 if it stays)."""

    def __init__(self, nodes: list[str]) -> None:
        super().__init__(
            f"{len(nodes)} lookup(s) wait for a copy in doubt, e.g. {nodes[:5]}", reason="conflict"
        )
        self.nodes = nodes


class LoggedEvent(NamedTuple):
    """An event as kept in the log and in node histories. (Named tuples: thousands are
    built per batch, and a frozen dataclass's __init__ cost ~4x as much.)"""

    seq: int
    src: str
    dst: str
    t: float
    features: tuple[float, ...] = ()
    event_id: str = ""


class NewEvent(NamedTuple):
    """An event to append (validated already: finite t, right feature length)."""

    src: str
    dst: str
    t: float
    features: tuple[float, ...] = ()
    event_id: str | None = None  # None: the store assigns a unique id


@dataclass
class AppendResult:
    """Per input event, in input order: the assigned seq, or why it was not logged."""

    seqs: list[int | None]  # None where not logged
    duplicates: list[int] = field(default_factory=list)  # input indices seen before
    late: list[tuple[int, str]] = field(default_factory=list)  # (index, reason)
    event_ids: list[str] = field(
        default_factory=list
    )  # per input event: its id (given or assigned)
    # Per endpoint of a logged event: the seq of that node's last logged event BEFORE
    # this batch (-1: none). The applier's fast path: a node whose stored watermark is
    # at least this needs exactly this batch's events, so its history is not re-read.
    previous_seq: dict[str, int] = field(default_factory=dict)
    # Partitioned log only (P > 1): per input index of an event whose endpoints are in
    # two partitions, the seq of its copy in the destination's partition (``seqs[i]``
    # is the copy in the source's). The applier applies each node from its own copy.
    other_seqs: dict[int, int] = field(default_factory=dict)

    @property
    def rejected(self) -> list[tuple[int, str]]:
        """Every refused event, (index, reason): late ("late: ...") and future ("future: ...")."""
        return self.late


@dataclass(frozen=True)
class StoreMemory:
    """What the store says about its memory (Redis: INFO memory and stats; summed over
    the masters of a cluster)."""

    used_bytes: int
    max_bytes: int  # maxmemory; 0 = no limit
    evicted_keys: int  # keys evicted since the server started (its own counter)
    policy: str  # maxmemory-policy


@dataclass
class WriteOutcome:
    written: list[str]  # node ids whose blob was written
    conflicts: list[str]  # node ids whose stored watermark changed since it was read


class StateTable(Protocol):
    """Node-state blobs, one per node and model version; writes are compare-and-set
    on the watermark in the blob header (``state_store.blob_header``)."""

    # True where ``read_states_async`` never blocks the loop. Small score requests then
    # read and score on the loop itself instead of in a worker thread (service.batcher).
    async_reads: bool

    def read_states(self, version: str, nodes: list[str]) -> list[bytes | None]: ...

    async def read_states_async(self, version: str, nodes: list[str]) -> list[bytes | None]:
        """``read_states`` awaited on the event loop (only where ``async_reads``)."""
        ...

    def write_states(
        self, version: str, blobs: dict[str, bytes], expected: dict[str, Watermark | None]
    ) -> WriteOutcome:
        """Compare-and-set: write ``blobs[n]`` only where the stored watermark equals
        ``expected[n]`` (None = no blob stored)."""
        ...

    def delete_states(self, version: str, nodes: list[str]) -> int: ...


class EventLog(Protocol):
    """The source of truth: the log with dedupe and the late check, per-node
    histories, and the pending set of logged but not yet applied events."""

    def append_events(self, events: list[NewEvent]) -> AppendResult: ...

    def read_histories(
        self, nodes: list[str], after_seq: list[int] | None = None, limit: int | None = None
    ) -> list[list[LoggedEvent]]:
        """Each node's history (oldest first), only events with seq > after_seq[i]
        if given, at most the newest ``limit`` events if given."""
        ...

    def neighbours_before(self, nodes: list[str], events: list[LoggedEvent]) -> list[str | None]:
        """For each node, the other endpoint of its latest history event before
        ``events[i]`` (the node itself for a self-loop), None when there is none (the
        node's first event, or one the history cap has trimmed). ``events[i]`` is an
        event of the node as some history holds it: on one log, by its seq; on a
        partitioned log, it may be the other endpoint's copy, and the node's own copy is
        found by the event's time and id. A node's history below its latest event never
        changes (late events are refused), so the answer for an event is fixed once the
        event is logged; on a partitioned log, once the entry before it is decided
        (``HeldByDoubt`` until then)."""
        ...

    def two_neighbours_before(
        self, nodes: list[str], events: list[LoggedEvent]
    ) -> list[tuple[str | None, str | None]]:
        """``neighbours_before`` and the neighbour-list entry before that one (the
        second-order transition counts): per node its two latest entries before
        ``events[i]``, newest first (a self-loop is two entries of the node itself),
        None where there are fewer (or the history cap trimmed them)."""
        ...

    def read_log(self, after_seq: int, count: int) -> list[LoggedEvent]: ...

    def pending(self, limit: int, after_seq: int | None = None) -> list[LoggedEvent]:
        """Logged events not yet marked applied, oldest first (only seqs > after_seq if given)."""
        ...

    def mark_applied(self, seqs: list[int], version: str | None = None) -> None:
        """Drop ``seqs`` from the pending set; with ``version``, also raise that
        version's mark (``VersionMarks``) to the highest of them, in the same step."""
        ...

    def last_event_time(self) -> float | None:
        """The latest event time logged so far (the service's event-time clock)."""
        ...


class ServingRegistry(Protocol):
    """The serving model version: one key in the store that every worker follows."""

    def read_serving(self) -> ServingState:
        """The serving key and the version marks, in one round trip."""
        ...

    def publish_serving(self, model: ServingModel, only_if_absent: bool = False) -> ServingModel:
        """Set the serving key (``only_if_absent``: only where none is set yet); the
        record the store holds afterwards."""
        ...


class StateStore(StateTable, EventLog, ServingRegistry, Protocol):
    """Every role behind one connection (each backend implements all), plus its
    lifecycle. Every method is one round trip (or one per cluster slot), whatever
    the batch size."""

    backend: str  # "memory", "redis" or "redis-cluster", for logs and metrics
    # Log partitions P (1: one log); a seq belongs to partition ``seq % P``, and a node
    # to ``partition_of(node)``: an applier applies a node only from its own copies.
    partitions: int

    def partition_of(self, node: str) -> int: ...

    def claim_layout(self) -> None:
        """Record the store's number of partitions, or check it against the recorded
        one: raises ``state_store.layout.LayoutMismatch`` for another (at start-up)."""
        ...

    @property
    def history_cap(self) -> int:
        """Events kept per node history (``StoreOptions.history_cap``)."""
        ...

    def ping(self) -> bool: ...

    # True where ``begin_append`` sends the append and returns before its answer.
    appends_in_background: bool = False

    def begin_append(self, events: list[NewEvent]) -> Callable[[], AppendResult]:
        """Start ``append_events``; the returned function waits for its answer. A
        caller can work meanwhile (the single-slot Redis log: Redis runs the script
        while the service advances the batch). Here: the append, done at once."""
        result = self.append_events(events)
        return lambda: result

    def memory(self) -> StoreMemory | None:
        """The store's memory use and eviction count (one round trip, for a sampled
        metric, never per request); None where the backend has no such figures."""
        ...

    def close(self) -> None: ...

    async def aclose(self) -> None:
        """Release what ``read_states_async`` opened (on the loop that used it)."""
        ...
