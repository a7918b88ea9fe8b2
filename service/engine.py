"""The ingestion and scoring pipelines, over one loaded checkpoint and one state store.

Everything here is blocking (torch, sync Redis): the app calls it from worker
threads, never on the event loop. The numbers come from ``model.streaming`` so
that they are exactly those of the offline evaluator.

Ingest: validate -> append to the log (one atomic script: dedupe, late check,
sequence numbers) -> apply: one read of all touched states, one padded step/scan
over every touched node, one compare-and-set pipelined write (``apply_logged``).
Score: one read of the states, one of the neighbour lists; cold nodes (history
but no blob) are rebuilt together by one batch scan and written back with a
compare-and-set that never overwrites a newer state; then decay, read-out, head.

Stale blobs: a blob is served only when it is current. After a model switch, the
blobs of a version that was not serving miss the events other versions applied
meanwhile; the store's version marks (``state_store.versions``) bound which blobs
can be stale, and only those are checked against their node's history (in the same
read as the cold nodes' histories) and caught up from the blob itself in the same
batch scan. While one version has applied everything there is nothing to check.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.checkpoint import LoadedCheckpoint, load_checkpoint
from model.config import ModelConfig
from model.events import ROLE_DST, ROLE_SRC, NodeEvent, endpoint_events
from model.kernels.dispatch import kernel_advancer
from model.node_head_checkpoint import load_node_head
from model.node_ids import node_key, node_keys
from model.node_state import NeighbourLists, NodeStates, StateCodec
from model.numpy_scorer import NumpyScorer
from model.protocol import ServedModel
from model.rank_plan import RankPlan
from model.role_counts import IN_TOTAL, LATEST_IN, OUT_TOTAL
from model.streaming import score_nodes
from model.transition_counts import PAD, DenseTransitions, latest_transition_at_query
from state_store.applier import (
    Advance,
    LoggedBatch,
    apply_logged,
    catch_up_start,
    logged_events,
    redrive,
)
from state_store.base import (
    AppendResult,
    EventLog,
    LoggedEvent,
    NewEvent,
    StateStore,
    StoreUnavailable,
)
from state_store.blob_header import read_watermark
from state_store.common import other_endpoint
from state_store.faults import AFTER_LOG, maybe_crash
from state_store.versions import NO_MARK, VersionMarks

from . import metrics
from .overlapped_advance import (
    MIN_OVERLAP_EVENTS,
    Prepared,
    PreparedAdvance,
    batch_rows,
    prepare,
)
from .schemas import EventsResponse, NodeSummary, Rejected

log = logging.getLogger("dygserve")


# A context manager around one apply that yields the ``advance`` callback to use,
# given the one the engine would use (which it is to call).
ApplyWatch = Callable[["ModelRuntime", list[LoggedEvent], Advance], AbstractContextManager[Advance]]

# A candidate link: (src, dst, t); t None means the latest event time seen.
Pair = tuple[str, str, float | None]

# Nodes remembered as checked current (per process), before the memory is dropped.
VERIFIED_NODES_MAX = 200_000
# Pending events read per page when a retry looks for its own still-pending events,
# and the most pages read: past that (a backlog after an outage) the retry answers
# "applied": false for what it did not find, and the re-drive applies the backlog.
PENDING_PAGE = 1000
PENDING_PAGES_MAX = 10


@dataclass(frozen=True)
class Staleness:
    """For the serving version: which blobs may be stale (watermark seq below
    ``missed_upto``), and the nodes already checked current since that bound was set
    (node -> the watermark seq it was checked at), so each is checked once."""

    version: str
    missed_upto: int
    verified: dict[str, int]

    def suspects(self, nodes: Sequence[str], blobs: Sequence[bytes | None]) -> list[int]:
        """Indices of the blobs that must be checked against their node's history."""
        if self.missed_upto == NO_MARK:
            return []  # one version applied everything: the warm path pays nothing
        out = []
        for i, b in enumerate(blobs):
            if b is not None:
                seq = read_watermark(b)[1]
                if seq < self.missed_upto and self.verified.get(nodes[i]) != seq:
                    out.append(i)
        return out


