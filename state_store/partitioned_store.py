"""The partitioned log on Redis (``partitions`` = P > 1): the log, histories, late-check
times, dedupe ids and pending entries of a node live in its partition, one hash tag
per partition, so they spread over a cluster's masters (state blobs shard by node as
before). Protocol and failure cases: docs/STATE_STORE.md, "Partitioned log".

Key layout per partition ``i`` (tag ``T_i``, chosen so that the P tags fall in P
equal ranges of the 16,384 slots: on a cluster with contiguous slot ranges per
master, each master gets its share of partitions)::

    K:{T_i}:c          counter c; seqs of the partition are c * P + i
    K:{T_i}:log        log list (element k = counter log_first + k; "x" = aborted copy)
    K:{T_i}:log_first  counter of the log's first element
    K:{T_i}:pending    logged, not yet applied copies (score seq)
    K:{T_i}:lt         node -> time of its last logged event
    K:{T_i}:tmax       latest logged time in the partition
    K:{T_i}:eids       remembered ids (score expiry ms)
    K:{T_i}:doubt      id -> "nonce seq ms other-partition node": copies in doubt
    K:{T_i}:fence      "id|nonce" of attempts decided aborted (score expiry ms)
    K:{T_i}:vmarks     version -> highest seq of this partition it marked applied
    K:{T_i}:h:<node>   the node's history (score seq)
    K:meta             hash: partitions (state_store.layout)

An event is *logged* as one copy in each endpoint's partition (once when both share
one). ``AppendResult.seqs[i]`` is the copy in the source's partition and
``AppendResult.other_seqs[i]`` the one in the destination's; the applier applies a
node only from the copies in its own partition (``seq % P``).
"""

from __future__ import annotations

import hashlib
import heapq
import os
import time
import zlib
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot

from .append_script import APPEND_PART_LUA, header_args, outcome, previous_seqs, refusal_reason
from .base import AppendResult, HeldByDoubt, LoggedEvent, NewEvent, StoreUnavailable
from .common import (
    decode_event,
    encode_tail,
    event_ids,
    event_time,
)
from .faults import BEFORE_COMMIT, BETWEEN_PARTITION_APPENDS, fault_active, maybe_crash
from .layout import claim_partitions
from .partition_scripts import DECIDE_LUA, FINISH_LUA, PREVIOUS_LUA, READ_COMMITTED_LUA
from .redis_store import RedisStore, _guard, _ms
from .versions import ServingModel, ServingState, VersionMarks

SLOTS = 16384


def partition_tag(prefix: str, i: int, partitions: int) -> str:
    """A hash tag for partition ``i`` whose slot lies in the i-th of ``partitions``
    equal slot ranges (the first such ``<prefix>:p<i>.<k>``)."""
    lo, hi = i * SLOTS // partitions, (i + 1) * SLOTS // partitions
    for k in range(1_000_000):
        tag = f"{prefix}:p{i}.{k}"
        if lo <= key_slot(tag.encode()) < hi:
            return tag
    raise RuntimeError(f"no hash tag found for partition {i}")  # pragma: no cover


@dataclass(frozen=True)
class PartitionKeys:
    counter: bytes
    log: bytes
    log_first: bytes
    pending: bytes
    lt: bytes
    tmax: bytes
    eids: bytes
    doubt: bytes
    fence: bytes
    vmarks: bytes
    history: bytes  # prefix; + node

    @classmethod
    def of(cls, prefix: str, tag: str) -> PartitionKeys:
        b = f"{prefix}:{{{tag}}}:"

        def k(name: str) -> bytes:
            return f"{b}{name}".encode()

        return cls(
            counter=k("c"),
            log=k("log"),
            log_first=k("log_first"),
            pending=k("pending"),
            lt=k("lt"),
            tmax=k("tmax"),
            eids=k("eids"),
            doubt=k("doubt"),
            fence=k("fence"),
            vmarks=k("vmarks"),
            history=k("h:"),
        )


