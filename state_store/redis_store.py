"""The Redis state store: one server (``redis://``) or Redis Cluster (``redis+cluster://``).

Key layout (``P`` = ``key_prefix``, default ``dygserve``); it works unchanged on a
cluster because every multi-key operation stays inside one hash slot::

    P:{n:<node>}:s:<version>      state blob of one node and model version; hash tag per
                                  node, so states shard across the cluster by node.
                                  The only keys with a TTL (``state_ttl_s``).
    P:{P:log}:seq                 sequence counter (INCR)
    P:{P:log}:log                 the global log: a list, element i holds seq log_first + i
    P:{P:log}:log_first           seq of the log's first element (absent: 1)
    P:{P:log}:eids                event ids seen: sorted set, score = expiry (ms, server
                                  clock) of the dedupe window, trimmed on every append
    P:{P:log}:h:<node>            per-node history, sorted set (score seq), capped
    P:{P:log}:lt                  hash node -> time of its last logged event (late check)
    P:{P:log}:tmax                latest logged time (the event-time clock)
    P:{P:log}:pending             sorted set of logged, not yet applied events (score seq)
    P:{P:log}:serving             the serving model version that every worker follows
                                  (JSON ``{"version", "checkpoint"}``, state_store.versions)
    P:{P:log}:vmarks              hash version -> highest seq an applier of that version
                                  marked applied (raised by the mark script)

Everything of the log shares the hash tag ``{P:log}``: appending a batch is ONE Lua
script (dedupe, late and future checks, seq, log RPUSH, both endpoints' history ZADD,
pending ZADD), and a script on a cluster may touch one slot only. The log is
therefore one partition (the scale-out limit; see docs/STATE_STORE.md).

Members of histories, of the pending set and the log's elements are the compact
JSON of ``state_store.common`` (``[seq,"src","dst",t,[features],"id"]``).

Round trips: every method is one command or one pipeline; on a cluster a pipeline
costs one round trip per master it touches (log methods: exactly one).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.exceptions as rex
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from .append_script import (
    APPEND_LUA,
    combine_slices,
    header_args,
    outcome,
    previous_seqs,
    refusal_reason,
)
from .base import (
    AppendResult,
    LoggedEvent,
    NewEvent,
    StateStore,
    StoreMemory,
    StoreUnavailable,
    WriteOutcome,
)
from .blob_header import pack_watermark
from .common import (
    decode_event,
    encode_tail,
    event_ids,
    event_time,
    neighbours_from_members,
    two_neighbours_from_members,
)
from .config import RedisStoreConfig
from .layout import claim_partitions
from .log_scripts import MARK_LUA, READ_LOG_LUA
from .versions import ServingModel, ServingState, VersionMarks

# --------------------------------------------------------------------------------------
# Lua scripts. Every key they touch is in KEYS (cluster routing and correctness). The
# log's scripts are shared with the partitioned log: state_store.append_script (append)
# and state_store.log_scripts (mark, read_log).

# Compare-and-set of state blobs on their watermark (header bytes 32..47: t_last f64,
# last_seq i64, little-endian). The comparison is on the exact 16 bytes (GETRANGE, so
# the blob itself is not copied into Lua), which is the float64/int64 equality that
# struct.unpack('<d', blob, 33) / ('<i8', blob, 41) would test, minus the NaN and
# -0.0 corner cases. One call takes many keys; on a cluster all of one slot.
# KEYS: state keys. ARGV: 1 ttl ms ('' = none); then per key i: expected watermark
#       bytes ('' = the key must be absent), blob. Returns per key 1 written, 0 conflict.
CAS_LUA = """
local ttl = ARGV[1]
local out = {}
for i = 1, #KEYS do
  local exp = ARGV[2 * i]
  local ok
  if exp == '' then
    ok = redis.call('EXISTS', KEYS[i]) == 0
  else
    ok = redis.call('GETRANGE', KEYS[i], 32, 47) == exp
  end
  if ok then
    if ttl == '' then
      redis.call('SET', KEYS[i], ARGV[2 * i + 1])
    else
      redis.call('SET', KEYS[i], ARGV[2 * i + 1], 'PX', ttl)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