class RequestRefused(ValueError):
    """A whole request refused with a 4xx (nothing applied)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@contextmanager
def timed_store(op: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics.STORE_LATENCY.labels(op=op).observe(time.perf_counter() - start)


class ModelRuntime:
    """One loaded checkpoint: model, codec, and the store-facing advance function."""

    def __init__(
        self,
        checkpoint: LoadedCheckpoint,
        backend: str = "torch",
        onnx_dir: Path | None = None,
        device: str = "cpu",
    ) -> None:
        cfg = checkpoint.config
        if cfg.latest_transition_count and not cfg.latest_transition_at_query:
            # (model/transition_counts.latest_transition_counts: a writer that advances
            # one endpoint without the other cannot keep it; read at the query it is
            # served: ``Engine.load_states``)
            raise ValueError(
                "this checkpoint keeps latest transition counts from the event"
                " (latest_transition_count without latest_transition_at_query), an experiment"
                " the trainer and the evaluator run but the service cannot serve"
            )
        self.checkpoint = checkpoint
        self.backend = backend
        # States are decoded and encoded on the host; the model's work (the rank-major
        # advance of ingest and cold rebuilds, the read-out and head) runs on ``device``.
        self.device = torch.device("cpu")
        if backend == "onnx":
            from model.onnx.runtime import OnnxLinkModel

            # Same surface as the torch model for model.streaming; refuses a stale export.
            self.model: ServedModel = OnnxLinkModel.from_loaded(checkpoint, onnx_dir=onnx_dir)
            # Scoring runs the ONNX read-out/head graph (about 2.5x torch's speed per
            # call); state updates keep torch's rank-major kernel, which applies a batch
            # in one pass where the ONNX step graph runs once per event rank (half the
            # ingest rate, docs/ONNX.md). Both are tested equal to the plain step.
            self.advance_model = checkpoint.model
        else:
            self.device = resolve_device(device)
            self.model = self.advance_model = checkpoint.model.to(self.device)
        self.config = checkpoint.config
        self.version = checkpoint.version
        # What advances states: mamba-ssm's kernels on CUDA where they run, else torch's
        # rank-major path (model/kernels/dispatch.py); /v1/model and a metric show which.
        self.kernels = kernel_advancer(self.advance_model, self.device)
        self.codec = StateCodec(self.config, self.version)
        # The torch backend's kernel for calls of a few pairs (model/numpy_scorer.py).
        self.numpy_scorer = NumpyScorer(checkpoint.model) if backend == "torch" else None
        # The node-classification head, where the checkpoint has one (service/classify.py).
        self.node_head = load_node_head(checkpoint.path, checkpoint.version)
        # The log whose histories ``advance_blobs`` reads for transition counts.
        self.log: EventLog | None = None

    def paired_with(self, log: EventLog) -> ModelRuntime:
        """This runtime, advancing with ``log`` (itself, for chaining)."""
        self.log = log
        return self

    @classmethod
    def load(
        cls,
        path: Path,
        backend: str = "torch",
        onnx_dir: Path | None = None,
        device: str = "cpu",
        verify_key: bytes | None = None,
    ) -> ModelRuntime:
        """``verify_key``: refuse a checkpoint not signed with it (model.signing);
        the service passes ``Settings.checkpoint_verify_key()`` everywhere it loads."""
        return cls(load_checkpoint(path, verify_key), backend, onnx_dir, device)

    def decode(self, blobs: Sequence[bytes | None]) -> tuple[NodeStates, NeighbourLists]:
        """States and recent-neighbour lists for a list of blobs; None -> the initial state."""
        present = [i for i, b in enumerate(blobs) if b is not None]
        if len(present) == len(blobs):
            return self.codec.decode_with_neighbours(list(blobs))  # type: ignore[arg-type]
        states = NodeStates.initial(len(blobs), self.config)
        lists = NeighbourLists.empty_for(len(blobs), self.config)
        if present:
            dec, nbr = self.codec.decode_with_neighbours([blobs[i] for i in present])  # type: ignore[misc]
            idx = torch.tensor(present)
            states.h[idx], states.conv[idx] = dec.h, dec.conv
            states.t_last[idx], states.last_seq[idx], states.n_events[idx] = (
                dec.t_last,
                dec.last_seq,
                dec.n_events,
            )
            lists.assign(idx, nbr)
        return states, lists

    def advance_blobs(
        self,
        nodes: list[str],
        blobs: list[bytes | None],
        new_events: list[list[LoggedEvent]],
        log: EventLog | None = None,
    ) -> dict[str, bytes]:
        """The applier's callback: apply each node's new events to its state and its
        neighbour list, return the new blobs. A model with transition counts also
        needs the ``log``: where each event's other endpoint had been just before."""
        per_node = [
            node_events(node, events) for node, events in zip(nodes, new_events, strict=True)
        ]
        # Decoded straight into the rank plan's order: the advance then gathers nothing.
        order = RankPlan.sort_order([len(p) for p in per_node]).tolist()
        nodes, blobs, per_node = (
            [nodes[i] for i in order],
            [blobs[i] for i in order],
            [per_node[i] for i in order],
        )
        states, lists = self.decode(blobs)
        previous: list[list[int]] | None = None
        previous2: list[list[int]] | None = None
        if self.config.transition_buckets:
            log = log or self.log
            if log is None:
                raise ValueError("this model keeps transition counts: advancing needs the log")
            # each node's blob's newest list entries (one, or two for second-order counts)
            depth = 2 if self.config.transition_order2 else 1
            tails = lists.keys[:, -depth:].tolist()
            if lists.keys.shape[1] < depth:
                tails = [[PAD] * depth for _ in nodes]
            before = counterparts_before(log, nodes, [new_events[i] for i in order], tails)
            previous = before[0]
            previous2 = before[1] if depth == 2 else None
        newest = None
        if self.codec.keeps_newest_id:  # the newest list entry's node, for queries to read
            kept = self.codec.newest_ids(blobs)
            newest = [
                other_endpoint(new_events[i][-1], node) if new_events[i] else kept[k]
                for k, (i, node) in enumerate(zip(order, nodes, strict=True))
            ]
        new = self.kernels.advance(states.to(self.device), per_node).to("cpu")
        extended = lists.extended(per_node, previous, previous2)
        return dict(zip(nodes, self.codec.encode_many(new, extended, newest), strict=True))