@dataclass(frozen=True)
class InDoubt:
    """A copy in doubt: what the resolver needs to decide it."""

    partition: int
    event_id: str
    nonce: str
    node: str  # its endpoint in this partition
    other: int  # the other copy's partition


class PartitionedRedisStore(RedisStore):
    """``RedisStore`` with the log split into ``config.partitions`` partitions."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.partitions = self.config.partition_count
        prefix = self.config.key_prefix
        self._parts = [
            PartitionKeys.of(prefix, partition_tag(prefix, i, self.partitions))
            for i in range(self.partitions)
        ]
        self._scripts.update(
            {
                "append_part": APPEND_PART_LUA,
                "decide": DECIDE_LUA,
                "finish": FINISH_LUA,
                "read_committed": READ_COMMITTED_LUA,
                "previous": PREVIOUS_LUA,
            }
        )
        self._sha = {k: hashlib.sha1(v.encode()).hexdigest() for k, v in self._scripts.items()}
        self._layout_checked = False

    # ---- partitions ------------------------------------------------------------------
    def partition_of(self, node: str) -> int:
        # crc32 of the id: the same in every process (Python's hash() is salted)
        return zlib.crc32(node.encode()) % self.partitions

    def history_key(self, node: str) -> bytes:
        return self._parts[self.partition_of(node)].history + node.encode()

    def _by_partition(self, nodes: list[str]) -> dict[int, list[int]]:
        """The positions of ``nodes``, grouped by their partitions."""
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(nodes):
            groups.setdefault(self.partition_of(n), []).append(i)
        return groups

    def _doubt_and_histories(self, p: int, nodes: list[str]) -> list[bytes]:
        """The keys of a script that reads histories of partition ``p`` beside its doubt."""
        k = self._parts[p]
        return [k.doubt] + [k.history + n.encode() for n in nodes]

    def _entries_before(
        self, nodes: list[str], events: list[LoggedEvent], count: int
    ) -> list[list[bytes]]:
        """Each node's latest ``count`` (1 or 2) committed history members before
        ``events[i]``, newest first; ``HeldByDoubt`` while one of them is in doubt
        (what ``neighbours_before`` and ``two_neighbours_before`` read here)."""
        # Each partition numbers its own copies: the other endpoint's copy of an event
        # says nothing by its seq about where the event sits in this node's history, so
        # the node's own copy is found by the event's time and id (PREVIOUS_LUA).
        if not nodes:
            return []
        P = self.partitions
        by_seq, by_id = ("s", "i") if count == 1 else ("S", "I")
        groups = self._by_partition(nodes)
        calls = []
        for p, idx in groups.items():
            args: list[Any] = []
            for i in idx:
                e = events[i]
                args += [by_seq, e.seq, ""] if e.seq % P == p else [by_id, repr(e.t), e.event_id]
            calls.append(("previous", self._doubt_and_histories(p, [nodes[i] for i in idx]), args))
        out: list[list[bytes]] = [[] for _ in nodes]
        held: list[str] = []
        for idx, res in zip(groups.values(), self._part_call(calls), strict=True):
            for i, (status, *members) in zip(idx, res, strict=True):
                if int(status) == 2:
                    held.append(nodes[i])
                elif int(status) == 1:
                    out[i] = list(members)
        if held:
            raise HeldByDoubt(held)
        return out

    @_guard
    def claim_layout(self) -> None:
        claim_partitions(self._r, self.config.key_prefix, self.partitions, self._k_seq)
        self._layout_checked = True

    def _check_layout(self) -> None:
        # A replica that started while the store was down checks on first use.
        if not self._layout_checked:
            self.claim_layout()

    def _part_call(self, calls: list[tuple[str, list[bytes], list[Any]]]) -> list[Any]:
        """Several scripts (name, keys, args) in one pipeline; each within one slot."""
        by_name: dict[str, list[int]] = {}
        for i, (name, _, _) in enumerate(calls):
            by_name.setdefault(name, []).append(i)
        out: list[Any] = [None] * len(calls)
        # one pipeline per script name keeps _eval_many's NOSCRIPT handling; callers
        # pass one name per call in practice
        for name, idx in by_name.items():
            res = self._eval_many(name, [(calls[i][1], calls[i][2]) for i in idx])
            for i, r in zip(idx, res, strict=True):
                out[i] = r
        return out

    # ---- appending -------------------------------------------------------------------
    def _append_call(
        self,
        p: int,
        rows: list[int],
        events: list[NewEvent],
        eids: list[str],
        times: list[float],
        parts: list[tuple[int, int]],
        nonce: str,
    ) -> tuple[list[bytes], list[Any]]:
        cfg, k = self.config, self._parts[p]
        number: dict[str, int] = {}
        for i in rows:
            ev = events[i]
            if parts[i][0] == p:
                number.setdefault(ev.src, len(number) + 1)
            if parts[i][1] == p:
                number.setdefault(ev.dst, len(number) + 1)
        keys = [k.counter, k.log, k.pending, k.lt, k.tmax, k.eids, k.doubt, k.fence]
        keys += [k.history + n.encode() for n in number]
        args = header_args(
            len(rows), number, _ms(cfg.dedupe_ttl_s), cfg.history_cap, cfg.max_future_skew
        )
        args += [self.partitions, p, nonce, *number]
        for i in rows:
            ev, (ps, pd) = events[i], parts[i]
            cross = ps != pd
            args += [
                number[ev.src] if ps == p else 0,
                number[ev.dst] if pd == p else 0,
                repr(times[i]),
                encode_tail(ev, times[i], eids[i]),
                eids[i] if (cross or ev.event_id is not None) else "",
                str(pd if ps == p else ps) if cross else "",
            ]
        return keys, args

    @_guard
    def append_events(self, events: list[NewEvent]) -> AppendResult:
        if not events:
            return AppendResult(seqs=[])
        self._check_layout()
        times = [event_time(ev.t) for ev in events]  # a non-finite t: nothing changes
        eids = event_ids(events)
        nonce = os.urandom(8).hex()  # this attempt; a retry is another attempt
        parts = [(self.partition_of(ev.src), self.partition_of(ev.dst)) for ev in events]
        rows: dict[int, list[int]] = {}
        for i, (ps, pd) in enumerate(parts):
            rows.setdefault(ps, []).append(i)
            if pd != ps:
                rows.setdefault(pd, []).append(i)
        answers: dict[int, dict[int, Any]] = {}
        previous: dict[str, int] = {}
        todo = sorted(rows)
        for _ in range(3):
            calls = [
                ("append_part", *self._append_call(p, rows[p], events, eids, times, parts, nonce))
                for p in todo
            ]
            if fault_active(BETWEEN_PARTITION_APPENDS) and any(
                parts[i][0] != parts[i][1] for i in rows[todo[0]]
            ):
                self._part_call(calls[:1])  # crash test: only the first partition's copies land
                maybe_crash(BETWEEN_PARTITION_APPENDS)
            outs = self._part_call(calls)
            blocked: list[InDoubt] = []
            retry = []
            for p, out in zip(todo, outs, strict=True):
                if isinstance(out[0], int) and out[0] == -9:  # ids in doubt from another attempt
                    retry.append(p)
                    ids = {x.decode() for x in out[1]}
                    blocked += self._doubts_of(p, ids)
                    continue
                previous.update(previous_seqs(out.pop()))
                answers[p] = dict(zip(rows[p], out, strict=True))
            if not retry:
                break
            # A retry met copies of an earlier attempt in doubt: decide them now (commit
            # if both copies exist, else fence and abort), then log in those partitions.
            self._settle(blocked)
            todo = retry
        else:
            # Ids kept reappearing in doubt (concurrent retries of one batch): take back
            # the copies this attempt logged, so they hold no node until the resolver.
            aborts: dict[int, list[tuple[str, str]]] = {}
            for p, got in answers.items():
                for i, r in got.items():
                    ps, pd = parts[i]
                    if ps != pd and outcome(r)[0] == "seq":
                        node = events[i].src if p == ps else events[i].dst
                        aborts.setdefault(p, []).append((eids[i], node))
            if aborts:
                self._finish({}, aborts, nonce)
            raise StoreUnavailable("event ids stay in doubt; retry", reason="conflict")
        return self._combine(events, eids, times, parts, nonce, answers, previous)

    def _combine(
        self,
        events: list[NewEvent],
        eids: list[str],
        times: list[float],
        parts: list[tuple[int, int]],
        nonce: str,
        answers: dict[int, dict[int, Any]],
        previous: dict[str, int],
    ) -> AppendResult:
        cfg = self.config
        result = AppendResult(seqs=[None] * len(events), event_ids=eids, previous_seq=previous)
        commits: dict[int, list[str]] = {}
        aborts: dict[int, list[tuple[str, str]]] = {}
        fenced = 0

        def refuse(i: int, kind: str, raw: Any) -> None:
            if kind == "dup":
                result.duplicates.append(i)
            else:
                result.late.append((i, refusal_reason(kind, raw, times[i], cfg.max_future_skew)))

        for i, (ps, pd) in enumerate(parts):
            a = outcome(answers[ps][i])
            if ps == pd:
                if a[0] == "seq":
                    result.seqs[i] = a[1]
                else:
                    refuse(i, a[0], a[1])
                continue
            b = outcome(answers[pd][i])
            if a[0] == "seq" and b[0] == "seq":
                result.seqs[i] = a[1]
                result.other_seqs[i] = b[1]
                commits.setdefault(ps, []).append(eids[i])
                commits.setdefault(pd, []).append(eids[i])
                continue
            # one side (or both) refused: the copy that landed must go
            if a[0] == "seq":
                aborts.setdefault(ps, []).append((eids[i], events[i].src))
            if b[0] == "seq":
                aborts.setdefault(pd, []).append((eids[i], events[i].dst))
            kinds = {a[0], b[0]}
            if "fenced" in kinds:
                fenced += 1
            elif "dup" in kinds:
                refuse(i, "dup", None)
            else:
                first = a if a[0] != "seq" else b
                refuse(i, first[0], first[1])
        if commits or aborts:
            maybe_crash(BEFORE_COMMIT)
            self._finish(commits, aborts, nonce)
        if fenced:
            raise StoreUnavailable(
                f"{fenced} event(s) of this request were decided aborted while this replica "
                "stalled (their other copies are logged or removed); retry",
                reason="conflict",
            )
        return result

    def _finish(
        self, commits: dict[int, list[str]], aborts: dict[int, list[tuple[str, str]]], nonce: str
    ) -> list[Any]:
        """Commit and abort copies of one attempt, one script per partition, one pipeline."""
        calls = []
        for p in sorted(set(commits) | set(aborts)):
            calls.append(
                self._finish_call(
                    p,
                    [(e, nonce) for e in commits.get(p, [])],
                    [(e, nonce, n) for e, n in aborts.get(p, [])],
                )
            )
        results = self._part_call(calls)
        lost = sum(
            1
            for p, r in zip(sorted(set(commits) | set(aborts)), results, strict=True)
            for x in r[: len(commits.get(p, []))]
            if int(x) != 1
        )
        if lost:  # pragma: no cover - both copies existed, so no one could abort them
            raise RuntimeError(f"{lost} commit(s) found their copy neither in doubt nor committed")
        return results

    def _finish_call(
        self, p: int, commits: list[tuple[str, str]], aborts: list[tuple[str, str, str]]
    ) -> tuple[str, list[bytes], list[Any]]:
        k = self._parts[p]
        keys = [k.doubt, k.eids, k.pending, k.lt, k.log, k.log_first]
        args: list[Any] = [_ms(self.config.dedupe_ttl_s), self.partitions, len(commits)]
        for eid, nonce in commits:
            args += [eid, nonce]
        hist: dict[str, int] = {}
        for eid, nonce, node in aborts:
            if node not in hist:
                hist[node] = len(hist) + 1
                keys.append(k.history + node.encode())
            args += [eid, nonce, hist[node], node]
        return ("finish", keys, args)

    # ---- deciding copies in doubt ----------------------------------------------------
    def _doubts_of(
        self, p: int, ids: set[str] | None = None, older_than_ms: int | None = None
    ) -> list[InDoubt]:
        raw = self._r.execute_command("HGETALL", self._parts[p].doubt)
        return self._parse_doubts(p, raw, ids, older_than_ms)

    @staticmethod
    def _parse_doubts(
        p: int, raw: Any, ids: set[str] | None, older_than_ms: int | None
    ) -> list[InDoubt]:
        if isinstance(raw, list):
            raw = dict(zip(raw[::2], raw[1::2], strict=True))
        now_ms = int(time.time() * 1000)
        out = []
        for eid_b, v in raw.items():
            eid = eid_b.decode()
            if ids is not None and eid not in ids:
                continue
            nonce, _seq, ms, other, node = v.decode().split(" ", 4)
            # the age is by this host's clock against the Redis server's: a resolver on a
            # host whose clock runs ahead decides a little early, which the fence makes safe
            if older_than_ms is not None and now_ms - int(ms) < older_than_ms:
                continue
            out.append(InDoubt(p, eid, nonce, node, int(other)))
        return out

    def _settle(self, doubts: list[InDoubt]) -> tuple[int, int]:
        """Decide copies in doubt: the other partition says whether the same attempt's
        copy is there (committed) or fences it (aborted); then this side follows.
        Returns (committed, aborted)."""
        if not doubts:
            return (0, 0)
        by_other: dict[int, list[InDoubt]] = {}
        for d in doubts:
            by_other.setdefault(d.other, []).append(d)
        calls = []
        for q, ds in by_other.items():
            k = self._parts[q]
            args: list[Any] = [_ms(self.config.dedupe_ttl_s)]
            for d in ds:
                args += [d.event_id, d.nonce]
            calls.append(("decide", [k.doubt, k.eids, k.fence], args))
        decided = self._part_call(calls)
        commits: dict[int, list[tuple[str, str]]] = {}
        aborts: dict[int, list[tuple[str, str, str]]] = {}
        for ds, res in zip(by_other.values(), decided, strict=True):
            for d, r in zip(ds, res, strict=True):
                if int(r) == 1:
                    commits.setdefault(d.partition, []).append((d.event_id, d.nonce))
                else:
                    aborts.setdefault(d.partition, []).append((d.event_id, d.nonce, d.node))
        finish = [
            self._finish_call(p, commits.get(p, []), aborts.get(p, []))
            for p in sorted(set(commits) | set(aborts))
        ]
        self._part_call(finish)
        return (sum(map(len, commits.values())), sum(map(len, aborts.values())))

    @_guard
    def resolve_doubts(self, older_than_s: float | None = None) -> tuple[int, int]:
        """Decide every copy in doubt for longer than ``older_than_s`` (default: the
        configured ``doubt_timeout_s``): the re-drive's resolver. (committed, aborted)."""
        age = self.config.doubt_timeout_s if older_than_s is None else older_than_s
        pipe = self._pipe()  # every partition's doubt set in one round trip per master
        for k in self._parts:
            pipe.execute_command("HGETALL", k.doubt)
        doubts = []
        for p, raw in enumerate(pipe.execute()):
            doubts += self._parse_doubts(p, raw, None, int(age * 1000))
        return self._settle(doubts)

    # ---- reading ---------------------------------------------------------------------
    @_guard
    def read_committed(
        self, nodes: list[str], after_seq: list[int]
    ) -> tuple[list[list[LoggedEvent]], set[str]]:
        """Each node's history after ``after_seq[i]``, and the nodes held back because
        an entry after their watermark is a copy in doubt (their history comes back
        empty: nothing of theirs may be applied before the doubt is decided)."""
        groups = self._by_partition(nodes)
        calls = []
        for p, idx in groups.items():
            keys = self._doubt_and_histories(p, [nodes[i] for i in idx])
            calls.append(("read_committed", keys, [int(after_seq[i]) for i in idx]))
        results = self._part_call(calls)
        out: list[list[LoggedEvent]] = [[] for _ in nodes]
        held: set[str] = set()
        for idx, res in zip(groups.values(), results, strict=True):
            for i, row in zip(idx, res, strict=True):
                if int(row[0]):
                    held.add(nodes[i])
                else:
                    out[i] = [decode_event(m) for m in row[1:]]
        return out, held

    @_guard
    def read_log(self, after_seq: int, count: int) -> list[LoggedEvent]:
        """Every partition's log after ``after_seq``, merged by seq: an event with
        endpoints in two partitions appears once per copy (aborted copies are left out)."""
        if count <= 0:
            return []
        P = self.partitions
        calls = []
        for p, k in enumerate(self._parts):
            first_c = max(1, (int(after_seq) - p) // P + 1)
            calls.append(("read_log", [k.log, k.log_first], [first_c, int(count)]))
        pages = [[decode_event(m) for m in page if m != b"x"] for page in self._part_call(calls)]
        merged = [e for e in heapq.merge(*pages) if e.seq > after_seq]
        return merged[:count]

    @_guard
    def pending(self, limit: int, after_seq: int | None = None) -> list[LoggedEvent]:
        if limit <= 0:
            return []
        pipe = self._pipe()
        lo = b"-inf" if after_seq is None else b"(%d" % int(after_seq)
        for k in self._parts:
            pipe.execute_command(
                "ZRANGE", k.pending, lo, b"+inf", b"BYSCORE", b"LIMIT", 0, int(limit)
            )
        pages = [[decode_event(m) for m in page] for page in pipe.execute()]
        return list(heapq.merge(*pages))[:limit]

    @_guard
    def mark_applied(self, seqs: list[int], version: str | None = None) -> None:
        P = self.partitions
        runs: dict[int, list[tuple[int, int]]] = {}
        for s in sorted({int(x) for x in seqs}):
            p, c = s % P, s // P
            r = runs.setdefault(p, [])
            if r and c == r[-1][1] + 1:
                r[-1] = (r[-1][0], c)
            else:
                r.append((c, c))
        keep = -(-self.config.log_keep // P)  # each partition keeps its share
        calls = []
        for p, rs in runs.items():
            k = self._parts[p]
            calls.append(
                (
                    "mark",
                    [k.pending, k.log, k.counter, k.log_first, k.vmarks],
                    [
                        keep,
                        version or "",
                        P,
                        p,
                        *(x for lo, hi in rs for x in (lo * P + p, hi * P + p)),
                    ],
                )
            )
        if calls:
            self._part_call(calls)

    @_guard
    def read_serving(self) -> ServingState:
        pipe = self._pipe()
        pipe.execute_command("GET", self._k_serving)
        for k in self._parts:
            pipe.execute_command("HGETALL", k.vmarks)
        raw, *marks = pipe.execute()
        merged = VersionMarks()
        for m in marks:
            if isinstance(m, list):
                m = dict(zip(m[::2], m[1::2], strict=True))
            merged = merged.merged(VersionMarks({v.decode(): int(s) for v, s in m.items()}))
        return ServingState(ServingModel.decode(raw), merged)

    @_guard
    def last_event_time(self) -> float | None:
        pipe = self._pipe()
        for k in self._parts:
            pipe.execute_command("GET", k.tmax)
        times = [float(v) for v in pipe.execute() if v is not None]
        return max(times) if times else None