# redis-py's classes for conditions with a name, most specific first (BusyLoadingError
# is a ConnectionError, ReadOnlyError and OutOfMemoryError are ResponseErrors).
_ERROR_CLASSES: tuple[tuple[type[BaseException], str], ...] = (
    (rex.BusyLoadingError, "loading"),
    (rex.TimeoutError, "timeout"),
    (rex.ConnectionError, "connection"),
    (rex.OutOfMemoryError, "oom"),
    (rex.ReadOnlyError, "readonly"),
    (rex.MasterDownError, "masterdown"),
    (rex.TryAgainError, "tryagain"),
    (rex.ClusterDownError, "clusterdown"),
    (rex.ClusterError, "clusterdown"),
    (rex.RedisClusterException, "clusterdown"),
)
# Error replies by their first word, for the ones redis-py leaves as a plain
# ResponseError (BUSY, MISCONF) and for errors met inside a Lua script: Redis 7 passes
# the inner error's word through; Redis 6 wraps it as "ERR Error running script ...
# -OOM ...", hence the "-" form.
_ERROR_WORDS = {
    "OOM": "oom",
    "BUSY": "busy",
    "LOADING": "loading",
    "READONLY": "readonly",
    "MASTERDOWN": "masterdown",
    "CLUSTERDOWN": "clusterdown",
    "TRYAGAIN": "tryagain",
    "MISCONF": "misconf",
}
_ERROR_WORD = re.compile(r"(?:^|\s-)(" + "|".join(_ERROR_WORDS) + r")\b")
# What _guard catches (then sorts with store_error_reason; the rest re-raises as is).
_CAUGHT: tuple[type[BaseException], ...] = (rex.RedisError, rex.RedisClusterException)

F = TypeVar("F", bound=Callable[..., Any])


def store_error_reason(e: BaseException) -> str | None:
    """The ``STORE_ERROR_REASONS`` entry of a redis-py error, or None for an error
    without a name (a bug, a wrong argument: those stay 500s)."""
    for cls, reason in _ERROR_CLASSES:
        if isinstance(e, cls):
            return reason
    if isinstance(e, rex.ResponseError):
        m = _ERROR_WORD.search(str(e))
        if m:
            return _ERROR_WORDS[m.group(1)]
    return None


def _unavailable(e: BaseException, reason: str) -> StoreUnavailable:
    return StoreUnavailable(f"{type(e).__name__}: {e}", reason)


