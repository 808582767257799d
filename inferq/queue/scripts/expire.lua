--[[
  Expire a job whose ttl_s passed before any attempt started, wherever it waits (stream, delayed set), so it
  leaves the unfinished count at once instead of when a worker next has a free slot. Called by the scaler's and
  the workers' sweeps over the expiry index, and by the gateway when it reads such a job.
  A job that started, or already ended, just leaves the index.
  Safe to resend (G9): a copy that finds the job expired at its own now (finished_at = ARGV[2]) answers
  "expired now" again and changes nothing. (Two sweeps that expire one job in the same millisecond both say
  so; the answer only feeds a count.)

  KEYS[1] stream of the normal lane
  KEYS[2] stream of the high lane
  KEYS[3] stream of the low lane
  KEYS[4] stats
  KEYS[5] events
  KEYS[6] delayed
  KEYS[7] expiry
  KEYS[8] tenants (unfinished jobs per tenant)
  KEYS[9] job record
  KEYS[10] done (long-poll wakeup)
  KEYS[11] usage of the hour (keys.usage_hour of now; includes/meter): a job expired here is counted there
  KEYS[12] per-tenant bounds (keys.bounds): a job ended here is charged to its tenant (includes/holdRecord)

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
local statsKey, eventsKey, delayedKey, expiryKey = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local tenantsKey, jobKey, doneKey = KEYS[8], KEYS[9], KEYS[10]
local jobId, now, resultTtl, eventsMaxlen = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local METER = {hour = KEYS[11], hourUntil = ARGV[5]}
local HOLDS = KEYS[12]

--- @include "ackEntry"
--- @include "terminate"
--- @include "laneStream"

local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'expires_at', 'started_at', 'finished_at', 'lane')
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
if entry and entry ~= '' then
  ackEntry(laneStream(1, job[7]), entry)
end
rcall('ZREM', delayedKey, jobId)
rcall('ZREM', expiryKey, jobId)
terminate(jobKey, doneKey, statsKey, tenantsKey, eventsKey, jobId, 'expired', ARGV[2], resultTtl, eventsMaxlen,
  {'error', '{"type":"expired","message":"no attempt started within ttl_s"}'})
return {0}