def set_latest_at_query(
    config: ModelConfig, lists: NeighbourLists, newest_counts: np.ndarray, has: np.ndarray
) -> None:
    """Set on ``lists`` each node's latest transition count read at the query
    (``transition_counts.latest_transition_at_query``), from its newest neighbour's
    transition record (``newest_counts``, row i for node i; ``has`` False: no newest
    neighbour, 0)."""
    assert isinstance(lists.transitions, DenseTransitions)
    buckets, decay = config.transition_buckets, config.transition_decay
    records = DenseTransitions(newest_counts, buckets, decay)
    value = latest_transition_at_query(records, lists.keys[:, -2].numpy(), buckets, has)
    lists.transitions = DenseTransitions(lists.transitions.counts, buckets, decay, value)


def resolve_device(device: str) -> torch.device:
    """ "auto" -> CUDA when this torch build sees a GPU, else the CPU; "cuda" without one is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "device 'cuda' asked for, but torch sees no CUDA device (CPU build or no GPU)"
        )
    return torch.device(device)


def distinct_nodes(pairs: Sequence[Pair]) -> list[str]:
    """The pairs' nodes, each once (sources first), in a stable order."""
    return list(dict.fromkeys([p[0] for p in pairs] + [p[1] for p in pairs]))


def counterparts_previous(
    log: EventLog,
    nodes: list[str],
    new_events: list[list[LoggedEvent]],
    latest_keys: list[int],
) -> list[list[int]]:
    """Per node and entry (``node_events``' entries: a self-loop is two), the key of the
    other endpoint's neighbour before the event (model/transition_counts.py;
    ``transition_counts.PAD``: none): what ``log.neighbours_before`` answers
    (``counterparts_before``, one entry back)."""
    return counterparts_before(log, nodes, new_events, [[k] for k in latest_keys])[0]


# What ``counterparts_before`` gives, with no log to ask, for a neighbour it cannot
# know from the nodes in hand (node keys are 63-bit, never negative; PAD is -1).
UNKNOWN_NEIGHBOUR = -2


def counterparts_before(
    log: EventLog | None,
    nodes: list[str],
    new_events: list[list[LoggedEvent]],
    tail_keys: list[list[int]],
) -> list[list[list[int]]]:
    """Per depth d (the neighbour d + 1 entries back; as many depths as ``tail_keys``
    has columns, 1 or 2), node and entry (``node_events``' entries: a self-loop is two),
    the key of the other endpoint's neighbour before the event: what
    ``log.neighbours_before`` (and ``two_neighbours_before``) answer. ``tail_keys``:
    each node's blob's newest list entries, oldest first (PAD where fewer).

    Most answers are already in hand: when the other endpoint c is advanced in the
    same call and the event is among c's new events (the history after c's blob), c's
    entries before the event are those of its new events before it, then its blob's
    newest list entries. The rest (c not here, or already past the event: another
    writer, a crash between two nodes' writes, a rebuild of one node) is asked of the
    log, in one round trip; with no ``log`` (the live evaluator, which never reads
    the store) they come out as ``UNKNOWN_NEIGHBOUR``.

    An event is matched across the two nodes' histories by seq on one log; on a
    partitioned log each endpoint's partition holds its own copy under its own seq, so
    there by the event's id (every event spanning two partitions has one)."""
    partitioned = getattr(log, "partitions", 1) > 1
    depth = len(tail_keys[0]) if tail_keys else 1

    def identity(e: LoggedEvent) -> int | str:
        return (e.event_id or e.seq) if partitioned else e.seq

    at = {node: i for i, node in enumerate(nodes)}
    # Each node's entries: its blob's newest ones, then those of its new events; and
    # where each new event's first entry sits among them.
    entries: list[list[int]] = []
    first: list[dict[int | str, int]] = []
    for node, events, tail in zip(nodes, new_events, tail_keys, strict=True):
        own, keys = node_key(node), list(tail)
        where: dict[int | str, int] = {}
        for e in events:
            where[identity(e)] = len(keys)
            keys += [own, own] if e.src == e.dst else [node_key(other_endpoint(e, node))]
        entries.append(keys)
        first.append(where)
    out: list[list[list[int]]] = [[] for _ in range(depth)]
    asked: list[str] = []
    asked_events: list[LoggedEvent] = []
    # (row, first entry, entries: 2 for a self-loop) of each answer to ask the log for
    holes: list[tuple[int, int, int]] = []
    for node, events in zip(nodes, new_events, strict=True):
        rows: list[list[int]] = [[] for _ in range(depth)]
        for e in events:
            n = 2 if e.src == e.dst else 1
            other = other_endpoint(e, node)
            c = at.get(other)
            # (c's new events run contiguously from its watermark, but may end before
            # an event a concurrent writer logged later: that one is asked of the log)
            j = -1 if c is None else first[c].get(identity(e), -1)
            if j >= 0:
                assert c is not None
                keys = [entries[c][j - 1 - d] for d in range(depth)]
            else:
                holes.append((len(out[0]), len(rows[0]), n))
                asked.append(other)
                asked_events.append(e)
                keys = [PAD] * depth
            for d in range(depth):
                rows[d] += [keys[d]] * n
        for d in range(depth):
            out[d].append(rows[d])
    if asked and log is None:
        for r, k, n in holes:
            for d in range(depth):
                out[d][r][k : k + n] = [UNKNOWN_NEIGHBOUR] * n
    elif asked:
        assert log is not None
        found_all: list[tuple[str | None, ...]] = (
            [(f,) for f in log.neighbours_before(asked, asked_events)]
            if depth == 1
            else list(log.two_neighbours_before(asked, asked_events))
        )
        for (r, k, n), found in zip(holes, found_all, strict=True):
            for d in range(depth):
                out[d][r][k : k + n] = [PAD if found[d] is None else node_key(found[d])] * n
    return out


