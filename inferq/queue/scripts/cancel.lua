--[[
  Cancel a job for its tenant. Queued (in the stream or waiting out a backoff): cancelled at once, its entry
  removed. Running: cancellation is requested; the worker holding it sees the flag on its next lease renewal,
  aborts the backend call and finishes it cancelled (or a reclaiming worker ends it, if that worker died).
  Safe to resend (G9): the answer is recorded against the call token (field cancel_call), so a resent copy
  of a cancel that succeeded answers as it did, never "already terminal".

  KEYS[1] stream of the normal lane
  KEYS[2] stream of the high lane
  KEYS[3] stream of the low lane
  KEYS[4] stats
  KEYS[5] events
  KEYS[6] delayed
  KEYS[7] tenants (unfinished jobs per tenant)
  KEYS[8] job record
  KEYS[9] done (long-poll wakeup)
  KEYS[10] usage of the hour (keys.usage_hour of now; includes/meter): a job cancelled here is counted there
  KEYS[11] per-tenant bounds (keys.bounds): a job ended here is charged to its tenant (includes/holdRecord)

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
local statsKey, eventsKey, delayedKey = KEYS[4], KEYS[5], KEYS[6]
local tenantsKey, jobKey, doneKey = KEYS[7], KEYS[8], KEYS[9]
local tenant, now, resultTtl, eventsMaxlen, call = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local METER = {hour = KEYS[10], hourUntil = ARGV[6]}
local HOLDS = KEYS[11]

--- @include "ackEntry"
--- @include "replay"
--- @include "terminate"
--- @include "laneStream"

local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'tenant', 'cancel_call', 'lane')
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
if entry and entry ~= '' then
  ackEntry(laneStream(1, job[6]), entry)
end
rcall('ZREM', delayedKey, jobId)
terminate(jobKey, doneKey, statsKey, tenantsKey, eventsKey, jobId, 'cancelled', now, resultTtl, eventsMaxlen,
  {'error', '{"type":"cancelled","message":"the job was cancelled before it ran"}'})
return remember(jobKey, 'cancel_call', call, {0})
