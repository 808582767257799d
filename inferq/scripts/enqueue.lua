--[[
  Accept a job: idempotency check, depth limit, job record, stream entry and counters in one atomic step,
  so two concurrent submits with one idempotency key can never make two jobs or two entries.

  KEYS[1] stream
  KEYS[2] stats
  KEYS[3] job record of the new id
  KEYS[4] idempotency key (optional)

  ARGV[1] job id
  ARGV[2] tenant
  ARGV[3] request digest
  ARGV[4] max unfinished jobs (0 = no limit)
  ARGV[5] now (ms)
  ARGV[6] idempotency key TTL (s)
  ARGV[7..] more job fields, as name/value pairs

  Returns
    {0, id, entry}     created
    {1, id}            replayed: the idempotency key was seen with the same request
    -2 CONFLICT        {-2, id}: the key was seen with another request
    -3 QUEUE_FULL      {-3, unfinished}
]]
local rcall = redis.call
local streamKey, statsKey, jobKey, idemKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local jobId, tenant, digest = ARGV[1], ARGV[2], ARGV[3]
local maxDepth, now, idemTtl = tonumber(ARGV[4]), ARGV[5], ARGV[6]

if idemKey then
  local seen = rcall('GET', idemKey)
  if seen then
    local sep = string.find(seen, ' ', 1, true)
    local seenId = string.sub(seen, 1, sep - 1)
    if string.sub(seen, sep + 1) == digest then
      return {1, seenId}
    end
    return {-2, seenId}
  end
end

if maxDepth > 0 then
  local unfinished = tonumber(rcall('HGET', statsKey, 'unfinished') or '0')
  if unfinished >= maxDepth then
    return {-3, unfinished}
  end
end

local entry = rcall('XADD', streamKey, '*', 'job', jobId, 'attempt', '1')
rcall('HSET', jobKey, 'id', jobId, 'tenant', tenant, 'status', 'queued', 'attempts', '1', 'deliveries', '0',
  'created_at', now, 'entry', entry, 'digest', digest, unpack(ARGV, 7))
rcall('HINCRBY', statsKey, 'unfinished', 1)
rcall('HINCRBY', statsKey, 'enqueued', 1)
if idemKey then
  rcall('SET', idemKey, jobId .. ' ' .. digest, 'EX', idemTtl)
end
return {0, jobId, entry}
