"""The log's append script, once, for the single-slot log and for a partition of the
partitioned log, and the reading of its answers.

Both forms log a batch the same way, for each event in input order: dedupe by id,
late check of its endpoint(s), future check, seq, history, log, pending, ``lt``,
``tmax`` (docs/STATE_STORE.md, "Why the log is one slot"). A partition adds what
an event with its other endpoint in another partition needs: the copy is recorded
in doubt under the writer's attempt nonce, a fenced attempt is refused, a copy of
the same attempt already logged answers its seq, and ids in doubt from another
attempt block the whole call (docs/STATE_STORE.md, "Partitioned log").

The two forms are generated from one text (``append_lua``) rather than one script
with run-time switches: the single-slot script must not pay, per event, for the
doubt and fence lookups of the partitioned one. What differs is in the ``_PART``
and ``_SINGLE`` fragments below; everything else is written once.

Calling convention (``n`` events, ``m`` distinct endpoints of this log's nodes)::

    KEYS  1 counter, 2 log, 3 pending, 4 lt, 5 tmax, 6 eids,
          partition only: 7 doubt, 8 fence; then history of node j = 1..m
    ARGV  1 n, 2 dedupe ttl ms ('' = forever), 3 history cap, 4 future skew ('' = off),
          5 m, partition only: 6 P, 7 p, 8 nonce; then the m node names; then per
          event: src j, dst j (partition: 0 = that endpoint is elsewhere), t (repr),
          tail (the JSON after the seq), dedupe id ('' = an id the store assigned to
          an event that needs no lookup), partition only: the other endpoint's
          partition ('' = both endpoints here)

Answers per event: seq | {-1} duplicate | {-2, node, last_t} late | {-3, tmax}
future; partition only: {-4, seq} a copy of this very attempt is already logged (a
re-sent call) | {-5} fenced; then one more element {node, previous seq, ...} for
every endpoint of a logged event (its last logged seq before the batch, -1: none).
A partition answers {-9, ids...} and changes nothing when an id of the batch is in
doubt from another attempt.

Per event only what must be per event is a command (the dedupe ZSCORE of a client id);
the counter, the late-check times, the histories (one ZADD per node), the pending set,
the dedupe marks and the history trims are read once per node or written once per
batch. Nodes travel once per batch, events refer to them by number. Dedupe marks are
members of one sorted set scored by expiry; expired ones are dropped first.

The shebang makes it a Redis 7 script with flags (none): one that may write and is
not "allow-oom", so a full Redis (maxmemory under noeviction) refuses the whole call
with OOM before it runs. Without it Redis checks memory only at the script's first
write of a "denyoom" command, and the ZREMRANGEBYSCORE below (a write, not denyoom)
comes first and lets every later write through: the log then grew past maxmemory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import AppendResult, NewEvent
from .common import future_reason, late_reason

_TEMPLATE = """#!lua
local n = tonumber(ARGV[1])
local ttl = ARGV[2]
local cap = tonumber(ARGV[3])
local skew = ARGV[4]
local m = tonumber(ARGV[5])
{params}
local ab = {na} + m
{prelude}
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now_ms)
{trim}
local expiry = '+inf'
if ttl ~= '' then expiry = string.format('%d', now_ms + tonumber(ttl)) end
local tmax_s = redis.call('GET', KEYS[5])
local tmax = nil
if tmax_s then tmax = tonumber(tmax_s) end
local tmax_changed = false
local c0 = tonumber(redis.call('GET', KEYS[1]) or '0')
local c = c0
-- per node j: time of its last logged event (number and exact string; false: none),
-- and the history entries this batch adds (nil while it has none)
local lt_t, lt_s, added = {{}}, {{}}, {{}}
local seen, marks, pend, logged, doubts, out = {{}}, {{}}, {{}}, {{}}, {{}}, {{}}
local function last_time(j)
  local v = lt_t[j]
  if v == nil then
    local s = redis.call('HGET', KEYS[4], ARGV[{na} + j])
    if s then v = tonumber(s); lt_s[j] = s else v = false end
    lt_t[j] = v
  end
  return v
