#!lua flags=no-writes
--[[
  One read-only look at a queue for the scaler and GET /v1/scale. Lag and pending count every lane.
  Every acknowledged entry is deleted, so XLEN = lag + pending exactly; lag never depends on the group's
  lag field (NULL after deletions). A missing stream or group reads as empty, never as an error.
  Lag counts the jobs waiting for admission too (G10: they wait for a worker as much as the stream's entries do),
  and the waiting jobs of each tenant are counted per lane, among the next MAX_SCAN to be admitted (a tenant's
  part of a longer backlog is its part of those).

  KEYS[1..9] three per lane, in LANE_KEYS order (keys.fair_lanes): stream, waiting jobs, tags
  KEYS[10] delayed
  KEYS[11] stats
  KEYS[12] workers
  KEYS[13] scale
  KEYS[14] dlq

  ARGV[1] now (ms)
  ARGV[2] heartbeat age (ms) past which a worker counts as gone
  ARGV[3] "1": count each tenant's waiting jobs too (GET /v1/scale; the scaler's ticks need only the totals)

  Returns {lag, pending, delayed, delayed_due, unfinished, workers_live, workers_busy, in_flight,
           oldest_entry_ms, group_missing, dlq_length, desired, reason, at, lag of each lane in LANE_KEYS order,
           jobs waiting for admission in each lane in LANE_KEYS order, then for each lane and each tenant with jobs
           waiting in it: the lane, the tenant, its jobs waiting}
  (oldest_entry_ms: the oldest entry of any lane; group_missing: of any lane)
]]
local rcall = redis.call
local delayedKey, statsKey, workersKey, scaleKey, dlqKey = KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local now, stale = tonumber(ARGV[1]), tonumber(ARGV[2])
local MAX_SCAN = 10000

local lag, pending, groupMissing, oldest = 0, 0, 0, 0
local laneLags, laneWaiting, byTenant = {}, {}, {}
for i = 1, #LANE_KEYS do
  local streamKey, jobsKey = KEYS[3 * i - 2], KEYS[3 * i - 1]
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
  local waiting = rcall('ZCARD', jobsKey)
  if waiting > 0 and ARGV[3] == '1' then
    local counts = {}
    for _, member in ipairs(rcall('ZRANGE', jobsKey, -MAX_SCAN, -1)) do
      local tenant = string.sub(member, 1, string.find(member, '|', 1, true) - 1)
      counts[tenant] = (counts[tenant] or 0) + 1
    end
    for tenant, count in pairs(counts) do
      byTenant[#byTenant + 1] = LANE_KEYS[i]
      byTenant[#byTenant + 1] = tenant
      byTenant[#byTenant + 1] = count
    end
  end
  laneWaiting[i] = waiting
  laneLags[i] = length - lanePending + waiting
  lag = lag + length - lanePending + waiting
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
local out = {lag, pending, delayed, due, unfinished, live, busy, inFlight, oldest, groupMissing, rcall('XLEN', dlqKey),
  scale[1] or '', scale[2] or '', scale[3] or ''}
for i = 1, #LANE_KEYS do
  out[#out + 1] = laneLags[i]
end
for i = 1, #LANE_KEYS do
  out[#out + 1] = laneWaiting[i]
end
for _, value in ipairs(byTenant) do
  out[#out + 1] = value
end
return out