def node_events(node: str, events: Sequence[LoggedEvent]) -> list[NodeEvent]:
    """The logged events as seen from ``node``. A self-loop (u, u) is two entries for u
    (in its state and its neighbour list), the source's then the destination's, as the
    trainer and evaluator see it (``model.events.endpoint_events``); the store keeps
    it once in the history. (One loop per node, not a call per event: an ingest of
    1,000 events builds ~2,000 of these.)"""
    key = node_key(node)
    out: list[NodeEvent] = []
    for e in events:
        if e.src == e.dst:
            out += endpoint_events(key, key, e.features, e.t, e.seq)
        elif e.src == node:  # the source's view: the other endpoint is the destination
            out.append(NodeEvent(node_key(e.dst), ROLE_SRC, e.features, e.t, e.seq))
        else:
            out.append(NodeEvent(node_key(e.src), ROLE_DST, e.features, e.t, e.seq))
    return out


@dataclass
class ScoredPair:
    src: str
    dst: str
    t: float
    logit: float
    src_age: float | None
    dst_age: float | None
    src_inductive: bool
    dst_inductive: bool
    clamped: bool

    @property
    def probability(self) -> float:
        return (
            1.0 / (1.0 + math.exp(-self.logit))
            if self.logit >= 0
            else math.exp(self.logit) / (1.0 + math.exp(self.logit))
        )


