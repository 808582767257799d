--[[
  Record the outcome of an attempt: succeeded, failed (not retryable) or cancelled. First writer wins (G2):
  if the job is already terminal the entry is acknowledged and the late result discarded and counted.
  A success from an older attempt is still accepted (the work was done); a failure or cancel from a stale
  entry is discarded, because a newer attempt is in charge.

  KEYS[1] stream
  KEYS[2] stats
  KEYS[3] events
  KEYS[4] delayed
  KEYS[5] job record
  KEYS[6] done (long-poll wakeup)

  ARGV[1] entry id
  ARGV[2] status: succeeded | failed | cancelled
  ARGV[3] result JSON ("" for none)
  ARGV[4] error JSON ("" for none)
  ARGV[5] now (ms)
  ARGV[6] result TTL (s)
  ARGV[7] events max length

  Returns
    {0}                written
    -1 NOT_FOUND
    -4 TERMINAL        {-4, status}: duplicate result, discarded and counted (duplicate_results)
    -5 STALE           failure from an entry that is no longer the job's live entry; discarded
]]
local rcall = redis.call
local streamKey, statsKey, eventsKey, delayedKey, jobKey, doneKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local entryId, newStatus, resultJson, errorJson = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now, resultTtl, eventsMaxlen = ARGV[5], ARGV[6], ARGV[7]

--- @include "ackEntry"
--- @include "isTerminal"
--- @include "terminate"

ackEntry(streamKey, entryId)
local job = rcall('HMGET', jobKey, 'id', 'status', 'entry')
local jobId, status, entry = job[1], job[2], job[3]
if not jobId then
  return {-1}
end
if TERMINAL[status] then
  rcall('HINCRBY', statsKey, 'duplicate_results', 1)
  return {-4, status}
end
if entry ~= entryId then
  if newStatus ~= 'succeeded' then
    return {-5}
  end
  -- a newer attempt is queued or running: take it back, the job is done
  if entry and entry ~= '' then
    ackEntry(streamKey, entry)
  end
  rcall('ZREM', delayedKey, jobId)
end

local extra = {}
if resultJson ~= '' then
  table.insert(extra, 'result')
  table.insert(extra, resultJson)
end
if errorJson ~= '' then
  table.insert(extra, 'error')
  table.insert(extra, errorJson)
end
terminate(jobKey, doneKey, statsKey, eventsKey, jobId, newStatus, now, resultTtl, eventsMaxlen, extra)
return {0}
