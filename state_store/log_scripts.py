"""The log's mark and read scripts, one each for the single-slot log and a partition.

Seqs are written ``c * P + p`` for the log's counter ``c`` (the single-slot log is
``P = 1``, ``p = 0``: the seq is the counter), and the log list is indexed by the
counter (element ``i`` holds counter ``log_first + i``), so one text serves both.
"""

from __future__ import annotations

# KEYS: 1 pending, 2 log, 3 counter, 4 log_first, 5 vmarks. ARGV: 1 log_keep, 2 the
# model version that applied them ('' = none), 3 P, 4 p, then pairs lo, hi: ranges of
# seqs applied (each pair covers the log's seqs between them). Removes them from
# pending, raises the version's mark to the highest seq (in the same step, so a mark
# never lags the events it describes), then trims the log below the lowest pending
# seq, keeping at least log_keep newest entries (the log holds the contiguous counter
# range log_first .. counter).
MARK_LUA = """
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

# KEYS: 1 log, 2 log_first. ARGV: 1 first counter to read, 2 count. At most count
# entries from that counter on, oldest first; one script so a concurrent trim cannot
# shift the list between reading log_first and the range.
READ_LOG_LUA = """
local first = tonumber(redis.call('GET', KEYS[2]) or '1')
local start = tonumber(ARGV[1])
if start < first then start = first end
local i = start - first
return redis.call('LRANGE', KEYS[1], i, i + tonumber(ARGV[2]) - 1)
"""
