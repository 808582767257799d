--[[
  A retryable failure: acknowledge the old entry and, in the same step, either queue the next attempt
  (at once, or in the delayed set for its backoff) or, past max attempts, fail the job and dead-letter it.
  No crash window can leave two live entries for one job (G3).

  KEYS[1] stream
  KEYS[2] stats
  KEYS[3] events
  KEYS[4] delayed
  KEYS[5] dlq
  KEYS[6] job record
  KEYS[7] done (long-poll wakeup)

  ARGV[1] entry id
  ARGV[2] now (ms)
  ARGV[3] backoff delay (ms; 0 = re-add at once)
  ARGV[4] max attempts
  ARGV[5] error JSON of this attempt
  ARGV[6] result TTL (s)
  ARGV[7] events max length

  Returns
    {1, attempt, due_ms}   next attempt queued (due_ms 0: in the stream now; else in the delayed set)
    {2}                    attempts exhausted: failed and dead-lettered
    -1 NOT_FOUND
    -4 TERMINAL            {-4, status}: late failure of a finished job, discarded and counted
    -5 STALE               the entry is not the job's live entry; discarded
    -7 ENDED               {-7, "cancelled"}: cancellation was requested, so the job ends cancelled
]]
local rcall = redis.call
local streamKey, statsKey, eventsKey, delayedKey, dlqKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local jobKey, doneKey = KEYS[6], KEYS[7]
local entryId, now, delay, maxAttempts = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local errorJson, resultTtl, eventsMaxlen = ARGV[5], ARGV[6], ARGV[7]

--- @include "ackEntry"
--- @include "isTerminal"
--- @include "terminate"
--- @include "deadLetter"

ackEntry(streamKey, entryId)
local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'attempts', 'cancel')
local jobId, status, entry, attempts, cancel = job[1], job[2], job[3], tonumber(job[4] or '1'), job[5]
if not jobId then
  return {-1}
end
if TERMINAL[status] then
  rcall('HINCRBY', statsKey, 'duplicate_results', 1)
  return {-4, status}
end
if entry ~= entryId then
  return {-5}
end
if cancel == '1' then
  terminate(jobKey, doneKey, statsKey, eventsKey, jobId, 'cancelled', now, resultTtl, eventsMaxlen,
    {'error', '{"type":"cancelled","message":"the job was cancelled"}'})
  return {-7, 'cancelled'}
end
if attempts >= maxAttempts then
  deadLetter(jobKey, doneKey, statsKey, eventsKey, dlqKey, jobId, now, resultTtl, eventsMaxlen, 'max_attempts', errorJson)
  return {2}
end

attempts = attempts + 1
rcall('HINCRBY', statsKey, 'retried', 1)
rcall('HSET', jobKey, 'status', 'queued', 'attempts', attempts, 'deliveries', '0', 'last_error', errorJson)
if delay > 0 then
  local due = now + delay
  rcall('HSET', jobKey, 'entry', '')
  rcall('ZADD', delayedKey, due, jobId)
  return {1, attempts, due}
end
local newEntry = rcall('XADD', streamKey, '*', 'job', jobId, 'attempt', attempts)
rcall('HSET', jobKey, 'entry', newEntry)
return {1, attempts, 0}