def _guard(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except StoreUnavailable:
            raise
        except _CAUGHT as e:
            reason = store_error_reason(e)
            if reason is None:
                raise
            raise _unavailable(e, reason) from e

    return wrapper  # type: ignore[return-value]


def _ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted seqs as inclusive runs: a batch's seqs are mostly one contiguous run."""
    out: list[tuple[int, int]] = []
    for s in sorted({int(x) for x in seqs}):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else str(max(1, int(round(seconds * 1000))))


def _fmt_float(x: float) -> str:
    return repr(float(x))


class RedisStore(StateStore):
    """State store on redis-py (hiredis parser when installed).

    ``connection_class`` (optional, not part of the config) replaces redis-py's
    connection class, e.g. to count real round trips in tests.
    """

    def __init__(
        self,
        config: RedisStoreConfig | None = None,
        *,
        connection_class: type[redis.Connection] | None = None,
        **options: Any,
    ) -> None:
        if config is None:
            config = RedisStoreConfig(**options)
        elif options:
            config = RedisStoreConfig(**{**config.model_dump(), **options})
        self.config = config
        extra: dict[str, Any] = {}
        if connection_class is not None:
            extra["connection_class"] = connection_class
        url = config.url
        scheme = urlsplit(url).scheme.lower()
        try:
            if scheme in ("redis+cluster", "rediss+cluster"):
                self.cluster = True
                self.backend = "redis-cluster"
                self._r: Any = _cluster_from_url(url, config.socket_timeout, **extra)
            elif scheme in ("redis", "rediss", "unix"):
                self.cluster = False
                self.backend = "redis"
                self._r = redis.Redis.from_url(
                    url,
                    socket_timeout=config.socket_timeout,
                    socket_connect_timeout=config.socket_timeout,
                    retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
                    decode_responses=False,
                    **extra,
                )
            else:
                raise ValueError(
                    f"unsupported store URL scheme {scheme!r}: use redis://, rediss://, unix:// or redis+cluster://"
                )
        except _CAUGHT as e:
            reason = store_error_reason(e)
            if reason is None:
                raise
            raise _unavailable(e, reason) from e
        p = config.key_prefix
        self._state_prefix = p
        log = f"{p}:{{{p}:log}}"
        self._k_seq = f"{log}:seq".encode()
        self._k_log = f"{log}:log".encode()
        self._k_log_first = f"{log}:log_first".encode()
        self._k_pending = f"{log}:pending".encode()
        self._k_lt = f"{log}:lt".encode()
        self._k_tmax = f"{log}:tmax".encode()
        self._k_eids = f"{log}:eids".encode()
        self._k_hist = f"{log}:h:".encode()
        self._k_serving = f"{log}:serving".encode()
        self._k_vmarks = f"{log}:vmarks".encode()
        self._scripts = {
            "append": APPEND_LUA,
            "cas": CAS_LUA,
            "mark": MARK_LUA,
            "read_log": READ_LOG_LUA,
        }
        self._sha = {k: hashlib.sha1(v.encode()).hexdigest() for k, v in self._scripts.items()}
        self._loaded = False
        # A single server also serves awaited reads (a cluster client routes by slot
        # and stays blocking-only); its asyncio client is bound to the loop that made it.
        self.async_reads = not self.cluster
        self._async: tuple[asyncio.AbstractEventLoop, Any] | None = None

    partitions = 1  # the single-slot log; state_store.partitioned_store for P > 1

    def partition_of(self, node: str) -> int:
        return 0

    @_guard
    def claim_layout(self) -> None:
        claim_partitions(self._r, self.config.key_prefix, 1, self._k_seq)

    @property
    def history_cap(self) -> int:
        return self.config.history_cap

    # ---- keys ------------------------------------------------------------------------
    def state_key(self, version: str, node: str) -> bytes:
        return f"{self._state_prefix}:{{n:{node}}}:s:{version}".encode()

    def history_key(self, node: str) -> bytes:
        return self._k_hist + node.encode()

    @property
    def client(self) -> Any:
        """The underlying redis-py client (``redis.Redis`` or ``RedisCluster``)."""
        return self._r

    # ---- scripts ---------------------------------------------------------------------
    def load_scripts(self) -> None:
        """SCRIPT LOAD every script (on every master of a cluster). Done lazily on the
        first NOSCRIPT; call it at start-up to keep the first request at one round trip."""
        for name, body in self._scripts.items():
            sha = self._r.script_load(body)
            if sha != self._sha[name]:  # pragma: no cover - sha1 is sha1
                raise RuntimeError("script sha mismatch")
        self._loaded = True

    def _evalsha(self, name: str, keys: list[bytes], args: list[Any]) -> Any:
        try:
            return self._r.evalsha(self._sha[name], len(keys), *keys, *args)
        except rex.NoScriptError:
            self.load_scripts()
            return self._r.evalsha(self._sha[name], len(keys), *keys, *args)

    def _pipe(self) -> Any:
        return self._r.pipeline(transaction=False) if not self.cluster else self._r.pipeline()

    # ---- state blobs -----------------------------------------------------------------
    @_guard
    def read_states(self, version: str, nodes: list[str]) -> list[bytes | None]:
        if not nodes:
            return []
        keys = [self.state_key(version, n) for n in nodes]
        if self.cluster:
            return list(self._r.mget_nonatomic(keys))
        return list(self._r.execute_command("MGET", *keys))

    def _async_client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._async is None or self._async[0] is not loop:
            client = redis.asyncio.Redis.from_url(
                self.config.url,
                socket_timeout=self.config.socket_timeout,
                socket_connect_timeout=self.config.socket_timeout,
                retry=redis.asyncio.retry.Retry(
                    ExponentialBackoff(cap=0.5, base=0.05), 2
                ),  # as the blocking client
                decode_responses=False,
            )
            self._async = (loop, client)
        return self._async[1]

    async def read_states_async(self, version: str, nodes: list[str]) -> list[bytes | None]:
        if not self.async_reads:
            raise NotImplementedError("a Redis Cluster store reads states in blocking calls only")
        if not nodes:
            return []
        keys = [self.state_key(version, n) for n in nodes]
        try:
            return list(await self._async_client().execute_command("MGET", *keys))
        except _CAUGHT as e:
            reason = store_error_reason(e)
            if reason is None:
                raise
            raise _unavailable(e, reason) from e

    async def aclose(self) -> None:
        if self._async is not None:
            _, client = self._async
            self._async = None
            try:
                await client.aclose()
            except Exception:  # pragma: no cover - closing a dead connection
                pass

    @_guard
    def write_states(
        self, version: str, blobs: dict[str, bytes], expected: dict[str, tuple[float, int] | None]
    ) -> WriteOutcome:
        nodes = list(blobs)
        if not nodes:
            return WriteOutcome([], [])
        ttl = _ms(self.config.state_ttl_s)
        # one script call per slot group: all nodes on one server, per slot on a cluster;
        # with script slices (one server), per slice: each blob is its own compare-and-set
        step = 0 if self.cluster else self.config.script_slice
        groups: dict[int, list[str]] = {}
        if step:
            groups = {i: nodes[at : at + step] for i, at in enumerate(range(0, len(nodes), step))}
        else:
            for n in nodes:
                groups.setdefault(
                    self._r.keyslot(self.state_key(version, n)) if self.cluster else 0, []
                ).append(n)
        calls = []
        for group in groups.values():
            args: list[Any] = [ttl]
            for n in group:
                exp = expected.get(n)
                args += [
                    b"" if exp is None else pack_watermark(exp),
                    blobs[n],
                ]
            calls.append(([self.state_key(version, n) for n in group], args))
        if step:  # one after another: a read waits for one slice at most
            results = [self._evalsha("cas", *call) for call in calls]
        else:
            results = self._eval_many("cas", calls)
        ok = {
            n
            for group, res in zip(groups.values(), results, strict=True)
            for n, r in zip(group, res, strict=True)
            if r == 1
        }
        return WriteOutcome([n for n in nodes if n in ok], [n for n in nodes if n not in ok])

    def _eval_many(self, name: str, calls: list[tuple[list[bytes], list[Any]]]) -> list[Any]:
        """Several EVALSHA calls in one pipeline (one round trip per server); re-sends
        (once) the ones that met NOSCRIPT. Each call's keys must share one slot."""
        if len(calls) == 1 and not self.cluster:
            return [self._evalsha(name, *calls[0])]
        sha = self._sha[name]
        todo = list(range(len(calls)))
        results: list[Any] = [None] * len(calls)
        for attempt in range(2):
            pipe = self._pipe()
            for i in todo:
                keys, args = calls[i]
                if self.cluster:
                    # Route by our own slot lookup: without target_nodes, redis-py's
                    # cluster pipeline asks the server (COMMAND GETKEYS) for the keys
                    # of every EVALSHA, one extra round trip per command.
                    node = self._r.nodes_manager.get_node_from_slot(self._r.keyslot(keys[0]))
                    pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args, target_nodes=node)
                else:
                    pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
            out = pipe.execute(raise_on_error=False)
            retry = []
            for i, r in zip(todo, out, strict=True):
                if isinstance(r, rex.NoScriptError) and attempt == 0:
                    retry.append(i)
                elif isinstance(r, Exception):
                    raise r
                else:
                    results[i] = r
            if not retry:
                break
            self.load_scripts()
            todo = retry
        return results

    @_guard
    def delete_states(self, version: str, nodes: list[str]) -> int:
        keys = list({self.state_key(version, n) for n in nodes})
        if not keys:
            return 0
        if self.cluster:
            return int(self._r.delete(*keys))
        return int(self._r.execute_command("DEL", *keys))

    # ---- event log -------------------------------------------------------------------
    @_guard
    def append_events(self, events: list[NewEvent]) -> AppendResult:
        if not events:
            return AppendResult(seqs=[])
        step = self.config.script_slice
        if not step or len(events) <= step:
            return self._append_slice(events)
        return combine_slices(
            [
                (events[at : at + step], self._append_slice(events[at : at + step]))
                for at in range(0, len(events), step)
            ]
        )

    def _append_slice(self, events: list[NewEvent]) -> AppendResult:
        """``append_events`` of events that one script call logs."""
        keys, args, times, eids = self._single_append_call(events)
        return self._append_answer(self._evalsha("append", keys, args), times, eids)

    def _single_append_call(
        self, events: list[NewEvent]
    ) -> tuple[list[Any], list[Any], list[float], list[str]]:
        """The append script's keys and arguments for ``events``, with the events'
        times and ids (which reading its answer needs)."""
        cfg = self.config
        number: dict[str, int] = {}  # node -> j (1-based), in first-seen order
        for ev in events:
            number.setdefault(ev.src, len(number) + 1)
            number.setdefault(ev.dst, len(number) + 1)
        keys: list[Any] = [
            self._k_seq,
            self._k_log,
            self._k_pending,
            self._k_lt,
            self._k_tmax,
            self._k_eids,
        ]
        keys += [self.history_key(node) for node in number]
        args: list[Any] = header_args(
            len(events), number, _ms(cfg.dedupe_ttl_s), cfg.history_cap, cfg.max_future_skew
        )
        args += number
        times, eids = [], event_ids(events)
        for ev, eid in zip(events, eids, strict=True):
            t = event_time(ev.t)
            times.append(t)
            # '' as the dedupe id: an id assigned here is unique, so not looked up or kept.
            args += [
                number[ev.src],
                number[ev.dst],
                _fmt_float(t),
                encode_tail(ev, t, eid),
                eid if ev.event_id is not None else "",
            ]
        return keys, args, times, eids

    def _append_answer(self, out: list[Any], times: list[float], eids: list[str]) -> AppendResult:
        cfg = self.config
        result = AppendResult(seqs=[None] * len(times), event_ids=eids)
        result.previous_seq = previous_seqs(out.pop())
        for i, r in enumerate(out):
            if isinstance(r, int):  # logged: its seq (the common case, read inline)
                result.seqs[i] = r
                continue
            kind, raw = outcome(r)
            if kind == "dup":
                result.duplicates.append(i)
            else:
                result.late.append((i, refusal_reason(kind, raw, times[i], cfg.max_future_skew)))
        return result

    @property
    def appends_in_background(self) -> bool:  # type: ignore[override]
        return not self.cluster and self.partitions == 1

    @_guard
    def begin_append(self, events: list[NewEvent]) -> Callable[[], AppendResult]:
        """Send the append script on a connection of its own and return at once; the
        returned function reads its answer. Where the answer cannot be split from the
        call (a cluster, a partitioned log, a batch cut into slices), or the send
        fails, the append runs here as ``append_events`` does (with its retries)."""
        step = self.config.script_slice
        if not events or not self.appends_in_background or (step and len(events) > step):
            return super().begin_append(events)
        keys, args, times, eids = self._single_append_call(events)
        pool = self._r.connection_pool
        try:
            # (redis-py connects lazily, at the send; a pool that can give no connection,
            # e.g. at its max_connections, raises here)
            conn = pool.get_connection()
        except _CAUGHT:
            return super().begin_append(events)
        try:
            conn.send_command("EVALSHA", self._sha["append"], len(keys), *keys, *args)
        except _CAUGHT:
            conn.disconnect()
            pool.release(conn)
            return super().begin_append(events)  # what a retry of the plain call does
        return functools.partial(self._finish_append, conn, keys, args, times, eids)

    @_guard
    def _finish_append(
        self, conn: Any, keys: list[Any], args: list[Any], times: list[float], eids: list[str]
    ) -> AppendResult:
        pool = self._r.connection_pool
        try:
            out = conn.read_response()
        except rex.NoScriptError:  # a Redis restarted or flushed since the scripts loaded
            pool.release(conn)
            return self._append_answer(self._evalsha("append", keys, args), times, eids)
        except BaseException:
            conn.disconnect()  # (read_response disconnects on errors; a no-op then)
            pool.release(conn)
            raise
        pool.release(conn)
        return self._append_answer(out, times, eids)

    @_guard
    def read_histories(
        self, nodes: list[str], after_seq: list[int] | None = None, limit: int | None = None
    ) -> list[list[LoggedEvent]]:
        if not nodes:
            return []
        pipe = self._pipe()
        for i, n in enumerate(nodes):
            lo = b"-inf" if after_seq is None else b"(%d" % int(after_seq[i])
            if limit is None:
                pipe.execute_command("ZRANGE", self.history_key(n), lo, b"+inf", b"BYSCORE")
            else:
                pipe.execute_command(
                    "ZRANGE",
                    self.history_key(n),
                    b"+inf",
                    lo,
                    b"BYSCORE",
                    b"REV",
                    b"LIMIT",
                    0,
                    max(int(limit), 0),
                )
        out = pipe.execute()
        if limit is None:
            return [[decode_event(m) for m in ms] for ms in out]
        return [[decode_event(m) for m in reversed(ms)] for ms in out]

    @_guard
    def neighbours_before(self, nodes: list[str], events: list[LoggedEvent]) -> list[str | None]:
        return neighbours_from_members(nodes, self._entries_before(nodes, events, 1))

    @_guard
    def two_neighbours_before(
        self, nodes: list[str], events: list[LoggedEvent]
    ) -> list[tuple[str | None, str | None]]:
        return two_neighbours_from_members(nodes, self._entries_before(nodes, events, 2))

    def _entries_before(
        self, nodes: list[str], events: list[LoggedEvent], count: int
    ) -> list[list[bytes]]:
        """Each node's latest ``count`` history members before ``events[i]``, newest
        first, in one pipelined round trip."""
        if not nodes:
            return []
        pipe = self._pipe()
        for n, e in zip(nodes, events, strict=True):
            pipe.execute_command(
                "ZRANGE", self.history_key(n), b"(%d" % int(e.seq), b"-inf", b"BYSCORE", b"REV",
                b"LIMIT", 0, count,
            )  # fmt: skip
        return list(pipe.execute())

    @_guard
    def read_log(self, after_seq: int, count: int) -> list[LoggedEvent]:
        if count <= 0:
            return []
        ms = self._evalsha(
            "read_log", [self._k_log, self._k_log_first], [max(int(after_seq), 0) + 1, int(count)]
        )
        return [decode_event(m) for m in ms]

    @_guard
    def pending(self, limit: int, after_seq: int | None = None) -> list[LoggedEvent]:
        if limit <= 0:
            return []
        if after_seq is None:
            ms = self._r.execute_command("ZRANGE", self._k_pending, 0, int(limit) - 1)
        else:
            ms = self._r.execute_command(
                "ZRANGE",
                self._k_pending,
                b"(%d" % int(after_seq),
                b"+inf",
                b"BYSCORE",
                b"LIMIT",
                0,
                int(limit),
            )
        return [decode_event(m) for m in ms]

    @_guard
    def mark_applied(self, seqs: list[int], version: str | None = None) -> None:
        self._evalsha(
            "mark",
            [self._k_pending, self._k_log, self._k_seq, self._k_log_first, self._k_vmarks],
            [
                self.config.log_keep,
                version or "",
                1,  # P and p of the single-slot log (log_scripts: seq = c * P + p)
                0,
                *(x for lo, hi in _ranges(seqs) for x in (lo, hi)),
            ],
        )

    # ---- the serving version ---------------------------------------------------------
    @_guard
    def read_serving(self) -> ServingState:
        pipe = self._pipe()
        pipe.execute_command("GET", self._k_serving)
        pipe.execute_command("HGETALL", self._k_vmarks)
        raw, marks = pipe.execute()
        if isinstance(marks, list):  # RESP2 without the client's hash parsing
            marks = dict(zip(marks[::2], marks[1::2], strict=True))
        return ServingState(
            ServingModel.decode(raw),
            VersionMarks({k.decode(): int(v) for k, v in marks.items()}),
        )

    @_guard
    def publish_serving(self, model: ServingModel, only_if_absent: bool = False) -> ServingModel:
        pipe = self._pipe()
        if only_if_absent:
            pipe.execute_command("SET", self._k_serving, model.encode(), "NX")
        else:
            pipe.execute_command("SET", self._k_serving, model.encode())
        pipe.execute_command("GET", self._k_serving)
        stored = ServingModel.decode(pipe.execute()[1])
        return stored if stored is not None else model

    @_guard
    def last_event_time(self) -> float | None:
        v = self._r.execute_command("GET", self._k_tmax)
        return None if v is None else float(v)

    # ---- housekeeping ------------------------------------------------------------------
    def ping(self) -> bool:
        try:
            return bool(self._r.ping())
        except (rex.RedisError, rex.RedisClusterException):
            return False

    @_guard
    def memory(self) -> StoreMemory | None:
        if self.cluster:  # one dict per master
            per_node = self._r.info("memory", "stats", target_nodes=RedisCluster.PRIMARIES)
            infos = list(per_node.values()) if _is_per_node(per_node) else [per_node]
        else:
            infos = [self._r.execute_command("INFO", "memory", "stats")]
        return StoreMemory(
            used_bytes=sum(int(i.get("used_memory", 0)) for i in infos),
            max_bytes=sum(int(i.get("maxmemory", 0)) for i in infos),
            evicted_keys=sum(int(i.get("evicted_keys", 0)) for i in infos),
            policy=str(infos[0].get("maxmemory_policy", "")) if infos else "",
        )

    def close(self) -> None:
        try:
            self._r.close()
        except Exception:  # pragma: no cover - closing a dead connection
            pass


