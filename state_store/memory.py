"""The embedded in-process store: the default when no Redis URL is given.

For demos and development: one process only (``serve`` refuses several workers with
it), nothing persists. It follows the Redis backend rule for rule (dedupe window,
late and future refusal, per-node history cap, pending set, log trimming, state TTL)
so the shared test suite runs unchanged against both. TTLs expire lazily on a
monotonic clock. One lock guards everything, so every method is atomic, like one
Lua script or one pipeline on Redis.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections import OrderedDict, deque

from .base import AppendResult, LoggedEvent, NewEvent, StateStore, StoreMemory, WriteOutcome
from .blob_header import HEADER_SIZE, pack_watermark, watermark_bytes
from .common import (
    event_ids,
    event_time,
    future_reason,
    late_reason,
    other_endpoint,
    two_entries_before,
)
from .config import MemoryStoreConfig
from .versions import ServingModel, ServingState, VersionMarks


class InMemoryStore(StateStore):
    backend = "memory"
    partitions = 1  # one process, one log: nothing to spread

    def partition_of(self, node: str) -> int:
        return 0

    def claim_layout(self) -> None:
        """Nothing to record: the embedded store lives and dies with its process."""

    def __init__(self, config: MemoryStoreConfig | None = None, **options: object) -> None:
        if config is None:
            config = MemoryStoreConfig.model_validate(options)
        elif options:
            config = MemoryStoreConfig(**{**config.model_dump(), **options})
        self.config = config
        self._lock = threading.Lock()
        self._clock = time.monotonic
        self._states: dict[tuple[str, str], tuple[bytes, float | None]] = {}
        self._seq = 0
        self._log: OrderedDict[int, LoggedEvent] = OrderedDict()
        self._pending: dict[int, LoggedEvent] = {}
        self._histories: dict[str, deque[LoggedEvent]] = {}
        self._last_t: dict[str, float] = {}
        self._latest: float | None = None
        self._seen: dict[str, float | None] = {}  # event id -> expiry (None = forever)
        self._seen_order: deque[tuple[float, str]] = deque()  # (expiry, id), expiry order
        self._serving: ServingModel | None = None
        self._marks = VersionMarks()
        self._closed = False

    @property
    def history_cap(self) -> int:
        return self.config.history_cap

    # ---- state blobs -----------------------------------------------------------------
    def _get(self, key: tuple[str, str], now: float) -> bytes | None:
        item = self._states.get(key)
        if item is None:
            return None
        blob, expiry = item
        if expiry is not None and expiry <= now:
            del self._states[key]
            return None
        return blob

    def read_states(self, version: str, nodes: list[str]) -> list[bytes | None]:
        with self._lock:
            now = self._clock()
            return [self._get((version, n), now) for n in nodes]

    # In process: a read is a few dict lookups (the lock is only ever held for such).
    async_reads = True

    async def read_states_async(self, version: str, nodes: list[str]) -> list[bytes | None]:
        return self.read_states(version, nodes)

    def write_states(
        self, version: str, blobs: dict[str, bytes], expected: dict[str, tuple[float, int] | None]
    ) -> WriteOutcome:
        written, conflicts = [], []
        ttl = self.config.state_ttl_s
        with self._lock:
            now = self._clock()
            for node, blob in blobs.items():
                cur = self._get((version, node), now)
                exp = expected.get(node)
                if exp is None:
                    ok = cur is None
                else:
                    ok = (
                        cur is not None
                        and len(cur) >= HEADER_SIZE
                        and watermark_bytes(cur) == pack_watermark(exp)
                    )
                if ok:
                    self._states[(version, node)] = (
                        bytes(blob),
                        None if ttl is None else now + ttl,
                    )
                    written.append(node)
                else:
                    conflicts.append(node)
        return WriteOutcome(written, conflicts)

    def delete_states(self, version: str, nodes: list[str]) -> int:
        with self._lock:
            now = self._clock()
            n = 0
            for node in set(nodes):
                if self._get((version, node), now) is not None:
                    del self._states[(version, node)]
                    n += 1
            return n

    # ---- event log ---------------------------------------------------------------------
    def _expire_ids(self, now: float) -> None:
        order = self._seen_order
        while order and order[0][0] <= now:
            expiry, eid = order.popleft()
            if self._seen.get(eid) == expiry:
                del self._seen[eid]

    def append_events(self, events: list[NewEvent]) -> AppendResult:
        prepared = [
            (ev, event_time(ev.t), eid) for ev, eid in zip(events, event_ids(events), strict=True)
        ]  # may raise: nothing changed
        cfg = self.config
        result = AppendResult(seqs=[None] * len(events), event_ids=[eid for _, _, eid in prepared])
        with self._lock:
            now = self._clock()
            self._expire_ids(now)
            for i, (ev, t, eid) in enumerate(prepared):
                if eid in self._seen:
                    result.duplicates.append(i)
                    continue
                late = None
                for node in (ev.src, ev.dst) if ev.src != ev.dst else (ev.src,):
                    last = self._last_t.get(node)
                    if last is not None and t < last:
                        late = late_reason(t, last, node)
                        break
                if late is not None:
                    result.late.append((i, late))
                    continue
                skew = cfg.max_future_skew
                if skew is not None and self._latest is not None and t > self._latest + skew:
                    result.late.append((i, future_reason(t, self._latest, skew)))
                    continue
                self._seq += 1
                e = LoggedEvent(
                    self._seq, ev.src, ev.dst, t, tuple(float(x) for x in ev.features), eid
                )
                self._log[e.seq] = e
                self._pending[e.seq] = e
                for node in (ev.src, ev.dst) if ev.src != ev.dst else (ev.src,):
                    h = self._histories.get(node)
                    if h is None:
                        h = self._histories[node] = deque(maxlen=cfg.history_cap)
                    if node not in result.previous_seq:
                        result.previous_seq[node] = h[-1].seq if h else -1
                    h.append(e)
                    self._last_t[node] = t
                if self._latest is None or t > self._latest:
                    self._latest = t
                if ev.event_id is None:
                    pass  # an assigned id: never resent, nothing to remember
                elif cfg.dedupe_ttl_s is None:
                    self._seen[eid] = None
                else:
                    expiry = now + cfg.dedupe_ttl_s
                    self._seen[eid] = expiry
                    self._seen_order.append((expiry, eid))
                result.seqs[i] = e.seq
        return result

    def read_histories(
        self, nodes: list[str], after_seq: list[int] | None = None, limit: int | None = None
    ) -> list[list[LoggedEvent]]:
        out = []
        with self._lock:
            for i, node in enumerate(nodes):
                h = self._histories.get(node, ())
                after = -1 if after_seq is None else after_seq[i]
                evs = [e for e in h if e.seq > after]
                if limit is not None:
                    evs = evs[-limit:] if limit > 0 else []
                out.append(evs)
        return out

    def neighbours_before(self, nodes: list[str], events: list[LoggedEvent]) -> list[str | None]:
        out: list[str | None] = []
        with self._lock:
            for node, event in zip(nodes, events, strict=True):
                h = self._histories.get(node, ())
                at = bisect.bisect_left(h, event.seq, key=lambda e: e.seq) - 1
                out.append(None if at < 0 else other_endpoint(h[at], node))
        return out

    def two_neighbours_before(
        self, nodes: list[str], events: list[LoggedEvent]
    ) -> list[tuple[str | None, str | None]]:
        out = []
        with self._lock:
            for node, event in zip(nodes, events, strict=True):
                h = self._histories.get(node, ())
                at = bisect.bisect_left(h, event.seq, key=lambda e: e.seq)
                out.append(
                    two_entries_before(node, [h[k] for k in range(at - 1, max(at - 3, -1), -1)])
                )
        return out

    def read_log(self, after_seq: int, count: int) -> list[LoggedEvent]:
        out: list[LoggedEvent] = []
        if count <= 0:
            return out
        with self._lock:
            for seq, e in self._log.items():  # ascending seq
                if seq > after_seq:
                    out.append(e)
                    if len(out) >= count:
                        break
        return out

    def pending(self, limit: int, after_seq: int | None = None) -> list[LoggedEvent]:
        with self._lock:
            after = -1 if after_seq is None else int(after_seq)
            later = (e for s, e in self._pending.items() if s > after)  # insertion = seq order
            return list(itertools.islice(later, max(limit, 0)))

    def mark_applied(self, seqs: list[int], version: str | None = None) -> None:
        with self._lock:
            for s in seqs:
                self._pending.pop(int(s), None)
            if version is not None and seqs:
                self._marks = self._marks.with_mark(version, max(int(s) for s in seqs))
            # Trim the log below the lowest pending seq, keeping at least log_keep entries.
            bound = min(self._pending) if self._pending else self._seq + 1
            bound = min(bound, self._seq - self.config.log_keep + 1)
            while self._log:
                first = next(iter(self._log))
                if first >= bound:
                    break
                del self._log[first]

    def last_event_time(self) -> float | None:
        with self._lock:
            return self._latest

    # ---- the serving version -----------------------------------------------------------
    def read_serving(self) -> ServingState:
        with self._lock:
            return ServingState(self._serving, self._marks)

    def publish_serving(self, model: ServingModel, only_if_absent: bool = False) -> ServingModel:
        with self._lock:
            if self._serving is None or not only_if_absent:
                self._serving = model
            return self._serving

    # ---- housekeeping --------------------------------------------------------------------
    def ping(self) -> bool:
        return not self._closed

    async def aclose(self) -> None:
        """Nothing to release: reads never left the process."""

    def memory(self) -> StoreMemory | None:
        return None  # in-process: the service's own memory metrics cover it

    def close(self) -> None:
        self._closed = True