end
local function add_to_history(j, seq_s, entry, t, ts)
  local a = added[j]
  if a == nil then a = {{}}; added[j] = a end
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
for i = 1, n do
  local sj, dj, ts, tail, eid{cross_local} = {fields}
  ab = ab + {width}
  local t = tonumber(ts)
{before_dedupe}  if eid ~= '' and (seen[eid] or redis.call('ZSCORE', KEYS[6], eid)) then
    out[i] = {{-1}}
{after_dedupe}  else
    local late = nil
    if sj > 0 then
      local ls = last_time(sj)
      if ls and t < ls then late = {{-2, ARGV[{na} + sj], lt_s[sj]}} end
    end
    if (not late) and dj > 0 and dj ~= sj then
      local ld = last_time(dj)
      if ld and t < ld then late = {{-2, ARGV[{na} + dj], lt_s[dj]}} end
    end
    if late then
      out[i] = late
    elseif skew ~= '' and tmax and t > tmax + tonumber(skew) then
      out[i] = {{-3, tmax_s}}
    else
      c = c + 1
      local seq = c * P + p
      local seq_s = string.format('%d', seq)
      local entry = '[' .. seq_s .. tail
      logged[#logged + 1] = entry
      pend[#pend + 1] = seq_s
      pend[#pend + 1] = entry
      if sj > 0 then add_to_history(sj, seq_s, entry, t, ts) end
      if dj > 0 and dj ~= sj then add_to_history(dj, seq_s, entry, t, ts) end
      seen[eid] = true
{record}        marks[#marks + 1] = expiry
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
{after_event}end
if c ~= c0 then redis.call('SET', KEYS[1], string.format('%d', c)) end
if tmax_changed then redis.call('SET', KEYS[5], tmax_s) end
write_chunked('RPUSH', KEYS[2], logged)
write_chunked('ZADD', KEYS[3], pend)
write_chunked('ZADD', KEYS[6], marks)
{write_doubts}
local times, previous = {{}}, {{}}
for j = 1, m do
  local a = added[j]
  if a then
    local key, node = KEYS[{nk} + j], ARGV[{na} + j]
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

_FIELDS = "tonumber(ARGV[ab + 1]), tonumber(ARGV[ab + 2]), ARGV[ab + 3], ARGV[ab + 4], ARGV[ab + 5]"

# The single-slot log: seqs are the counter itself (P = 1, p = 0), both endpoints are
# always here, and an id is remembered only when the client gave it.
_SINGLE = {
    "params": "local P, p = 1, 0",
    "na": "5",
    "nk": "6",
    "prelude": "",
    "trim": "",
    "cross_local": "",
    "fields": _FIELDS,
    "width": "5",
    "before_dedupe": "",
    "after_dedupe": "",
    "record": "      if eid ~= '' then\n",
    "after_event": "",
    "write_doubts": "",
}

# A partition: ids in doubt from another attempt block the call (checked before
# anything changes); a copy whose other endpoint is elsewhere is recorded in doubt
# instead of having its id remembered (the finish script remembers it on commit).
_PART = {
    "params": "local P = tonumber(ARGV[6])\nlocal p = tonumber(ARGV[7])\nlocal nonce = ARGV[8]",
    "na": "8",
    "nk": "8",
    "prelude": """local blocked = {}
for i = 1, n do
  local eid = ARGV[ab + 6 * (i - 1) + 5]
  if eid ~= '' then
    local v = redis.call('HGET', KEYS[7], eid)
    if v and string.match(v, '^(%S+)') ~= nonce then blocked[#blocked + 1] = eid end
  end
end
if #blocked > 0 then return {-9, blocked} end""",
    "trim": "redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now_ms)",
    "cross_local": ", cross",
    "fields": _FIELDS + ", ARGV[ab + 6]",
    "width": "6",
    "before_dedupe": """  local mine = nil
  if cross ~= '' then mine = redis.call('HGET', KEYS[7], eid) end
  if mine then
    out[i] = {-4, tonumber(string.match(mine, '^%S+ (%d+)'))}
  else
""",
    "after_dedupe": """  elseif cross ~= '' and redis.call('ZSCORE', KEYS[8], eid .. '|' .. nonce) then
    out[i] = {-5}
""",
    "record": """      if cross ~= '' then
        doubts[#doubts + 1] = eid
        local here = sj
        if here == 0 then here = dj end
        doubts[#doubts + 1] = nonce .. ' ' .. seq_s .. ' ' .. string.format('%d', now_ms) .. ' ' .. cross .. ' ' .. ARGV[8 + here]
      elseif eid ~= '' then
""",
    "after_event": "  end\n",
    "write_doubts": "write_chunked('HSET', KEYS[7], doubts)",
}


def append_lua(partitioned: bool) -> str:
    """The append script of a partition (``partitioned``) or of the single-slot log."""
    return _TEMPLATE.format(**(_PART if partitioned else _SINGLE))


APPEND_LUA = append_lua(partitioned=False)
APPEND_PART_LUA = append_lua(partitioned=True)


def header_args(
    n: int, number: dict[str, int], ttl_ms: str, cap: int, skew: float | None
) -> list[Any]:
    """ARGV 1..5 (the rest of the header, for a partition, goes between these and the
    node names, which the caller appends)."""
    return [n, ttl_ms, cap, "" if skew is None else repr(float(skew)), len(number)]


def outcome(r: Any) -> tuple[str, Any]:
    """The script's answer for one event: ("seq", seq) | ("dup", None) | ("late", raw)
    | ("future", raw) | ("fenced", None)."""
    if isinstance(r, int):
        return ("seq", r)
    code = int(r[0])
    if code == -4:
        return ("seq", int(r[1]))
    if code == -1:
        return ("dup", None)
    if code == -2:
        return ("late", r)
    if code == -3:
        return ("future", r)
    if code == -5:
        return ("fenced", None)
    raise RuntimeError(f"append script returned {r!r}")  # pragma: no cover


def refusal_reason(kind: str, raw: Any, t: float, skew: float | None) -> str:
    """The per-event reason of a late or future answer (``outcome``'s raw value)."""
    if kind == "late":
        node = raw[1].decode() if isinstance(raw[1], bytes) else raw[1]
        return late_reason(t, float(raw[2]), node)
    return future_reason(t, float(raw[1]), float(skew or 0.0))


def previous_seqs(raw: list[Any]) -> dict[str, int]:
    """The script's last element: each endpoint's last seq before the batch."""
    return {raw[j].decode(): int(raw[j + 1]) for j in range(0, len(raw), 2)}


def combine_slices(slices: Sequence[tuple[list[NewEvent], AppendResult]]) -> AppendResult:
    """One batch's answer from the answers of its slices, logged one script call after
    another in input order (``RedisStoreConfig.script_slice``).

    Seqs, ids, duplicates and refusals are the slices' own, in input order (indices
    shifted); what a slice deduped or refused against an earlier slice it would have
    within one call too, since the script handles a batch event by event. A node's
    ``previous_seq`` is its seq before the first slice that logged it, and the applier
    takes the batch's events of the node as exactly what followed it. That holds only
    when no other writer logged an event of the node between two slices: a later slice
    then answers, as the node's previous seq, another seq than the node's last one of
    the earlier slices, and the node is left out of ``previous_seq`` (the applier reads
    its stored history instead, as for any node it was not told about)."""
    out = AppendResult(seqs=[])
    last: dict[str, int] = {}  # node -> its newest seq logged by the slices so far
    interleaved: set[str] = set()
    for events, part in slices:
        shift = len(out.seqs)
        out.seqs += part.seqs
        out.event_ids += part.event_ids
        out.duplicates += [shift + i for i in part.duplicates]
        out.late += [(shift + i, reason) for i, reason in part.late]
        for node, before in part.previous_seq.items():
            if node not in last:
                out.previous_seq.setdefault(node, before)
            elif before != last[node]:
                interleaved.add(node)
        for ev, seq in zip(events, part.seqs, strict=True):
            if seq is not None:
                last[ev.src] = last[ev.dst] = seq
    for node in interleaved:
        out.previous_seq.pop(node, None)
    return out