def _is_per_node(info: dict[Any, Any]) -> bool:
    """RedisCluster.info answers one dict per node, or a single node's dict itself."""
    return bool(info) and all(isinstance(v, dict) for v in info.values())


def _parse_hosts(netloc_hosts: str) -> Iterable[tuple[str, int]]:
    for part in netloc_hosts.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("["):  # [ipv6]:port
            host, _, port = part[1:].partition("]:")
        else:
            host, _, port = part.rpartition(":") if ":" in part else (part, "", "6379")
        yield host, int(port or 6379)


def _cluster_from_url(url: str, socket_timeout: float | None, **extra: Any) -> RedisCluster:
    """``redis+cluster://[user:pass@]host:port[,host:port...]`` -> RedisCluster.

    The first host goes in as a plain ``redis://`` URL (so that redis-py builds its
    node connection pools from URL options, which honours ``connection_class``),
    the others as extra startup nodes."""
    parts = urlsplit(url)
    netloc = parts.netloc
    cred = ""
    if "@" in netloc:
        cred, netloc = netloc.rsplit("@", 1)
        cred += "@"
    hosts = list(_parse_hosts(netloc))
    if not hosts:
        raise ValueError(f"no host in cluster URL {url!r}")
    scheme = "rediss" if parts.scheme.lower().startswith("rediss") else "redis"
    (h0, p0), rest = hosts[0], hosts[1:]
    host0 = f"[{h0}]" if ":" in h0 else h0
    query = f"?{parts.query}" if parts.query else ""
    return RedisCluster(
        url=f"{scheme}://{cred}{host0}:{p0}/0{query}",
        startup_nodes=[ClusterNode(h, p) for h, p in rest],
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        decode_responses=False,
        **extra,
    )
