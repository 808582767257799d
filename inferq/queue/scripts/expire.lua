--[[
  Expire a job whose ttl_s passed before any attempt started, wherever it waits (stream, admission, delayed set:
  includes/fairRemove), so it leaves the unfinished count at once instead of when a worker next has a free slot.
  Called by the scaler's and the workers' sweeps over the expiry index, and by the gateway when it reads such a job.
  A job that started, or already ended, just leaves the index.
  Safe to resend (G9): a copy that finds the job expired at its own now (finished_at = ARGV[2]) answers
  "expired now" again and changes nothing. (Two sweeps that expire one job in the same millisecond both say
  so; the answer only feeds a count.)

  KEYS[1..9] three per lane, in LANE_KEYS order (keys.fair_lanes): stream, waiting jobs, tags
  KEYS[10] stats
  KEYS[11] events
  KEYS[12] delayed
  KEYS[13] expiry
  KEYS[14] tenants (unfinished jobs per tenant)
  KEYS[15] job record
  KEYS[16] done (long-poll wakeup)
  KEYS[17] usage of the hour (keys.usage_hour of now; includes/meter): a job expired here is counted there
  KEYS[18] per-tenant bounds (keys.bounds): a job ended here is charged to its tenant (includes/holdRecord)

  ARGV[1] job id
  ARGV[2] now (ms)
  ARGV[3] result TTL (s)
  ARGV[4] events max length
  ARGV[5] when the hour's usage expires (unix s; "0": metering off)

  Returns
    {0}            expired now
    {1}            not due, started or already ended: nothing to do (left the index unless not due)
    -1 NOT_FOUND
]]
local rcall = redis.call
local statsKey, eventsKey, delayedKey, expiryKey = KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local tenantsKey, jobKey, doneKey = KEYS[14], KEYS[15], KEYS[16]
local jobId, now, resultTtl, eventsMaxlen = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local METER = {hour = KEYS[17], hourUntil = ARGV[5]}
local HOLDS = KEYS[18]

--- @include "terminate"
--- @include "fairLane"
--- @include "fairCost"
--- @include "fairAdmit"
--- @include "fairRemove"

local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'expires_at', 'started_at', 'finished_at', 'lane',
  'work', 'weight')
local status, entry, expiresAt, startedAt = job[2], job[3], job[4], job[5]
if not job[1] then
  rcall('ZREM', expiryKey, jobId)
  return {CODE_NOT_FOUND}
end
if status == 'expired' and job[6] == ARGV[2] then
  return {0}
end
if TERMINAL[status] or status ~= 'queued' or (startedAt and startedAt ~= '') or not expiresAt or expiresAt == '' then
  rcall('ZREM', expiryKey, jobId)
  return {1}
end
if now <= tonumber(expiresAt) then
  return {1}
end
fairRemove(jobKey, job[1], job[7], entry, fairCost(job[8], job[9]))
rcall('ZREM', delayedKey, jobId)
rcall('ZREM', expiryKey, jobId)
terminate(jobKey, doneKey, statsKey, tenantsKey, eventsKey, jobId, 'expired', ARGV[2], resultTtl, eventsMaxlen,
  {'error', '{"type":"expired","message":"no attempt started within ttl_s"}'})
return {0}
