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
    future_reason,
    late_reason,
)
from .config import RedisStoreConfig
from .layout import claim_partitions
from .versions import ServingModel, ServingState, VersionMarks

# --------------------------------------------------------------------------------------
# Lua scripts. Every key they touch is in KEYS (cluster routing and correctness).

# KEYS: 1 seq, 2 stream, 3 pending, 4 lt, 5 tmax, 6 eids; then 6 + j: history of node j
# ARGV: 1 n, 2 dedupe ttl ms ('' = forever), 3 history cap, 4 future skew ('' = off),
#       5 m (distinct endpoints); 5 + j: name of node j (j = 1..m, the order of KEYS);
#       then per event i: src j, dst j, t (repr), tail (the JSON after the seq), the
#       client's event id ('' for an id the store assigned: unique, so never looked up)
# Returns per event: seq | {-1} duplicate | {-2, node, last_t} late | {-3, tmax} future;
# then one more element: {node, previous seq, ...} for every endpoint of a logged event
# (its last logged seq before this batch, -1 if none).
# Per event only what must be per event is a command (the dedupe ZSCORE of a client id);
# the counter, the late-check times, the histories (one ZADD per node), the pending set,
# the dedupe marks and the history trims are read once per node or written once per
# batch. Nodes travel once per batch, events refer to them by number: a batch on a
# few hubs sends a fraction of the strings. Dedupe marks are members of one sorted set
# scored by expiry (a key per event with PX cost ~4x as much per event); expired ones
# are dropped first, so any member is live.
# The shebang makes it a Redis 7 script with flags (none): one that may write and is
# not "allow-oom", so a full Redis (maxmemory under noeviction) refuses the whole call
# with OOM before it runs. Without it Redis checks memory only at the script's first
# write of a "denyoom" command, and the ZREMRANGEBYSCORE below (a write, not denyoom)
# comes first and lets every later write through: the log then grew past maxmemory.
APPEND_LUA = """#!lua
local n = tonumber(ARGV[1])
local ttl = ARGV[2]
local cap = tonumber(ARGV[3])
local skew = ARGV[4]
local m = tonumber(ARGV[5])
local tmax_s = redis.call('GET', KEYS[5])
local tmax = nil
if tmax_s then tmax = tonumber(tmax_s) end
local tmax_changed = false
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now_ms)
local expiry = '+inf'
if ttl ~= '' then expiry = string.format('%d', now_ms + tonumber(ttl)) end
local seen = {}
local marks = {}
local seq0 = tonumber(redis.call('GET', KEYS[1]) or '0')
local seq = seq0
-- per node j: time of its last logged event (number and exact string; false: none),
-- and the history entries this batch adds (nil while it has none)
local lt_t, lt_s, added = {}, {}, {}
local pend = {}
local logged = {}
local out = {}
local function last_time(j)
  local v = lt_t[j]
  if v == nil then
    local s = redis.call('HGET', KEYS[4], ARGV[5 + j])
    if s then v = tonumber(s); lt_s[j] = s else v = false end
    lt_t[j] = v
  end
  return v
end
local function add_to_history(j, seq_s, entry, t, ts)
  local a = added[j]
  if a == nil then a = {}; added[j] = a end
  a[#a + 1] = seq_s
  a[#a + 1] = entry
  lt_t[j] = t
  lt_s[j] = ts
end
local function write_chunked(cmd, key, flat)
  for i = 1, #flat, 1000 do
    redis.call(cmd, key, unpack(flat, i, math.min(i + 999, #flat)))
  end
end
local ab = 5 + m
for i = 1, n do
  local sj, dj, ts, tail, eid = tonumber(ARGV[ab + 1]), tonumber(ARGV[ab + 2]), ARGV[ab + 3], ARGV[ab + 4], ARGV[ab + 5]
  ab = ab + 5
  local t = tonumber(ts)
  if eid ~= '' and (seen[eid] or redis.call('ZSCORE', KEYS[6], eid)) then
    out[i] = {-1}
  else
    local late = nil
    local ls = last_time(sj)
    if ls and t < ls then late = {-2, ARGV[5 + sj], lt_s[sj]} end
    if (not late) and dj ~= sj then
      local ld = last_time(dj)
      if ld and t < ld then late = {-2, ARGV[5 + dj], lt_s[dj]} end
    end
    if late then
      out[i] = late
    elseif skew ~= '' and tmax and t > tmax + tonumber(skew) then
      out[i] = {-3, tmax_s}
    else
      seq = seq + 1
      local seq_s = string.format('%d', seq)
      local entry = '[' .. seq_s .. tail
      logged[#logged + 1] = entry
      pend[#pend + 1] = seq_s
      pend[#pend + 1] = entry
      add_to_history(sj, seq_s, entry, t, ts)
      if dj ~= sj then add_to_history(dj, seq_s, entry, t, ts) end
      if eid ~= '' then
        seen[eid] = true
        marks[#marks + 1] = expiry
        marks[#marks + 1] = eid
      end
      if (not tmax) or t > tmax then
        tmax = t
        tmax_s = ts
        tmax_changed = true
      end
      out[i] = seq
    end
  end
end
if seq ~= seq0 then redis.call('SET', KEYS[1], string.format('%d', seq)) end
if tmax_changed then redis.call('SET', KEYS[5], tmax_s) end
write_chunked('RPUSH', KEYS[2], logged)
write_chunked('ZADD', KEYS[3], pend)
write_chunked('ZADD', KEYS[6], marks)
local times, previous = {}, {}
for j = 1, m do
  local a = added[j]
  if a then
    local key, node = KEYS[6 + j], ARGV[5 + j]
    local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    previous[#previous + 1] = node
    if #top > 0 then previous[#previous + 1] = tonumber(top[2]) else previous[#previous + 1] = -1 end
    write_chunked('ZADD', key, a)
    redis.call('ZREMRANGEBYRANK', key, 0, -(cap + 1))
    times[#times + 1] = node
    times[#times + 1] = lt_s[j]
  end
end
write_chunked('HSET', KEYS[4], times)
out[n + 1] = previous
return out
"""

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