class Engine:
    def __init__(
        self,
        runtime: ModelRuntime,
        store: StateStore,
        numpy_max_pairs: int = 256,
        overlap_append: bool = True,
    ) -> None:
        self._runtime = runtime.paired_with(store)
        self.store = store
        # Score calls up to this many pairs take the runtime's numpy kernel (when it has
        # one): 3x less CPU for one pair, level with torch near 1,000 (docs/BENCHMARKS.md).
        self.numpy_max_pairs = numpy_max_pairs
        self._swap = threading.Lock()
        # One apply at a time per process. Concurrent applies of batches that share a
        # node (a hub is in nearly every batch) only conflict on its compare-and-set
        # and redo their work, and their torch ops fight over the GIL anyway; logging
        # (the Lua append) and scoring still run beside an apply. Across worker
        # processes the compare-and-set keeps it exactly once.
        self._apply_lock = threading.Lock()
        self.needs_redrive = True  # on start: re-drive whatever a crash left logged but unapplied
        # What every version has applied (the store's marks, plus this process's own
        # applies at once), and from it which blobs of the serving version may be stale.
        self._marks = VersionMarks()
        self._staleness = Staleness(runtime.version, NO_MARK, {})
        # Around each apply: yields the advance callback to hand the applier (the live
        # evaluation's, service/live_eval.py, set by the lifespan); None = the runtime's.
        self.apply_watch: ApplyWatch | None = None
        # Advance a batch while Redis runs its append (service/overlapped_advance.py).
        self.overlap_append = overlap_append

    @property
    def runtime(self) -> ModelRuntime:
        return self._runtime

    @property
    def marks(self) -> VersionMarks:
        return self._marks

    def swap(self, runtime: ModelRuntime, marks: VersionMarks | None = None) -> ModelRuntime:
        """Hot switch: requests already running finish on the runtime they started with.
        ``marks``: the store's version marks, read just before (the bound of stale blobs)."""
        with self._swap:
            old, self._runtime = self._runtime, runtime.paired_with(self.store)
            self._set_marks(marks or VersionMarks())
        return old

    def refresh_marks(self, marks: VersionMarks) -> None:
        """The store's version marks, read on every poll of the serving version."""
        with self._swap:
            self._set_marks(marks)

    def _note_applied(self, version: str, events: Sequence[LoggedEvent]) -> None:
        if events:
            with self._swap:
                self._set_marks(VersionMarks().with_mark(version, max(e.seq for e in events)))

    def _set_marks(self, marks: VersionMarks) -> None:
        """(Under ``self._swap``.) Merge ``marks`` in and recompute the stale bound."""
        self._marks = self._marks.merged(marks)
        version = self._runtime.version
        bound = self._marks.missed_upto(version)
        old = self._staleness
        if old.version != version or old.missed_upto != bound:
            self._staleness = Staleness(version, bound, {})

    def _staleness_of(self, rt: ModelRuntime) -> Staleness:
        st = self._staleness
        if st.version == rt.version:
            return st
        # a request that started before a switch: its version's bound, nothing verified
        return Staleness(rt.version, self._marks.missed_upto(rt.version), {})

    # ----- ingest --------------------------------------------------------------------
    def ingest(self, events: list[dict[str, Any]], apply: bool = True) -> EventsResponse:
        """Log the events, then (``apply``) commit both endpoints' states before returning.

        ``applied`` is true only when every event of the request is applied: those it
        logged, and its duplicates that an earlier attempt logged but that are still
        pending (after a failed apply); a retry with ``apply`` applies those too.

        A batch of ``MIN_OVERLAP_EVENTS`` or more on a single log is advanced while its
        append runs (``service/overlapped_advance.py``): the same blobs, less waiting."""
        rt = self.runtime
        new = self.validated(rt, events)
        if apply and self._overlaps(new):
            return self._ingest_overlapped(rt, new)
        result, logged = self._log(new)
        if logged and apply:
            self.apply(rt, logged)
        result.applied = (apply or not logged) and not logged.unconfirmed
        return result

    def _overlaps(self, new: list[NewEvent]) -> bool:
        return (
            self.overlap_append
            and len(new) >= MIN_OVERLAP_EVENTS
            and self.store.appends_in_background
        )

    def _ingest_overlapped(self, rt: ModelRuntime, new: list[NewEvent]) -> EventsResponse:
        """Read the states, send the append, advance while Redis runs it, then apply."""
        rows = batch_rows(new)
        nodes = list(rows)
        try:
            with timed_store("read_before_append"):
                before = dict(zip(nodes, self.store.read_states(rt.version, nodes), strict=True))
        except StoreUnavailable:
            before = None  # the append will say what the store is up to
        # The append's latency metric counts the time spent sending and waiting for
        # the answer, not the advance that runs meanwhile.
        t0 = time.perf_counter()
        answer = self.store.begin_append(new)
        waited = time.perf_counter() - t0
        prepared = None
        if before is not None:
            try:
                prepared = prepare(rt, before, new, rows)
            except Exception:  # the plain advance after the append will meet it again
                log.debug("advance before the append failed; advancing after it", exc_info=True)
        t0 = time.perf_counter()
        try:
            appended = answer()
        finally:
            waited += time.perf_counter() - t0
            metrics.STORE_LATENCY.labels(op="append").observe(waited)
        result, logged = self._logged(new, appended)
        if logged:
            self.apply(rt, logged, prepared)
        result.applied = not logged.unconfirmed
        return result

    def validated(self, rt: ModelRuntime, events: list[dict[str, Any]]) -> list[NewEvent]:
        """The request's events as the store's type, checked against the model."""
        dim = rt.config.edge_feature_dim
        new = []
        for i, e in enumerate(events):
            feats = e.get("features") or []
            if len(feats) != dim:
                raise RequestRefused(
                    422, f"events[{i}].features has length {len(feats)}, the model expects {dim}"
                )
            new.append(
                NewEvent(
                    e["src"], e["dst"], float(e["t"]), tuple(map(float, feats)), e.get("event_id")
                )
            )
        return new

    def log_events(
        self, rt: ModelRuntime, events: list[dict[str, Any]]
    ) -> tuple[EventsResponse, LoggedBatch]:
        """Validate against the model and append to the log; nothing applied yet."""
        return self._log(self.validated(rt, events))

    def _log(self, new: list[NewEvent]) -> tuple[EventsResponse, LoggedBatch]:
        with timed_store("append"):
            result = self.store.append_events(new)
        return self._logged(new, result)

    def _logged(
        self, new: list[NewEvent], result: AppendResult
    ) -> tuple[EventsResponse, LoggedBatch]:
        """What the append of ``new`` logged, counted, and the request's answer so far."""
        logged = [
            LoggedEvent(seq, ev.src, ev.dst, ev.t, ev.features, ev.event_id or "")
            for ev, seq in zip(new, result.seqs, strict=True)
            if seq is not None
        ]
        if result.other_seqs:  # partitioned log: each event's copy in the destination's too
            logged = logged_events(new, result)
        maybe_crash(AFTER_LOG)
        # Duplicates an earlier attempt logged but could not apply: this request's to
        # apply too, or it could not say that its events are applied. (An id repeated
        # inside this request is a duplicate of an event logged just now: applied below.)
        earlier = {new[i].event_id or "" for i in result.duplicates} - {e.event_id for e in logged}
        waiting, unconfirmed = self.pending_events(earlier) if earlier else ([], 0)
        if unconfirmed:
            self.needs_redrive = True  # a backlog: the background re-drive works it off
        n_logged = len(logged) - len(result.other_seqs)  # events, not copies
        metrics.EVENTS_INGESTED.inc(n_logged)
        metrics.EVENTS_DUPLICATE.inc(len(result.duplicates))
        for _, reason in result.late:
            metrics.EVENTS_REJECTED.labels(reason=reason.split(":", 1)[0]).inc()
        summary = EventsResponse(
            accepted=n_logged,
            duplicates=len(result.duplicates),
            rejected=[Rejected(index=i, reason=r) for i, r in result.late],
            applied=False,
        )
        return summary, LoggedBatch(waiting + logged, result.previous_seq, unconfirmed, result.seqs)

    def pending_events(self, event_ids: set[str]) -> tuple[list[LoggedEvent], int]:
        """Those of ``event_ids`` still pending (logged, not applied), oldest first, and
        how many ids are left unknown because the scan stopped. Only a request with
        duplicates asks (a retry); the pending set is short unless applies fail, and it
        is read page by page until every id is found, at most ``PENDING_PAGES_MAX`` pages."""
        found: list[LoggedEvent] = []
        after: int | None = None
        with timed_store("pending"):
            for _ in range(PENDING_PAGES_MAX):
                page = self.store.pending(PENDING_PAGE, after_seq=after)
                found += [e for e in page if e.event_id in event_ids]
                if len(found) == len(event_ids) or len(page) < PENDING_PAGE:
                    return found, 0
                after = page[-1].seq
        return found, len(event_ids) - len(found)

    def apply_in_background(self, rt: ModelRuntime, logged: LoggedBatch) -> None:
        """For ``wait=false``: a failure leaves the events pending for the re-drive."""
        try:
            self.apply(rt, logged)
        except StoreUnavailable as exc:  # no answer to carry a 503: count and log it
            metrics.STORE_ERRORS.labels(reason=exc.reason).inc()
            log.warning("background apply refused (%s); the re-drive will apply the events", exc)
        except Exception:
            log.warning(
                "background apply failed; the re-drive will apply the events", exc_info=True
            )

    def apply(
        self, rt: ModelRuntime, logged: LoggedBatch, prepared: Prepared | None = None
    ) -> None:
        """``prepared``: the batch advanced before its append answered (``ingest``)."""
        plain = rt.advance_blobs
        advance: Advance = plain
        first_read = None
        if prepared is not None:
            advance = PreparedAdvance(
                prepared, logged.seqs, plain, bool(rt.config.transition_buckets)
            )
            first_read = prepared.before
        try:
            with (
                self._apply_lock,
                timed_store("apply"),
                self._watch(rt, logged.events, advance) as watched,
            ):
                stats = apply_logged(
                    self.store,
                    rt.version,
                    logged.events,
                    watched,
                    previous_seq=logged.previous_seq,
                    first_read=first_read,
                )
            self._note_applied(rt.version, logged.events)
            metrics.EVENTS_APPLIED.inc(stats.marked)
            metrics.COLD_REBUILDS.inc(stats.cold_rebuilds)
            metrics.APPLY_CONFLICTS.inc(stats.conflicts)
            if isinstance(advance, PreparedAdvance):
                metrics.ADVANCED_DURING_APPEND.inc(advance.taken)
        except Exception:
            self.needs_redrive = True  # logged but maybe not applied: re-drive later
            raise

    def _watch(
        self, rt: ModelRuntime, events: list[LoggedEvent], advance: Advance
    ) -> AbstractContextManager[Advance]:
        if self.apply_watch is None:
            return nullcontext(advance)
        return self.apply_watch(rt, events, advance)

    def redrive(self) -> int:
        rt = self.runtime
        with self._apply_lock, timed_store("redrive"):
            stats = redrive(self.store, rt.version, rt.advance_blobs)
        metrics.EVENTS_APPLIED.inc(stats.marked)
        metrics.COLD_REBUILDS.inc(stats.cold_rebuilds)
        metrics.APPLY_CONFLICTS.inc(stats.conflicts)
        self.needs_redrive = False
        return getattr(stats, "events_applied", 0)

    # ----- score ---------------------------------------------------------------------
    def load_states(
        self, rt: ModelRuntime, nodes: list[str], for_pairs: bool = True
    ) -> tuple[NodeStates, NeighbourLists, np.ndarray]:
        """States and neighbour lists of ``nodes`` (unique), rebuilding cold ones and
        catching stale ones up in one batch; and which nodes have no history at all
        (scored inductively). ``for_pairs``: the lists are for pair features, so a model
        that reads the latest transition count at the query gets it here (a second read:
        ``_latest_at_query``)."""
        with timed_store("read_states"):
            blobs = self.store.read_states(rt.version, nodes)
        staleness = self._staleness_of(rt)
        missing = [i for i, b in enumerate(blobs) if b is None]
        suspects = staleness.suspects(nodes, blobs)
        inductive = np.zeros(len(nodes), dtype=bool)
        if missing or suspects:
            todo = missing + suspects
            after = [-1] * len(missing) + [read_watermark(blobs[i])[1] for i in suspects]  # type: ignore[arg-type]
            with timed_store("read_histories"):
                histories = self.store.read_histories([nodes[i] for i in todo], after_seq=after)
            for i, h in zip(missing, histories, strict=False):
                inductive[i] = not h
            redo = [(i, h) for i, h in zip(todo, histories, strict=True) if h]
            # Current after all, or caught up below: not checked again while the bound
            # holds and the blob keeps that watermark.
            checked = zip(suspects, after[len(missing) :], histories[len(missing) :], strict=True)
            for i, seq, h in checked:
                staleness.verified[nodes[i]] = h[-1].seq if h else seq
            if len(staleness.verified) > VERIFIED_NODES_MAX:
                staleness.verified.clear()
            if redo:
                self._rebuild(rt, nodes, blobs, redo)
        states, lists = rt.decode(blobs)
        if for_pairs and rt.config.latest_transition_at_query:
            self._latest_at_query(rt, nodes, blobs, lists)
        return states, lists, inductive

    def _latest_at_query(
        self, rt: ModelRuntime, nodes: list[str], blobs: list[bytes | None], lists: NeighbourLists
    ) -> None:
        """``ModelConfig.latest_transition_at_query``: each node's newest neighbour l1's
        raw transition count at the bucket of the neighbour before it, from l1's record
        as it stands (``transition_counts.latest_transition_at_query``), set on
        ``lists.transitions`` for the pair features. l1 is named in the node's blob; the
        l1s not among ``nodes`` are read in one more batch (cold or stale ones rebuilt as
        any node is)."""
        cfg = rt.config
        assert isinstance(lists.transitions, DenseTransitions)
        newest = rt.codec.newest_ids(blobs)
        at = {n: i for i, n in enumerate(nodes)}
        extra = list(dict.fromkeys(x for x in newest if x and x not in at))
        counts = lists.transitions.counts
        if extra:
            with timed_store("read_newest_neighbours"):
                extra_lists = self.load_states(rt, extra, for_pairs=False)[1]
            assert isinstance(extra_lists.transitions, DenseTransitions)
            counts = np.concatenate([counts, extra_lists.transitions.counts])
            at.update({n: len(nodes) + j for j, n in enumerate(extra)})
        rows = np.fromiter((at.get(x, 0) for x in newest), dtype=np.int64, count=len(nodes))
        has = np.fromiter((bool(x) for x in newest), dtype=bool, count=len(nodes))
        set_latest_at_query(cfg, lists, counts[rows], has)

    def _rebuild(
        self,
        rt: ModelRuntime,
        nodes: list[str],
        blobs: list[bytes | None],
        redo: list[tuple[int, list[LoggedEvent]]],
    ) -> None:
        """One batch scan over cold nodes (from the initial state) and stale ones (from
        their blob), written back compare-and-set so that no newer state is overwritten;
        ``blobs`` is updated in place."""
        redo_nodes = [nodes[i] for i, _ in redo]
        starts = [catch_up_start(blobs[i], h, self.store.history_cap) for i, h in redo]
        rebuilt = rt.advance_blobs(redo_nodes, starts, [h for _, h in redo])
        expected = {
            nodes[i]: None if blobs[i] is None else read_watermark(blobs[i])  # type: ignore[arg-type]
            for i, _ in redo
        }
        with timed_store("write_states"):
            self.store.write_states(rt.version, rebuilt, expected)
        cold = sum(blobs[i] is None for i, _ in redo)
        metrics.COLD_REBUILDS.inc(cold)
        metrics.STALE_CATCHUPS.inc(len(redo) - cold)
        for i, _ in redo:
            blobs[i] = rebuilt[nodes[i]]

    def score_pairs(self, pairs: Sequence[Pair]) -> tuple[list[ScoredPair], str]:
        rt = self.runtime
        if not pairs:
            return [], rt.version
        default_t = None
        if any(t is None for _, _, t in pairs):
            with timed_store("clock"):
                default_t = self.store.last_event_time()
            default_t = 0.0 if default_t is None else default_t
        nodes = distinct_nodes(pairs)
        states, lists, inductive = self.load_states(rt, nodes)
        return self._score(rt, pairs, nodes, states, lists, inductive, default_t), rt.version

    async def score_pairs_on_loop(
        self, pairs: Sequence[Pair]
    ) -> tuple[list[ScoredPair], str] | None:
        """``score_pairs`` on the event loop, for a few pairs: an awaited state read (no
        worker thread to wake and wait for), then the read-out in place.

        None where it does not apply, and the caller takes ``score_pairs`` in a worker
        thread: a store without non-blocking reads, a pair without a time (the clock is
        another read), or a node with no cached state (a cold rebuild or an unknown node
        needs its history).
        """
        rt = self.runtime
        if not pairs or not self.store.async_reads or any(t is None for _, _, t in pairs):
            return None
        if rt.config.latest_transition_at_query:  # a second read, for the newest neighbours
            return None
        nodes = distinct_nodes(pairs)
        with timed_store("read_states"):
            blobs = await self.store.read_states_async(rt.version, nodes)
        if any(b is None for b in blobs) or self._staleness_of(rt).suspects(nodes, blobs):
            return None
        states, lists = rt.decode(blobs)
        return self._score(
            rt, pairs, nodes, states, lists, np.zeros(len(nodes), dtype=bool), None
        ), rt.version

    def _score(
        self,
        rt: ModelRuntime,
        pairs: Sequence[Pair],
        nodes: list[str],
        states: NodeStates,
        lists: NeighbourLists,
        inductive: np.ndarray,
        default_t: float | None,
    ) -> list[ScoredPair]:
        pos = {n: i for i, n in enumerate(nodes)}
        n = len(pairs)
        iu = np.fromiter((pos[s] for s, _, _ in pairs), dtype=np.int64, count=n)
        iv = np.fromiter((pos[d] for _, d, _ in pairs), dtype=np.int64, count=n)
        tau = np.fromiter(
            (default_t if t is None else t for _, _, t in pairs), dtype=np.float64, count=n
        )
        keys = node_keys(nodes)
        if rt.numpy_scorer is not None and n <= self.numpy_max_pairs:
            lg = rt.numpy_scorer.score_nodes(
                states.h.numpy(),
                states.t_last.numpy(),
                states.n_events.numpy(),
                lists.keys.numpy(),
                lists.times.numpy(),
                keys,
                iu,
                iv,
                tau,
                None if lists.records is None else lists.records.numpy(),
                None if lists.transitions is None else lists.transitions.counts,  # type: ignore[attr-defined]
                None if lists.transitions is None else lists.transitions.latest_counts,  # type: ignore[attr-defined]
            ).tolist()
        else:
            dev = rt.device
            lg = score_nodes(
                rt.model,
                states.to(dev),
                lists.to(dev),
                torch.from_numpy(keys).to(dev),
                torch.from_numpy(iu).to(dev),
                torch.from_numpy(iv).to(dev),
                torch.from_numpy(tau).to(dev),
            ).tolist()
        out = []
        # Plain Python floats in one go: indexing tensors per pair costs microseconds each.
        t_last = states.t_last.tolist()
        tl_u, tl_v = [t_last[i] for i in iu.tolist()], [t_last[i] for i in iv.tolist()]
        taus = tau.tolist()
        ind = inductive.tolist()
        for k, (s, d, _) in enumerate(pairs):
            t = taus[k]
            age_u = t - tl_u[k] if math.isfinite(tl_u[k]) else None
            age_v = t - tl_v[k] if math.isfinite(tl_v[k]) else None
            clamped = (age_u is not None and age_u < 0) or (age_v is not None and age_v < 0)
            out.append(ScoredPair(s, d, t, lg[k], age_u, age_v, ind[pos[s]], ind[pos[d]], clamped))
        return out

    # ----- introspection -------------------------------------------------------------
    def node_summary(self, node: str) -> NodeSummary:
        rt = self.runtime
        blob = self.store.read_states(rt.version, [node])[0]
        history = self.store.read_histories([node])[0]
        if blob is not None and self._staleness_of(rt).suspects([node], [blob]):
            # a stale blob is shown caught up, as it would be served (a cold one is
            # reported as not cached: it is rebuilt on first use)
            newer = [e for e in history if e.seq > read_watermark(blob)[1]]
            if newer:
                blobs: list[bytes | None] = [blob]
                self._rebuild(rt, [node], blobs, [(0, newer)])
                blob = blobs[0]
        st, lists = rt.decode([blob])
        t_last = float(st.t_last[0])
        roles: dict[str, Any] = {}
        if lists.records is not None and blob is not None:
            record = lists.records[0].tolist()
            latest_in = record[LATEST_IN]
            roles = {
                "in_events": int(record[IN_TOTAL]),
                "out_events": int(record[OUT_TOTAL]),
                "last_in_t": latest_in if math.isfinite(latest_in) else None,
            }
        return NodeSummary(
            node=node,
            model_version=rt.version,
            cached=blob is not None,
            t_last=t_last if math.isfinite(t_last) else (history[-1].t if history else None),
            events_applied=int(st.n_events[0]),  # 0 while not cached (cold: rebuilt on first use)
            last_seq=int(st.last_seq[0])
            if blob is not None
            else (history[-1].seq if history else None),
            history_length=len(history),
            **roles,
        )
