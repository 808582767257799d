--[[
  A retryable failure: acknowledge the old entry and, in the same step, either queue the next attempt
  (at once, or in the delayed set for its backoff) or, past max attempts, fail the job and dead-letter it.
  No crash window can leave two live entries for one job (G3).
  Owner check as in finish: a caller that no longer holds the delivery (entry and lease token) changes
  nothing -- it acknowledges nothing, adds no attempt and ends nothing -- and is counted (stale_writes).
  Safe to resend (G9): the answer is recorded against the call token (fields settled, refused); a resent copy
  answers the same and adds no second entry.
  The client derives the call token from the lease and what is written, so the worker's own retry of the same
  write is a resend too. A copy so late that another delivery has written since is refused (TERMINAL or
  STALE_OWNER) and changes nothing but those counters.
  The next attempt queued at once goes where its lane takes it from (includes/fairPlace, G10): behind its tenant's
  jobs waiting for admission when jobs wait, so a retry takes its tenant's turn like any job.

  KEYS[1] stream of the delivery's entry: the job's lane, where the next attempt goes too
  KEYS[2] stats
  KEYS[3] events
  KEYS[4] delayed
  KEYS[5] dlq
  KEYS[6] tenants (unfinished jobs per tenant)
  KEYS[7] job record
  KEYS[8] done (long-poll wakeup)
  KEYS[9] dlq index (per tenant: keys.dlq_index)
  KEYS[10] usage of the hour (keys.usage_hour of now; includes/meter): a job this ends is counted there
  KEYS[11] per-tenant bounds (keys.bounds): a job ended here is charged to its tenant (includes/holdRecord); a
           poison job dead-lettered here is an engine death against its tenant (includes/holdStrike)
  KEYS[12..13] the lane's fair-share keys (keys.fair_lane after its stream): waiting jobs, tags

  ARGV[1] entry id
  ARGV[2] now (ms)
  ARGV[3] backoff delay (ms; 0 = re-add at once)
  ARGV[4] max attempts
  ARGV[5] error JSON of this attempt
  ARGV[6] result TTL (s)
  ARGV[7] events max length
  ARGV[8] lease token of the delivery (from start)
  ARGV[9] call token (the same for the same write of one delivery: queue.settle_token)
  ARGV[10] (optional) a poison reason (engine_died: the model server died running the job): the attempt adds a
           strike to the job (field strikes); at ARGV[11] strikes it is dead-lettered now whatever its attempts,
           with this reason. Empty or absent: retry as usual
  ARGV[11] strikes that make the job poison (1: at once)
  ARGV[12] run ms of the job's attempts, this one's included (field run_ms: its ending counts them in its usage;
           the client adds this attempt's to the record's as its delivery read it, which only the delivery's own
           writes change); "" to leave the field as it is
  ARGV[13] GPU ms of the job's attempts likewise (the workers' shares of their busy time; field gpu_ms)
  ARGV[14] when the hour's usage expires (unix s; "0": metering off)
  ARGV[15] engine deaths that start a tenant's cool-off (INFERQ_ENGINE_STRIKES; 0: none)
  ARGV[16] within how long (ms; INFERQ_ENGINE_STRIKE_WINDOW_S)
  ARGV[17] how long the cool-off lasts (ms; INFERQ_ENGINE_COOLOFF_S)
  ARGV[18] "1": fair share (else the next attempt goes straight into the stream)

  Returns
    {1, attempt, due_ms}   next attempt queued (due_ms 0: in the stream or waiting for admission now; else in the
                           delayed set)
    {2}                    attempts exhausted (or poison): failed and dead-lettered
    -1 NOT_FOUND           entry acknowledged
    -4 TERMINAL            {-4, status}: late failure of a finished job, discarded and counted; acknowledged
    -7 ENDED               {-7, "cancelled"}: cancellation was requested, so the job ends cancelled
    -8 STALE_OWNER         the caller no longer holds the delivery: nothing changed, counted (stale_writes)
]]
local rcall = redis.call
local streamKey, statsKey, eventsKey, delayedKey, dlqKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local tenantsKey, jobKey, doneKey, dlqIndexKey = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local entryId, now, delay, maxAttempts = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local errorJson, resultTtl, eventsMaxlen, lease, call = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local poison = ARGV[10]
local strikesNeeded = tonumber(ARGV[11])
local METER = {hour = KEYS[10], hourUntil = ARGV[14]}
local HOLDS = KEYS[11]
local fair = ARGV[18] == '1'


--- @include "ackEntry"
--- @include "replay"
--- @include "terminate"
--- @include "deadLetter"
--- @include "settleGuard"
--- @include "holdStrike"
--- @include "fairLane"
--- @include "undelivered"
--- @include "fairPlace"
--- @include "fairCost"

local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'lease', 'settled', 'refused', 'attempts', 'cancel',
  'tenant', 'work', 'weight')
local refusal = settleGuard(streamKey, statsKey, jobKey, entryId, lease, call, job, true)
if refusal then
  return refusal
end
local jobId, attempts, cancel = job[1], tonumber(job[7] or '1'), job[8]
if (ARGV[12] or '') ~= '' then  -- the attempts' time, counted when the job ends (meter: from the record)
  rcall('HSET', jobKey, 'run_ms', ARGV[12], 'gpu_ms', ARGV[13])
end

ackEntry(streamKey, entryId)
if cancel == '1' then
  terminate(jobKey, doneKey, statsKey, tenantsKey, eventsKey, jobId, 'cancelled', now, resultTtl, eventsMaxlen,
    {'error', '{"type":"cancelled","message":"the job was cancelled"}'})
  return remember(jobKey, 'settled', call, {CODE_ENDED, 'cancelled'})
end
local poisoned = false
if poison ~= '' then
  poisoned = rcall('HINCRBY', jobKey, 'strikes', 1) >= strikesNeeded
end
if poisoned or attempts >= maxAttempts then
  deadLetter(jobKey, doneKey, statsKey, tenantsKey, eventsKey, dlqKey, dlqIndexKey, jobId, now, resultTtl,
    eventsMaxlen,
    poisoned and poison or 'max_attempts', errorJson)
  if poisoned then  -- its tenant's jobs killed the engine once more: past its strikes, a cool-off
    holdStrike(job[9] or '', now, tonumber(ARGV[15] or '0') or 0,
      tonumber(ARGV[16] or '0') or 0, tonumber(ARGV[17] or '0') or 0)
  end
  return remember(jobKey, 'settled', call, {2})
end

attempts = attempts + 1
rcall('HINCRBY', statsKey, 'retried', 1)
-- the record keeps the last attempt's error to its end: part of what its tenant is charged for then (field hold)
rcall('HINCRBY', jobKey, 'hold', #errorJson - rcall('HSTRLEN', jobKey, 'last_error'))
rcall('HSET', jobKey, 'status', 'queued', 'attempts', attempts, 'deliveries', '0', 'last_error', errorJson)
rcall('HDEL', jobKey, 'lease')
if delay > 0 then
  local due = now + delay
  rcall('HSET', jobKey, 'entry', '')
  rcall('ZADD', delayedKey, due, jobId)
  return remember(jobKey, 'settled', call, {1, attempts, due})
end
local lane = fairLane(streamKey, 12)
rcall('HSET', jobKey, 'entry', fairPlace(lane, jobId, job[9], attempts, fairCost(job[10], job[11]), false, fair))
fairFlush(lane)
return remember(jobKey, 'settled', call, {1, attempts, 0})
