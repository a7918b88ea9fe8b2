"""Live evaluation: the service measures its own link-prediction quality on the stream.

Every ingested event is a labelled positive. A deterministic sample of them (rate
``live_eval_rate``, chosen by a hash of the event's log sequence number and
``live_eval_seed``) is scored with exact visibility -- from the states after every
event of the endpoint before the event's time and none at or after it, what a
``GET /v1/score`` just before the event would have answered -- against K destinations
drawn from the destinations this process recently applied events to. The rolling AP,
AUC and MRR of the last N samples are Prometheus gauges (``live_eval_metrics``).

Cost, and why it is exact without reading the store again:

* On the request path the only work is a wrapper around the applier's ``advance``
  callback that keeps references to what the applier already has in hand (each
  touched node's blob before the batch, its new events, its new blob) and one
  ``put_nowait`` on a bounded queue, after the apply. Nothing per event, no store
  call, no wait: a full queue drops the batch and counts it.
* A background thread does the rest (``live_eval_rows``): picks the samples, rebuilds
  each endpoint's state just before the event (its blob before the batch, advanced by
  its batch events earlier than the event's time with the runtime's own rank-major
  advance, or the blob after the batch when all of those came first), takes each
  negative's state from the same place when the batch touched it and otherwise from
  the newest blob this process committed for it (kept for the ``live_eval_pool`` most
  recently active destinations), and scores them with the model's read-out and head.
  It stays within a CPU budget (``cpu_budget``; sampled events past it are skipped and
  counted) and yields the GIL between samples.
* A state that already holds an event at or after the sample's time (a timestamp
  group cut between two requests, or a stream out of order across nodes) cannot
  give the exact-visibility score: such an endpoint skips the sample
  (``not_visible``), such a negative is not drawn.
* An apply that fails (a store error) hands nothing over: its batch is skipped and
  counted. The evaluator never calls the store, so it cannot fail an ingest.

Limits: a process only knows the blobs it committed itself, so with several workers
or replicas a negative last advanced by another process is scored from this
process's older blob of it (the negatives are drawn from this process's pool, which
a re-drive does not refresh either); with one worker the scores are exact, as the
parity test against the offline evaluator shows.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from state_store.applier import Advance
from state_store.base import LoggedEvent, StoreUnavailable
from state_store.blob_header import read_watermark
from state_store.common import other_endpoint

from . import live_eval_metrics as m
from .cpu_budget import CpuBudget
from .engine import ModelRuntime
from .live_eval_rows import (
    Applied,
    Snapshot,
    score_rows,
    states_before,
    with_latest_at_query,
)
from .rolling_quality import RollingQuality

if TYPE_CHECKING:
    from .settings import Settings

log = logging.getLogger("dygserve")

GAUGE_INTERVAL_S = 1.0
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_STOP = object()


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic): a well-mixed hash."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def sampled(seqs: np.ndarray, seed: int, rate: float) -> np.ndarray:
    """Which events (by log sequence number) are live samples: a hash of (seq, seed)
    below ``rate``. Deterministic, independent across events, the same in every
    process that sees the same log."""
    if rate <= 0 or len(seqs) == 0:
        return np.zeros(len(seqs), dtype=bool)
    salt = _splitmix64(np.array([seed], dtype=np.uint64) * _GOLDEN)[0]
    u = _splitmix64(seqs.astype(np.uint64) ^ salt) >> np.uint64(11)
    return u.astype(np.float64) / float(1 << 53) < rate


def one_copy_per_event(events: list[LoggedEvent]) -> list[LoggedEvent]:
    """Each event once. A partitioned log (``DYGSERVE_STORE__PARTITIONS`` > 1) logs an
    event whose endpoints live in two partitions as two copies, each with its own seq
    and both with the event's id, and an apply hands over both: sampled by seq, an
    event would be drawn twice as often, and scored twice when both copies are drawn.
    The copy kept is the one with the lower seq (the same in every process that
    applies the event). Events without an id (the single-slot log, whose events are
    one copy each) are all kept."""
    kept: dict[object, LoggedEvent] = {}
    for e in events:
        key = e.event_id or ("", e.seq)
        first = kept.get(key)
        if first is None or e.seq < first.seq:
            kept[key] = e
    # (a dict keeps the place of an event's first copy when its value is replaced)
    return events if len(kept) == len(events) else list(kept.values())


@dataclass
class AppliedBatch:
    """What one apply had in hand: per call of ``advance``, the nodes, their blobs
    before, their new events and their new blobs (references, no copies)."""

    rt: ModelRuntime
    events: list[LoggedEvent]
    inner: Advance  # what the engine would have advanced with
    calls: list[tuple[list[str], list[bytes | None], list[list[LoggedEvent]], dict[str, bytes]]] = (
        field(default_factory=list)
    )

    def advance(
        self, nodes: list[str], blobs: list[bytes | None], new_events: list[list[LoggedEvent]]
    ) -> dict[str, bytes]:
        out = self.inner(nodes, blobs, new_events)
        self.calls.append((nodes, blobs, new_events, out))
        return out

    def before(self) -> dict[str, Applied]:
        """Each touched node's blob before the batch, its events applied on top and the
        blob after them (a conflict round re-reads a node: its last call is the one
        that committed)."""
        out: dict[str, Applied] = {}
        for nodes, blobs, new_events, after in self.calls:
            for node, blob, events in zip(nodes, blobs, new_events, strict=True):
                out[node] = (blob, events, after[node])
        return out


class LiveEvaluator:
    def __init__(
        self,
        rate: float,
        negatives: int = 9,
        window: int = 1000,
        seed: int = 0,
        pool_size: int = 2000,
        queue_size: int = 64,
        record: Path | None = None,
        cpu_budget: float = 1.0,
    ) -> None:
        self.rate, self.k, self.seed = rate, negatives, seed
        self.budget = CpuBudget(cpu_budget)
        self.pool_size = pool_size
        self.quality = RollingQuality(window)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        # Newest committed blob of the most recently active destinations, oldest first.
        self._pool: OrderedDict[str, bytes] = OrderedDict()
        self._pool_version: str | None = None
        self._pool_dirty = False  # a dropped batch may have advanced pool nodes unseen
        self._gauges_at = 0.0
        self._record = record.open("a", buffering=1) if record else None
        self._thread = threading.Thread(target=self._run, name="live-eval", daemon=True)
        self._thread.start()

    @classmethod
    def from_settings(cls, settings: Settings) -> LiveEvaluator | None:
        if settings.live_eval_rate <= 0:
            return None
        return cls(
            settings.live_eval_rate,
            settings.live_eval_negatives,
            settings.live_eval_window,
            settings.live_eval_seed,
            settings.live_eval_pool,
            settings.live_eval_queue,
            settings.live_eval_record,
            settings.live_eval_cpu_budget,
        )

    # ----- request path ----------------------------------------------------------------
    @contextmanager
    def watch(self, rt: ModelRuntime, events: list[LoggedEvent], advance: Advance) -> Iterator[Any]:
        """Around one apply: yields the ``advance`` callback to give the applier (which
        calls ``advance``); after a successful apply, hands the batch to the background
        thread."""
        batch = AppliedBatch(rt, events, advance)
        try:
            yield batch.advance
        except Exception as exc:
            reason = "batch_store_error" if isinstance(exc, StoreUnavailable) else "batch_failed"
            m.LIVE_SKIPPED.labels(reason=reason).inc()
            # Part of the batch may be written, and the re-drive (which is not watched)
            # writes the rest: the pool's blobs of those nodes would be stale.
            self._pool_dirty = True
            raise
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._pool_dirty = True
            m.LIVE_SKIPPED.labels(reason="batch_backlog").inc()

    # ----- background ------------------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        if self._record is not None:
            self._record.close()

    def drain(self, timeout: float = 30.0) -> None:
        """Wait until every handed-over batch is evaluated (for tests and shutdown)."""
        done = threading.Event()
        self._queue.put(done, timeout=timeout)
        done.wait(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._process(item)
            except Exception:
                # Never let the thread die: count the batch and carry on.
                m.LIVE_SKIPPED.labels(reason="batch_error").inc()
                self._pool.clear()
                log.warning("live evaluation of a batch failed", exc_info=True)

    def _process(self, batch: AppliedBatch) -> None:
        rt = batch.rt
        if self._pool_dirty or self._pool_version != rt.version:
            self._pool.clear()  # blobs of another model version, or possibly stale
            self._pool_dirty, self._pool_version = False, rt.version
        ref = reference_ap(rt.checkpoint.metrics)
        if ref is not None:
            m.REFERENCE_AP.set(ref)
        events = one_copy_per_event(batch.events)
        seqs = np.fromiter((e.seq for e in events), dtype=np.int64, count=len(events))
        chosen = np.flatnonzero(sampled(seqs, self.seed, self.rate)).tolist()
        if chosen and not self.budget.allows():
            m.LIVE_SKIPPED.labels(reason="cpu_budget").inc(len(chosen))
        elif chosen:
            with self.budget.spending():
                self._evaluate(rt, [events[i] for i in chosen], batch.before())
        self._remember_destinations(batch)

    def _remember_destinations(self, batch: AppliedBatch) -> None:
        """Newest blobs of this batch's destinations (now the most recently active),
        and of every pooled node the batch advanced in another role (a destination that
        later only sends must not be scored from its older state)."""
        dsts = {e.dst for e in batch.events}
        pool = self._pool
        for _, _, _, out in batch.calls:
            for node, blob in out.items():
                if node in dsts:
                    pool[node] = blob
                    pool.move_to_end(node)
                elif node in pool:
                    pool[node] = blob
        while len(self._pool) > self.pool_size:
            self._pool.popitem(last=False)

    def _snapshot(
        self, node: str, t: float, before: dict[str, Applied], pooled: bool
    ) -> Snapshot | None:
        """The node's state after its events earlier than t and none at or after t, or
        None when what this process holds cannot give it."""
        if node in before:
            blob, events, after = before[node]
            if blob is not None and read_watermark(blob)[0] >= t:
                return None
            if events and events[-1].t < t:
                return after, []  # all of the batch's events come first: the blob after it
            return blob, [e for e in events if e.t < t]
        if pooled and node in self._pool:
            blob = self._pool[node]
            return (blob, []) if read_watermark(blob)[0] < t else None
        return None

    def _newest_neighbour_rows(
        self,
        rt: ModelRuntime,
        rows: list[tuple[str, Snapshot]],
        t: float,
        before: dict[str, Applied],
    ) -> tuple[list[int | None], list[tuple[str, Snapshot]]] | None:
        """For a model that reads each node's newest neighbour's record at the query
        (``latest_transition_at_query``): per row, the index among the extra rows of
        its newest neighbour as of just before t (None: it has none), and those extra
        rows; None when one of them is not in hand with exact visibility."""
        links: list[int | None] = []
        extra: list[tuple[str, Snapshot]] = []
        at: dict[str, int] = {}
        for name, (blob, events) in rows:
            if events:
                newest = other_endpoint(events[-1], name)
            else:
                newest = rt.codec.newest_ids([blob])[0]
            if not newest:
                links.append(None)
                continue
            if newest not in at:
                snap = self._snapshot(newest, t, before, pooled=True)
                if snap is None:
                    return None
                at[newest] = len(extra)
                extra.append((newest, snap))
            links.append(at[newest])
        return links, extra

    def _draw_negatives(
        self, event: LoggedEvent, before: dict[str, Applied], candidates: list[str]
    ) -> list[tuple[str, Snapshot]] | None:
        rng = np.random.default_rng([self.seed, event.seq])
        picks = rng.choice(len(candidates), size=min(len(candidates), 4 * self.k), replace=False)
        out: list[tuple[str, Snapshot]] = []
        for i in picks.tolist():
            node = candidates[i]
            if node in (event.src, event.dst):
                continue
            snap = self._snapshot(node, event.t, before, pooled=True)
            if snap is not None:
                out.append((node, snap))
                if len(out) == self.k:
                    return out
        return None

    def _evaluate(
        self, rt: ModelRuntime, events: list[LoggedEvent], before: dict[str, Applied]
    ) -> None:
        candidates = list(self._pool)  # destinations known before this batch
        at_query = rt.config.latest_transition_at_query
        names: list[str] = []
        snapshots: list[Snapshot] = []
        newest_rows: list[int | None] = []  # per row, its newest neighbour's row (at_query)
        # event, negatives, first row, rows (with the newest neighbours' after the pairs')
        samples: list[tuple[LoggedEvent, list[str], int, int]] = []
        for e in events:
            _yield_gil()
            ends = [self._snapshot(n, e.t, before, pooled=False) for n in (e.src, e.dst)]
            if ends[0] is None or ends[1] is None:
                m.LIVE_SKIPPED.labels(reason="not_visible").inc()
                continue
            drawn = self._draw_negatives(e, before, candidates) if candidates else None
            if drawn is None:
                m.LIVE_SKIPPED.labels(reason="few_destinations").inc()
                continue
            rows: list[tuple[str, Snapshot]] = [(e.src, ends[0]), (e.dst, ends[1]), *drawn]
            first = len(names)
            links: list[int | None] = [None] * len(rows)
            if at_query:
                newest = self._newest_neighbour_rows(rt, rows, e.t, before)
                if newest is None:
                    m.LIVE_SKIPPED.labels(reason="counterpart_unknown").inc()
                    continue
                extra_at = first + len(rows)  # the newest neighbours' rows follow the pairs'
                links = [None if j is None else extra_at + j for j in newest[0]]
                links += [None] * len(newest[1])
                rows += newest[1]
            samples.append((e, [n for n, _ in drawn], first, len(rows)))
            names += [n for n, _ in rows]
            snapshots += [snap for _, snap in rows]
            newest_rows += links
        if not samples:
            return
        _yield_gil()
        states, lists, unknown = states_before(rt, names, snapshots, before)
        if at_query:
            with_latest_at_query(rt, lists, newest_rows)
        _yield_gil()
        if unknown:  # transition counts not in hand for a row: not an exact score
            exact = [s for s in samples if not unknown & set(range(s[2], s[2] + s[3]))]
            m.LIVE_SKIPPED.labels(reason="counterpart_unknown").inc(len(samples) - len(exact))
            samples = exact
            if not samples:
                return
        iu, iv, tau = [], [], []
        for e, negs, row, _ in samples:
            for j in range(1 + len(negs)):
                iu.append(row)
                iv.append(row + 1 + j)
                tau.append(e.t)
        logits = score_rows(rt, names, states, lists, iu, iv, tau)
        _yield_gil()
        pos_p, neg_p = [], []
        at = 0
        for e, negs, _, _ in samples:
            pos, neg = float(logits[at]), logits[at + 1 : at + 1 + len(negs)]
            at += 1 + len(negs)
            self.quality.add(pos, neg)
            pos_p.append(pos)
            neg_p += neg.tolist()
            if self._record is not None:
                self._record.write(
                    json.dumps(
                        {
                            "seq": e.seq,
                            "event_id": e.event_id,
                            "src": e.src,
                            "dst": e.dst,
                            "t": e.t,
                            "logit": pos,
                            "negatives": [
                                {"dst": n, "logit": float(x)}
                                for n, x in zip(negs, neg.tolist(), strict=True)
                            ],
                        }
                    )
                    + "\n"
                )
        for p in _sigmoid(np.array(pos_p)).tolist():
            m.LIVE_SCORE.labels(label="positive").observe(p)
        for p in _sigmoid(np.array(neg_p)).tolist():
            m.LIVE_SCORE.labels(label="negative").observe(p)
        # The window's AP/AUC/MRR (a sort of N x (K + 1) scores) once the evaluator has
        # caught up, or once a second while it is behind: not after every batch.
        now = time.monotonic()
        if self._queue.empty() or now - self._gauges_at >= GAUGE_INTERVAL_S:
            self._gauges_at = now
            q = self.quality.quality()
            m.LIVE_AP.set(q.ap)
            m.LIVE_AUC.set(q.auc)
            m.LIVE_MRR.set(q.mrr)
            m.LIVE_WINDOW.set(q.samples)
        # Counted last: a reader that sees the count and an idle evaluator sees the
        # gauges that include it.
        m.LIVE_SAMPLES.inc(len(samples))


def _yield_gil() -> None:
    """Let the event loop's thread run now. This thread's Python stretches hold the GIL
    up to the switch interval (5 ms) while a request waits for it; short stretches
    between yields keep the evaluation out of the GET latency tail."""
    time.sleep(0)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def reference_ap(metrics: dict[str, Any]) -> float | None:
    """The checkpoint's test AP (transductive, random negatives) from its metrics.json."""
    try:
        return float(metrics["evaluation"]["test"]["transductive"]["random"]["ap"])
    except (KeyError, TypeError, ValueError):
        return None
