--[[
  Give a job back without spending an attempt (worker shutdown): the old entry is acknowledged and a new one
  added in the same step, so the job is at once available to other workers instead of after the claim-idle time.
  The delivery it had does not count against max deliveries.
  Owner check as in finish: a caller that no longer holds the delivery (entry and lease token) changes nothing
  -- no acknowledgement, no new entry -- and is counted (stale_writes).
  Safe to resend (G9): the answer is recorded against the call token (fields settled, refused); a resent copy
  answers the same and adds no second entry.
  The client derives the call token from the lease and what is written, so the worker's own retry of the same
  write is a resend too. A copy so late that another delivery has written since is refused (TERMINAL or
  STALE_OWNER) and changes nothing but those counters.
  The job goes back where its lane takes it from (includes/fairPlace, G10): when jobs wait for admission, among
  them at the lane's virtual time and not charged again (it had its turn), else straight into the stream.

  KEYS[1] stream of the delivery's entry: the job's lane, where the new entry goes too
  KEYS[2] stats
  KEYS[3] job record
  KEYS[4..5] the lane's fair-share keys (keys.fair_lane after its stream): waiting jobs, tags

  ARGV[1] entry id
  ARGV[2] lease token of the delivery (from start)
  ARGV[3] call token (the same for the same write of one delivery: queue.settle_token)
  ARGV[4] run ms of the job's attempts, this one's included (field run_ms; the attempt ran until given
          back, and the job's ending counts every attempt's time in its usage, includes/meter); as retry's ARGV[12]
  ARGV[5] GPU ms of the job's attempts likewise (field gpu_ms)
  ARGV[6] "1": fair share (else the job goes straight into the stream)

  Returns
    {0, entry}       released under a new entry (or w:<its member of the lane's waiting jobs>)
    -1 NOT_FOUND     entry acknowledged
    -4 TERMINAL      {-4, status}: nothing to give back; entry acknowledged
    -8 STALE_OWNER   the caller no longer holds the delivery: nothing changed, counted (stale_writes)
]]
local rcall = redis.call
local streamKey, statsKey, jobKey = KEYS[1], KEYS[2], KEYS[3]
local entryId, lease, call = ARGV[1], ARGV[2], ARGV[3]

--- @include "ackEntry"
--- @include "replay"
--- @include "settleGuard"
--- @include "fairLane"
--- @include "undelivered"
--- @include "fairPlace"
--- @include "fairCost"

local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'lease', 'settled', 'refused', 'attempts', 'deliveries',
  'tenant', 'work', 'weight')
local refusal = settleGuard(streamKey, statsKey, jobKey, entryId, lease, call, job, false)
if refusal then
  return refusal
end
local jobId, attempts, deliveries = job[1], job[7], tonumber(job[8] or '0')
ackEntry(streamKey, entryId)
local lane = fairLane(streamKey, 4)
local newEntry = fairPlace(lane, jobId, job[9], attempts, fairCost(job[10], job[11]), true, ARGV[6] == '1')
fairFlush(lane)
rcall('HSET', jobKey, 'status', 'queued', 'entry', newEntry, 'deliveries', math.max(deliveries - 1, 0))
if (ARGV[4] or '') ~= '' then
  rcall('HSET', jobKey, 'run_ms', ARGV[4], 'gpu_ms', ARGV[5])
end
rcall('HDEL', jobKey, 'lease')
rcall('HINCRBY', statsKey, 'released', 1)
return remember(jobKey, 'settled', call, {0, newEntry})
