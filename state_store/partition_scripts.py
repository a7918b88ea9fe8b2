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
"""

from __future__ import annotations

# KEYS: 1 counter, 2 log, 3 pending, 4 lt, 5 tmax, 6 eids, 7 doubt, 8 fence;
#       8 + j: history of node j (the nodes of this partition only)
# ARGV: 1 n, 2 dedupe ttl ms ('' = forever), 3 history cap, 4 future skew ('' = off),
#       5 m, 6 P, 7 p, 8 nonce; 8 + j: name of node j; then per event: src j, dst j
#       (0: that endpoint is in another partition), t (repr), tail, dedupe id ('' =
#       an assigned id of a local event: never looked up), cross: the other
#       endpoint's partition ('' = a local event, both endpoints here)
# Returns {-9, ids...} and changes nothing when an id of the batch is in doubt from
# another attempt (the caller resolves those first, then runs the script again: a
# node's events stay in input order). Else per event: seq | {-1} duplicate |
# {-2, node, last_t} late | {-3, tmax} future | {-4, seq} a copy of this very attempt
# already logged (a re-sent call) | {-5} fenced; then {node, previous seq, ...}.
APPEND_PART_LUA = """#!lua
local n = tonumber(ARGV[1])
local ttl = ARGV[2]
local cap = tonumber(ARGV[3])
local skew = ARGV[4]
local m = tonumber(ARGV[5])
local P = tonumber(ARGV[6])
local p = tonumber(ARGV[7])
local nonce = ARGV[8]
local ab = 8 + m
local blocked = {}
for i = 1, n do
  local eid = ARGV[ab + 6 * (i - 1) + 5]
  if eid ~= '' then
    local v = redis.call('HGET', KEYS[7], eid)
    if v and string.match(v, '^(%S+)') ~= nonce then blocked[#blocked + 1] = eid end
  end
end
if #blocked > 0 then return {-9, blocked} end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now_ms)
redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now_ms)
local expiry = '+inf'
if ttl ~= '' then expiry = string.format('%d', now_ms + tonumber(ttl)) end
local tmax_s = redis.call('GET', KEYS[5])
local tmax = nil
if tmax_s then tmax = tonumber(tmax_s) end
local tmax_changed = false
local c0 = tonumber(redis.call('GET', KEYS[1]) or '0')
local c = c0
local lt_t, lt_s, added = {}, {}, {}
local seen, marks, pend, logged, doubts, out = {}, {}, {}, {}, {}, {}
local function last_time(j)
  local v = lt_t[j]
  if v == nil then
    local s = redis.call('HGET', KEYS[4], ARGV[8 + j])
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
for i = 1, n do
  local sj, dj, ts, tail, eid, cross = tonumber(ARGV[ab + 1]), tonumber(ARGV[ab + 2]), ARGV[ab + 3], ARGV[ab + 4], ARGV[ab + 5], ARGV[ab + 6]
  ab = ab + 6
  local t = tonumber(ts)
  local mine = nil
  if cross ~= '' then mine = redis.call('HGET', KEYS[7], eid) end
  if mine then
    out[i] = {-4, tonumber(string.match(mine, '^%S+ (%d+)'))}
  elseif eid ~= '' and (seen[eid] or redis.call('ZSCORE', KEYS[6], eid)) then
    out[i] = {-1}
  elseif cross ~= '' and redis.call('ZSCORE', KEYS[8], eid .. '|' .. nonce) then
    out[i] = {-5}
  else
    local late = nil
    if sj > 0 then
      local ls = last_time(sj)
      if ls and t < ls then late = {-2, ARGV[8 + sj], lt_s[sj]} end
    end
    if (not late) and dj > 0 and dj ~= sj then
      local ld = last_time(dj)
      if ld and t < ld then late = {-2, ARGV[8 + dj], lt_s[dj]} end
    end
    if late then
      out[i] = late
    elseif skew ~= '' and tmax and t > tmax + tonumber(skew) then
      out[i] = {-3, tmax_s}
    else
      c = c + 1
      local seq_s = string.format('%d', c * P + p)
      local entry = '[' .. seq_s .. tail
      logged[#logged + 1] = entry
      pend[#pend + 1] = seq_s
      pend[#pend + 1] = entry
      if sj > 0 then add_to_history(sj, seq_s, entry, t, ts) end
      if dj > 0 and dj ~= sj then add_to_history(dj, seq_s, entry, t, ts) end
      seen[eid] = true
      if cross ~= '' then
        doubts[#doubts + 1] = eid
        local here = sj
        if here == 0 then here = dj end
        doubts[#doubts + 1] = nonce .. ' ' .. seq_s .. ' ' .. string.format('%d', now_ms) .. ' ' .. cross .. ' ' .. ARGV[8 + here]
      elseif eid ~= '' then
        marks[#marks + 1] = expiry
        marks[#marks + 1] = eid
      end
      if (not tmax) or t > tmax then
        tmax = t
        tmax_s = ts
        tmax_changed = true
      end
      out[i] = c * P + p
    end
  end
end
if c ~= c0 then redis.call('SET', KEYS[1], string.format('%d', c)) end
if tmax_changed then redis.call('SET', KEYS[5], tmax_s) end
write_chunked('RPUSH', KEYS[2], logged)
write_chunked('ZADD', KEYS[3], pend)
write_chunked('ZADD', KEYS[6], marks)
write_chunked('HSET', KEYS[7], doubts)
local times, previous = {}, {}
for j = 1, m do
  local a = added[j]
  if a then
    local key, node = KEYS[8 + j], ARGV[8 + j]
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

# The other side's decision for copies in doubt (the resolver, and a retry that meets
# a copy of an earlier attempt). KEYS: 1 doubt, 2 eids, 3 fence. ARGV: 1 dedupe ttl ms
# ('' = forever), then pairs id, nonce. Per pair: 1 committed (this partition holds the
# same attempt's copy, or has the id committed: both copies exist, so it is committed;
# a copy of this side still in doubt is cleared) | 0 aborted (fenced here: that
# attempt's copy can never be logged here, so the other copy must go).
DECIDE_LUA = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local expiry = '+inf'
if ARGV[1] ~= '' then expiry = string.format('%d', now_ms + tonumber(ARGV[1])) end
local out = {}
for i = 2, #ARGV, 2 do
  local eid, nonce = ARGV[i], ARGV[i + 1]
  local v = redis.call('HGET', KEYS[1], eid)
  if v and string.match(v, '^(%S+)') == nonce then
    redis.call('HDEL', KEYS[1], eid)
    redis.call('ZADD', KEYS[2], expiry, eid)
    out[#out + 1] = 1
  elseif redis.call('ZSCORE', KEYS[2], eid) then
    out[#out + 1] = 1
  else
    redis.call('ZADD', KEYS[3], expiry, eid .. '|' .. nonce)
    out[#out + 1] = 0
  end
end
return out
"""

# Ends the doubt of copies in one partition. KEYS: 1 doubt, 2 eids, 3 pending, 4 lt,
# 5 log, 6 log_first, then the histories of the aborted copies' nodes. ARGV: 1 dedupe
# ttl ms, 2 P, 3 number of commits, then commits (id, nonce), then aborts (id, nonce,
# history key index, node). Commit: clear the doubt and remember the id (1), or find it
# committed already (1), else 0. Abort (only while that same attempt's copy is in
# doubt): the copy leaves the history and the pending set, its log element becomes a
# tombstone ("x"), and if it was the node's newest event the node's late-check time
# falls back to its newest remaining event (a node left without one keeps the time:
# refusing a little more is safe, accepting out of order is not). 1 aborted, 0 not.
FINISH_LUA = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local expiry = '+inf'
if ARGV[1] ~= '' then expiry = string.format('%d', now_ms + tonumber(ARGV[1])) end
local P = tonumber(ARGV[2])
local nc = tonumber(ARGV[3])
local out = {}
local a = 4
for i = 1, nc do
  local eid, nonce = ARGV[a], ARGV[a + 1]
  a = a + 2
  local v = redis.call('HGET', KEYS[1], eid)
  if v and string.match(v, '^(%S+)') == nonce then
    redis.call('HDEL', KEYS[1], eid)
    redis.call('ZADD', KEYS[2], expiry, eid)
    out[#out + 1] = 1
  elseif redis.call('ZSCORE', KEYS[2], eid) then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
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

# The committed part of node histories, read atomically with the partition's doubt
# set (a copy in doubt is never applied, nor anything after it on its node).
# KEYS: 1 doubt, then histories. ARGV: the seq after which to read each history.
# Returns per node {in_doubt 0/1, members...} (members empty when in doubt).
READ_COMMITTED_LUA = """
local doubt = {}
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  doubt[tonumber(string.match(v, '^%S+ (%d+)'))] = true
end
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

# KEYS: 1 pending, 2 log, 3 counter, 4 log_first, 5 vmarks. ARGV: 1 log_keep (per
# partition), 2 version ('' = none), 3 P, 4 p, then pairs lo, hi of seqs applied (each
# pair covers the partition's seqs between them). As the single-slot mark script, in
# counter units for the log.
MARK_PART_LUA = """
local P, p = tonumber(ARGV[3]), tonumber(ARGV[4])
local top = -1
for i = 5, #ARGV, 2 do
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
if #low > 0 then bound = (tonumber(low[2]) - p) / P end
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

# KEYS: 1 log, 2 log_first. ARGV: 1 first counter to read, 2 count.
READ_LOG_PART_LUA = """
local first = tonumber(redis.call('GET', KEYS[2]) or '1')
local start = tonumber(ARGV[1])
if start < first then start = first end
local i = start - first
return redis.call('LRANGE', KEYS[1], i, i + tonumber(ARGV[2]) - 1)
"""
