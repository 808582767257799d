--[[
  Give a job back without spending an attempt (worker shutdown): the old entry is acknowledged and a new one
  added in the same step, so the job is at once available to other workers instead of after the claim-idle time.
  The delivery it had does not count against max deliveries.

  KEYS[1] stream
  KEYS[2] stats
  KEYS[3] job record

  ARGV[1] entry id

  Returns
    {0, entry}     released under a new entry
    -1 NOT_FOUND   entry acknowledged
    -4 TERMINAL    {-4, status}: nothing to give back; entry acknowledged
    -5 STALE       entry acknowledged
]]
local rcall = redis.call
local streamKey, statsKey, jobKey = KEYS[1], KEYS[2], KEYS[3]
local entryId = ARGV[1]

--- @include "ackEntry"
--- @include "isTerminal"

ackEntry(streamKey, entryId)
local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'attempts', 'deliveries')
local jobId, status, entry, attempts, deliveries = job[1], job[2], job[3], job[4], tonumber(job[5] or '0')
if not jobId then
  return {-1}
end
if TERMINAL[status] then
  return {-4, status}
end
if entry ~= entryId then
  return {-5}
end
local newEntry = rcall('XADD', streamKey, '*', 'job', jobId, 'attempt', attempts)
rcall('HSET', jobKey, 'status', 'queued', 'entry', newEntry, 'deliveries', math.max(deliveries - 1, 0))
rcall('HINCRBY', statsKey, 'released', 1)
return {0, newEntry}
