#!lua flags=no-writes
--[[
  One read-only look at a queue for the scaler and GET /v1/scale. Lag and pending count every lane.
  Every acknowledged entry is deleted, so XLEN = lag + pending exactly; lag never depends on the group's
  lag field (NULL after deletions). A missing stream or group reads as empty, never as an error.

  KEYS[1] stream of the normal lane
  KEYS[2] stream of the high lane
  KEYS[3] stream of the low lane
  KEYS[4] delayed
  KEYS[5] stats
  KEYS[6] workers
  KEYS[7] scale
  KEYS[8] dlq

  ARGV[1] now (ms)
  ARGV[2] heartbeat age (ms) past which a worker counts as gone

  Returns {lag, pending, delayed, delayed_due, unfinished, workers_live, workers_busy, in_flight,
           oldest_entry_ms, group_missing, dlq_length, desired, reason, at, lag of each lane in LANE_KEYS order}
  (oldest_entry_ms: the oldest entry of any lane; group_missing: of any lane)
]]
local rcall = redis.call
local delayedKey, statsKey, workersKey, scaleKey, dlqKey = KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local now, stale = tonumber(ARGV[1]), tonumber(ARGV[2])

local lag, pending, groupMissing, oldest = 0, 0, 0, 0
local laneLags = {}
for i = 1, #LANE_KEYS do
  local streamKey = KEYS[i]
  local length = rcall('XLEN', streamKey)
  local lanePending = 0
  if length > 0 then
    local ok, summary = pcall(rcall, 'XPENDING', streamKey, GROUP)
    if ok then
      lanePending = tonumber(summary[1]) or 0
    else
      groupMissing = 1
    end
    local first = rcall('XRANGE', streamKey, '-', '+', 'COUNT', 1)
    if first[1] then
      local at = tonumber(string.match(first[1][1], '^(%d+)-'))
      if oldest == 0 or at < oldest then
        oldest = at
      end
    end
  end
  laneLags[i] = length - lanePending
  lag = lag + length - lanePending
  pending = pending + lanePending
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
return {lag, pending, delayed, due, unfinished, live, busy, inFlight, oldest, groupMissing, rcall('XLEN', dlqKey),
  scale[1] or '', scale[2] or '', scale[3] or '', unpack(laneLags)}
