--[[
  Re-enqueue a dead-lettered job for its tenant with its attempts reset; it leaves the dead-letter stream.

  KEYS[1] stream
  KEYS[2] stats
  KEYS[3] dlq
  KEYS[4] job record
  KEYS[5] done (long-poll wakeup)

  ARGV[1] tenant
  ARGV[2] now (ms)

  Returns
    {0, entry}              queued again
    -1 NOT_FOUND            unknown, or another tenant's
    -6 NOT_DEAD_LETTERED    {-6, status}
]]
local rcall = redis.call
local streamKey, statsKey, dlqKey, jobKey, doneKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local tenant = ARGV[1]

local job = rcall('HMGET', jobKey, 'id', 'status', 'tenant', 'dead_lettered', 'dlq_entry')
local jobId, status, owner, dead, dlqEntry = job[1], job[2], job[3], job[4], job[5]
if not jobId or owner ~= tenant then
  return {-1}
end
if dead ~= '1' then
  return {-6, status}
end
if dlqEntry and dlqEntry ~= '' then
  rcall('XDEL', dlqKey, dlqEntry)
end
rcall('PERSIST', jobKey)
rcall('DEL', doneKey)
rcall('HDEL', jobKey, 'result', 'error', 'last_error', 'started_at', 'finished_at', 'dlq_entry', 'cancel', 'worker',
  'expires_at')
local entry = rcall('XADD', streamKey, '*', 'job', jobId, 'attempt', '1')
rcall('HSET', jobKey, 'status', 'queued', 'attempts', '1', 'deliveries', '0', 'dead_lettered', '0', 'entry', entry,
  'redriven_at', ARGV[2])
rcall('HINCRBY', statsKey, 'unfinished', 1)
rcall('HINCRBY', statsKey, 'redriven', 1)
return {0, entry}
