--[[
  Record the outcome of an attempt: succeeded, failed (not retryable) or cancelled. First writer wins (G2):
  if the job is already terminal the entry is acknowledged and the late result discarded and counted.
  Owner check: only the holder of the delivery (the job's live entry and its lease token, set by start) may
  write. A stale holder -- its entry was reclaimed by another consumer, or started again -- changes nothing:
  its entry is not acknowledged (it may be the new holder's), no result is written, even a success (the
  holder that now runs the job writes it); it is refused and counted (stale_writes).
  Safe to resend (G9): the written answer and a refusal are recorded against the call token (fields settled,
  refused); a resent copy answers the same and changes nothing (no second duplicate_results or stale_writes).
  The client derives the call token from the lease and what is written, so the worker's own retry of the same
  write is a resend too. A copy so late that another delivery has written since is refused (TERMINAL or
  STALE_OWNER) and changes nothing but those counters.

  KEYS[1] stream of the delivery's entry: the job's lane
  KEYS[2] stats
  KEYS[3] events
  KEYS[4] tenants (unfinished jobs per tenant)
  KEYS[5] job record
  KEYS[6] done (long-poll wakeup)

  ARGV[1] entry id
  ARGV[2] status: succeeded | failed | cancelled
  ARGV[3] result JSON ("" for none)
  ARGV[4] error JSON ("" for none)
  ARGV[5] now (ms)
  ARGV[6] result TTL (s)
  ARGV[7] events max length
  ARGV[8] lease token of the delivery (from start)
  ARGV[9] call token (the same for the same write of one delivery: queue.settle_token)

  Returns
    0                  written (a number: the cheapest reply to convert; a resent copy answers it too)
    -1 NOT_FOUND       entry acknowledged
    -4 TERMINAL        {-4, status}: duplicate result, discarded and counted (duplicate_results); acknowledged
    -8 STALE_OWNER     the caller no longer holds the delivery: nothing changed, counted (stale_writes)
]]
local rcall = redis.call
local streamKey, statsKey, eventsKey, tenantsKey, jobKey, doneKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local entryId, newStatus, resultJson, errorJson = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now, resultTtl, eventsMaxlen, lease, call = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]

--- @include "ackEntry"
--- @include "replay"
--- @include "terminate"
--- @include "settleGuard"

local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'lease', 'settled', 'refused', 'tenant', 'webhook_url',
  'created_at')
local refusal = settleGuard(streamKey, statsKey, jobKey, entryId, lease, call, job, true)
if refusal then
  return refusal
end
local jobId = job[1]

ackEntry(streamKey, entryId)
local extra = {}
if resultJson ~= '' then
  table.insert(extra, 'result')
  table.insert(extra, resultJson)
end
if errorJson ~= '' then
  table.insert(extra, 'error')
  table.insert(extra, errorJson)
end
-- the answer is recorded by terminate's own HSET: one command less on the hot path
table.insert(extra, 'settled')
table.insert(extra, call .. '|0')  -- memo(call, 0) without encoding the constant answer
terminate(jobKey, doneKey, statsKey, tenantsKey, eventsKey, jobId, newStatus, now, resultTtl, eventsMaxlen, extra,
  {job[7], job[8], job[9]})
return 0
