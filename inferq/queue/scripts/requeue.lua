--[[
  Give back an entry that was read but never started: a worker's blocking read across the lanes can answer more
  entries than it has free slots (COUNT applies per stream), and it never holds more than its window. The entry
  is acknowledged and a new one added to the end of the same stream (the job's lane) in one step; the job's
  deliveries and attempts are untouched, since start never ran.
  An entry that is no longer the job's live entry, or whose job ended or is gone, is only acknowledged. An entry
  that fair admission added (it carries the job's member of the waiting set, field fair) is the job's live entry
  while the job still says waiting with that member; the new entry is the job's own (it had its turn: admission
  put it where the workers take from, and so does this).
  Safe to resend (G9): the answer is recorded against the call token (field requeue_call); a resent copy answers
  the same and adds no second entry.

  KEYS[1] stream the entry was read from
  KEYS[2] job record

  ARGV[1] entry id
  ARGV[2] call token (random, one per call)

  Returns
    {0, entry}     given back under a new entry
    -1 NOT_FOUND   entry acknowledged
    -5 STALE       {-5, status}: not the job's live entry (or not queued); acknowledged
]]
local rcall = redis.call
local streamKey, jobKey = KEYS[1], KEYS[2]
local entryId, call = ARGV[1], ARGV[2]

--- @include "ackEntry"
--- @include "replay"

local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'attempts', 'requeue_call')
local jobId, status, entry = job[1], job[2], job[3]
if not jobId then
  ackEntry(streamKey, entryId)
  return {CODE_NOT_FOUND}
end
local again = replayed(jobKey, 'requeue_call', job[5], call)
if again then
  return again
end
ackEntry(streamKey, entryId)
local live = entry == entryId or (entry and string.byte(entry) == 119)  -- 'w': admitted (includes/fairPlace)
if not live or status ~= 'queued' then
  return remember(jobKey, 'requeue_call', call, {CODE_STALE, status})
end
local newEntry = rcall('XADD', streamKey, '*', 'job', jobId, 'attempt', job[4])
rcall('HSET', jobKey, 'entry', newEntry)
return remember(jobKey, 'requeue_call', call, {0, newEntry})