# KEYS: 1 pending, 2 log, 3 seq, 4 log_first, 5 vmarks. ARGV: 1 log_keep, 2 the model
# version that applied them ('' = none), then pairs lo, hi: ranges of seqs applied.
# Removes them from pending, raises the version's mark to the highest seq (in the same
# step, so a mark never lags the events it describes), then trims the log below the
# lowest pending seq, keeping at least log_keep newest entries (the log holds the
# contiguous seq range log_first .. seq).
MARK_LUA = """
local top = -1
for i = 3, #ARGV, 2 do
  redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[i], ARGV[i + 1])
  local hi = tonumber(ARGV[i + 1])
  if hi > top then top = hi end
end
if ARGV[2] ~= '' and top >= 0 then
  local cur = tonumber(redis.call('HGET', KEYS[5], ARGV[2]) or '-1')
  if top > cur then redis.call('HSET', KEYS[5], ARGV[2], string.format('%d', top)) end
end
local last = tonumber(redis.call('GET', KEYS[3]) or '0')
local bound = last + 1
local low = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #low > 0 then bound = tonumber(low[2]) end
local keep_from = last - tonumber(ARGV[1]) + 1
if keep_from < bound then bound = keep_from end
local first = tonumber(redis.call('GET', KEYS[4]) or '1')
if bound > first then
  redis.call('LTRIM', KEYS[2], bound - first, -1)
  redis.call('SET', KEYS[4], string.format('%d', bound))
  return bound - first
end
return 0
"""

# KEYS: 1 log, 2 log_first. ARGV: 1 after seq, 2 count. The logged events with
# seq > after (at most count), oldest first; one script so a concurrent trim cannot
# shift the list between reading log_first and the range.
READ_LOG_LUA = """
local first = tonumber(redis.call('GET', KEYS[2]) or '1')
local start = tonumber(ARGV[1]) + 1
if start < first then start = first end
local i = start - first
return redis.call('LRANGE', KEYS[1], i, i + tonumber(ARGV[2]) - 1)
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
        # one script call per slot group: all nodes on one server, per slot on a cluster
        groups: dict[int, list[str]] = {}
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
        args: list[Any] = [
            len(events),
            _ms(cfg.dedupe_ttl_s),
            cfg.history_cap,
            "" if cfg.max_future_skew is None else _fmt_float(cfg.max_future_skew),
            len(number),
            *number,
        ]
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
        out = self._evalsha("append", keys, args)
        result = AppendResult(seqs=[None] * len(events), event_ids=eids)
        previous = out.pop()
        result.previous_seq = {
            previous[j].decode(): int(previous[j + 1]) for j in range(0, len(previous), 2)
        }
        for i, r in enumerate(out):
            if isinstance(r, int):  # logged: its seq
                result.seqs[i] = r
                continue
            code = int(r[0])
            if code == -1:
                result.duplicates.append(i)
            elif code == -2:
                node = r[1].decode() if isinstance(r[1], bytes) else r[1]
                result.late.append((i, late_reason(times[i], float(r[2]), node)))
            elif code == -3:
                result.late.append(
                    (i, future_reason(times[i], float(r[1]), float(cfg.max_future_skew or 0.0)))
                )
            else:  # pragma: no cover
                raise RuntimeError(f"append script returned {r!r}")
        return result

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
    def read_log(self, after_seq: int, count: int) -> list[LoggedEvent]:
        if count <= 0:
            return []
        ms = self._evalsha(
            "read_log", [self._k_log, self._k_log_first], [max(int(after_seq), 0), int(count)]
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
