"""Lua scripts of the partitioned log (``state_store.partitioned_store``).

Each script touches the keys of ONE partition (one hash tag, so one slot on a
cluster). Sequence numbers are interleaved: partition ``p`` of ``P`` hands out
``c * P + p`` for its counter ``c`` = 1, 2, ... so a seq names its partition
(``seq % P``) and, at ``P = 1``, is the counter itself. The log list is indexed by
the counter (element ``i`` holds counter ``log_first + i``).

An event whose endpoints live in two partitions is logged as one *copy* in each,
each copy with its own seq, both under the event's id and the writer's attempt
``nonce``. A copy is *in doubt* (field of the partition's ``doubt`` hash: id ->
"nonce seq ms other-partition node") until the writer, or the re-drive's resolver, decides: committed
once both copies exist (the doubt is cleared, the id remembered), aborted when one
is missing (the missing side fences ``id|nonce``, so that copy can never appear
later, and the existing copy is removed). docs/STATE_STORE.md argues the protocol.

The append script is the single-slot log's, in its partition form
(``state_store.append_script``); the mark and read-log scripts are shared as they are
(``state_store.log_scripts``).
"""

from __future__ import annotations

# Shared by DECIDE and FINISH: the dedupe window's expiry from ARGV[1], and the commit
# of one copy: clear this attempt's doubt and remember the id (true), or find the id
# committed already (true); else false (no copy of this attempt here, none committed).
_COMMIT_PRELUDE = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local expiry = '+inf'
if ARGV[1] ~= '' then expiry = string.format('%d', now_ms + tonumber(ARGV[1])) end
local function commit(eid, nonce)
  local v = redis.call('HGET', KEYS[1], eid)
  if v and string.match(v, '^(%S+)') == nonce then
    redis.call('HDEL', KEYS[1], eid)
    redis.call('ZADD', KEYS[2], expiry, eid)
    return true
  end
  return redis.call('ZSCORE', KEYS[2], eid) ~= false
end
"""

# The other side's decision for copies in doubt (the resolver, and a retry that meets
# a copy of an earlier attempt). KEYS: 1 doubt, 2 eids, 3 fence. ARGV: 1 dedupe ttl ms
# ('' = forever), then pairs id, nonce. Per pair: 1 committed (this partition holds the
# same attempt's copy, or has the id committed: both copies exist, so it is committed;
# a copy of this side still in doubt is cleared) | 0 aborted (fenced here: that
# attempt's copy can never be logged here, so the other copy must go).
DECIDE_LUA = (
    _COMMIT_PRELUDE
    + """
