--[[
  Move retries whose backoff is over from the delayed set into the stream. The caller reads candidates with
  ZRANGEBYSCORE and passes their job keys; each is checked again here, so two workers promoting at once
  cannot add one job twice.

  KEYS[1] stream
  KEYS[2] delayed
  KEYS[3..n] job records

  ARGV[1] now (ms)
  ARGV[2..n] job ids, in the order of the job keys

  Returns the number of jobs promoted.
]]
local rcall = redis.call
local streamKey, delayedKey = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])

local promoted = 0
for i = 3, #KEYS do
  local jobId = ARGV[i - 1]
  local due = rcall('ZSCORE', delayedKey, jobId)
  if due and tonumber(due) <= now then
    rcall('ZREM', delayedKey, jobId)
    local job = rcall('HMGET', KEYS[i], 'status', 'attempts', 'entry')
    if job[1] == 'queued' and (not job[3] or job[3] == '') then
      local entry = rcall('XADD', streamKey, '*', 'job', jobId, 'attempt', job[2])
      rcall('HSET', KEYS[i], 'entry', entry)
      promoted = promoted + 1
    end
  end
end
return promoted
