#!lua flags=no-writes
--[[
  One read-only look at a queue for the scaler and GET /v1/scale.
  Every acknowledged entry is deleted, so XLEN = lag + pending exactly; lag never depends on the group's
  lag field (NULL after deletions). A missing stream or group reads as empty, never as an error.

  KEYS[1] stream
  KEYS[2] delayed
  KEYS[3] stats
  KEYS[4] workers
  KEYS[5] scale
  KEYS[6] dlq

  ARGV[1] now (ms)
  ARGV[2] heartbeat age (ms) past which a worker counts as gone

  Returns {lag, pending, delayed, delayed_due, unfinished, workers_live, workers_busy, in_flight,
           oldest_entry_ms, group_missing, dlq_length, desired, reason, at}
]]
local rcall = redis.call
local streamKey, delayedKey, statsKey, workersKey, scaleKey, dlqKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now, stale = tonumber(ARGV[1]), tonumber(ARGV[2])

local length = rcall('XLEN', streamKey)
local pending, groupMissing, oldest = 0, 0, 0
if length > 0 then
  local ok, summary = pcall(rcall, 'XPENDING', streamKey, GROUP)
  if ok then
    pending = tonumber(summary[1]) or 0
  else
    groupMissing = 1
  end
  local first = rcall('XRANGE', streamKey, '-', '+', 'COUNT', 1)
  if first[1] then
    oldest = tonumber(string.match(first[1][1], '^(%d+)-'))
  end
end

local delayed = rcall('ZCARD', delayedKey)
local due = rcall('ZCOUNT', delayedKey, '-inf', now)
local unfinished = tonumber(rcall('HGET', statsKey, 'unfinished') or '0')

local live, busy, inFlight = 0, 0, 0
local workers = rcall('HGETALL', workersKey)
for i = 2, #workers, 2 do
  local beat, count = string.match(workers[i], '^(%d+) (%d+)')
  if beat and now - tonumber(beat) <= stale then
    live = live + 1
    count = tonumber(count)
    inFlight = inFlight + count
    if count > 0 then
      busy = busy + 1
    end
  end
end

local scale = rcall('HMGET', scaleKey, 'desired', 'reason', 'at')
return {length - pending, pending, delayed, due, unfinished, live, busy, inFlight, oldest, groupMissing, rcall('XLEN', dlqKey),
  scale[1] or '', scale[2] or '', scale[3] or ''}
