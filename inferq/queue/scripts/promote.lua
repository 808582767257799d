--[[
  Move retries whose backoff is over from the delayed set into the stream of each job's lane. The caller reads candidates with
  ZRANGEBYSCORE and passes their job keys; each is checked again here, so two workers promoting at once
  cannot add one job twice.
  Safe to resend (G9): each job promoted records the call token (field promoted_by); a resent copy counts the
  jobs it finds promoted under its token again, and adds nothing.

  KEYS[1] stream of the normal lane
  KEYS[2] stream of the high lane
  KEYS[3] stream of the low lane
  KEYS[4] delayed
  KEYS[5..n] job records

  ARGV[1] now (ms)
  ARGV[2] call token (random, one per call)
  ARGV[3..n] job ids, in the order of the job keys (ARGV[i] is the id of KEYS[i + 2])

  Returns the number of jobs promoted.
]]
local rcall = redis.call
local delayedKey = KEYS[4]
local now, call = tonumber(ARGV[1]), ARGV[2]

--- @include "laneStream"

local promoted = 0
for i = 5, #KEYS do
  local jobId = ARGV[i - 2]
  local due = rcall('ZSCORE', delayedKey, jobId)
  if due and tonumber(due) <= now then
    rcall('ZREM', delayedKey, jobId)
    local job = rcall('HMGET', KEYS[i], 'status', 'attempts', 'entry', 'lane')
    if job[1] == 'queued' and (not job[3] or job[3] == '') then
      local entry = rcall('XADD', laneStream(1, job[4]), '*', 'job', jobId, 'attempt', job[2])
      rcall('HSET', KEYS[i], 'entry', entry, 'promoted_by', call)
      promoted = promoted + 1
    end
  elseif not due and call ~= '' and rcall('HGET', KEYS[i], 'promoted_by') == call then
    promoted = promoted + 1
  end
end
return promoted
