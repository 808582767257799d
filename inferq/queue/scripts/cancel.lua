--[[
  Cancel a job for its tenant. Queued (in the stream, waiting for admission or waiting out a backoff): cancelled at
  once, taken out of where it waits (includes/fairRemove). Running: cancellation is requested; the worker holding
  it sees the flag on its next lease renewal, aborts the backend call and finishes it cancelled (or a reclaiming worker ends it, if that worker died).
  Safe to resend (G9): the answer is recorded against the call token (field cancel_call), so a resent copy
  of a cancel that succeeded answers as it did, never "already terminal".

  KEYS[1..9] three per lane, in LANE_KEYS order (keys.fair_lanes): stream, waiting jobs, tags
  KEYS[10] stats
  KEYS[11] events
  KEYS[12] delayed
  KEYS[13] tenants (unfinished jobs per tenant)
  KEYS[14] job record
  KEYS[15] done (long-poll wakeup)
  KEYS[16] usage of the hour (keys.usage_hour of now; includes/meter): a job cancelled here is counted there
  KEYS[17] per-tenant bounds (keys.bounds): a job ended here is charged to its tenant (includes/holdRecord)

  ARGV[1] tenant
  ARGV[2] now (ms)
  ARGV[3] result TTL (s)
  ARGV[4] events max length
  ARGV[5] call token (random, one per call)
  ARGV[6] when the hour's usage expires (unix s; "0": metering off)

  Returns
    {0}            cancelled now
    {1}            running: cancellation requested
    -1 NOT_FOUND   unknown, or another tenant's
    -4 TERMINAL    {-4, status}
]]
local rcall = redis.call
local statsKey, eventsKey, delayedKey = KEYS[10], KEYS[11], KEYS[12]
local tenantsKey, jobKey, doneKey = KEYS[13], KEYS[14], KEYS[15]
local tenant, now, resultTtl, eventsMaxlen, call = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local METER = {hour = KEYS[16], hourUntil = ARGV[6]}
local HOLDS = KEYS[17]

--- @include "replay"
--- @include "terminate"
--- @include "fairLane"
--- @include "fairCost"
--- @include "fairAdmit"
--- @include "fairRemove"

local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'tenant', 'cancel_call', 'lane', 'work', 'weight')
local jobId, status, entry, owner = job[1], job[2], job[3], job[4]
if not jobId or owner ~= tenant then
  return {CODE_NOT_FOUND}
end
local again = replayed(jobKey, 'cancel_call', job[5], call)
if again then
  return again
end
if TERMINAL[status] then
  return {CODE_TERMINAL, status}
end
if status == 'running' then
  rcall('HSET', jobKey, 'cancel', '1')
  return remember(jobKey, 'cancel_call', call, {1})
end
fairRemove(jobKey, jobId, job[6], entry, fairCost(job[7], job[8]))
rcall('ZREM', delayedKey, jobId)
terminate(jobKey, doneKey, statsKey, tenantsKey, eventsKey, jobId, 'cancelled', now, resultTtl, eventsMaxlen,
  {'error', '{"type":"cancelled","message":"the job was cancelled before it ran"}'})
return remember(jobKey, 'cancel_call', call, {0})