local out = {}
for i = 2, #ARGV, 2 do
  local eid, nonce = ARGV[i], ARGV[i + 1]
  if commit(eid, nonce) then
    out[#out + 1] = 1
  else
    redis.call('ZADD', KEYS[3], expiry, eid .. '|' .. nonce)
    out[#out + 1] = 0
  end
end
return out
"""
)

# Ends the doubt of copies in one partition. KEYS: 1 doubt, 2 eids, 3 pending, 4 lt,
# 5 log, 6 log_first, then the histories of the aborted copies' nodes. ARGV: 1 dedupe
# ttl ms, 2 P, 3 number of commits, then commits (id, nonce), then aborts (id, nonce,
# history key index, node). Commit: clear the doubt and remember the id (1), or find it
# committed already (1), else 0. Abort (only while that same attempt's copy is in
# doubt): the copy leaves the history and the pending set, its log element becomes a
# tombstone ("x"), and if it was the node's newest event the node's late-check time
# falls back to its newest remaining event (a node left without one keeps the time:
# refusing a little more is safe, accepting out of order is not). 1 aborted, 0 not.
FINISH_LUA = (
    _COMMIT_PRELUDE
    + """
local P = tonumber(ARGV[2])
local nc = tonumber(ARGV[3])
local out = {}
local a = 4
for i = 1, nc do
  if commit(ARGV[a], ARGV[a + 1]) then out[#out + 1] = 1 else out[#out + 1] = 0 end
  a = a + 2
end
while a <= #ARGV do
  local eid, nonce, hk, node = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3]
  a = a + 4
  local v = redis.call('HGET', KEYS[1], eid)
  if v and string.match(v, '^(%S+)') == nonce then
    local seq = tonumber(string.match(v, '^%S+ (%d+)'))
    local hkey = KEYS[6 + hk]
    local top = redis.call('ZRANGE', hkey, -1, -1, 'WITHSCORES')
    redis.call('ZREMRANGEBYSCORE', hkey, seq, seq)
    redis.call('ZREMRANGEBYSCORE', KEYS[3], seq, seq)
    local first = tonumber(redis.call('GET', KEYS[6]) or '1')
    local idx = (seq - (seq % P)) / P - first
    if idx >= 0 then redis.pcall('LSET', KEYS[5], idx, 'x') end
    redis.call('HDEL', KEYS[1], eid)
    if #top > 0 and tonumber(top[2]) == seq then
      local rest = redis.call('ZRANGE', hkey, -1, -1)
      if #rest > 0 then
        local e = cjson.decode(rest[1])
        redis.call('HSET', KEYS[4], node, string.format('%.17g', e[4]))
      end
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""
)

# The seqs of the partition's copies in doubt (KEYS[1]: its doubt hash).
_DOUBT_SEQS = """
local function doubt_seqs()
  local seqs = {}
  for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
    seqs[tonumber(string.match(v, '^%S+ (%d+)'))] = true
  end
  return seqs
end
"""

# The committed part of node histories, read atomically with the partition's doubt
# set (a copy in doubt is never applied, nor anything after it on its node).
# KEYS: 1 doubt, then histories. ARGV: the seq after which to read each history.
# Returns per node {in_doubt 0/1, members...} (members empty when in doubt).
READ_COMMITTED_LUA = (
    _DOUBT_SEQS
    + """
local doubt = doubt_seqs()
local out = {}
for i = 2, #KEYS do
  local rows = redis.call('ZRANGE', KEYS[i], '(' .. ARGV[i - 1], '+inf', 'BYSCORE', 'WITHSCORES')
  local held = 0
  local members = {}
  for k = 1, #rows, 2 do
    if doubt[tonumber(rows[k + 1])] then held = 1; break end
    members[#members + 1] = rows[k]
  end
  if held == 1 then members = {} end
  table.insert(members, 1, held)
  out[#out + 1] = members
end
return out
"""
)

# Where a node was just before an event: the entry before the event's copy in the
# node's history (the transition counts' lookup, docs/STATE_STORE.md). KEYS: 1 doubt,
# then histories. ARGV, three per history: 's', seq, '' when the copy here has that
# seq (both endpoints in this partition, the event logged whole), or 'i', t, id when
# the event spans two partitions and the caller holds the other copy: the copy here
# is found by time (a history's times never fall, so a binary search over ranks) and
# then by id among the entries at that time (a snapshot's ties). Returns per history
# {status, member}: 0 none (the node's first event, trimmed by the cap, or no such
# copy), 1 the entry before, 2 held (the entry before is a copy in doubt: if it is
# aborted, the answer is the one before it). Modes 'S' and 'I' (the second-order
# counts) answer the two entries before, {1, newer, older} (older absent when there is
# one), held when either is in doubt.
PREVIOUS_LUA = (
    _DOUBT_SEQS
    + """
local doubt = nil
local function before(key, seq, count)
  local row = redis.call('ZRANGE', key, '(' .. seq, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, count, 'WITHSCORES')
  if #row == 0 then return {0, ''} end
  if doubt == nil then doubt = doubt_seqs() end
  local out = {1}
  for k = 1, #row, 2 do
    if doubt[tonumber(row[k + 1])] then return {2, ''} end
    out[#out + 1] = row[k]
  end
  return out
end
local function copy_seq(key, t, eid)
  local lo, hi = 0, redis.call('ZCARD', key)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cjson.decode(redis.call('ZRANGE', key, mid, mid)[1])[4] < t then lo = mid + 1 else hi = mid end
  end
  while true do
    local rows = redis.call('ZRANGE', key, lo, lo + 63, 'WITHSCORES')
    if #rows == 0 then return nil end
    for k = 1, #rows, 2 do
      local e = cjson.decode(rows[k])
      if e[4] > t then return nil end
      if e[6] == eid then return rows[k + 1] end
    end
    lo = lo + 64
  end
end
local out = {}
for i = 2, #KEYS do
  local mode, a, b = ARGV[3 * i - 5], ARGV[3 * i - 4], ARGV[3 * i - 3]
  local count = 1
  if mode == 'S' or mode == 'I' then count = 2 end
  if mode == 's' or mode == 'S' then
    out[#out + 1] = before(KEYS[i], a, count)
  else
    local seq = copy_seq(KEYS[i], tonumber(a), b)
    if seq then out[#out + 1] = before(KEYS[i], seq, count) else out[#out + 1] = {0, ''} end
  end
end
return out
"""
)
