--[[
  Accept a job: idempotency check, depth limit, job record, stream entry and counters in one atomic step,
  so two concurrent submits with one idempotency key can never make two jobs or two entries.
  The idempotency key holds the job id; the request digest is in the job record (field digest), which the
  client compares on a replay: a different request under the same key is a conflict.

  KEYS[1] stream
  KEYS[2] stats
  KEYS[3] expiry (jobs with a ttl_s, scored by the time they expire unless started)
  KEYS[4] job record of the new id
  KEYS[5] idempotency key (optional)

  ARGV[1] job id
  ARGV[2] tenant
  ARGV[3] request digest
  ARGV[4] max unfinished jobs (0 = no limit)
  ARGV[5] now (ms)
  ARGV[6] idempotency key TTL (s)
  ARGV[7] expires at (ms; "" when the job has no ttl_s)
  ARGV[8..] more job fields, as name/value pairs

  Returns
    {0, id, entry}     created
    {1, id}            the idempotency key was seen: the caller compares the request digests
    -3 QUEUE_FULL      {-3, unfinished}
]]
local rcall = redis.call
local streamKey, statsKey, expiryKey, jobKey, idemKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local jobId, tenant, digest = ARGV[1], ARGV[2], ARGV[3]
local maxDepth, now, idemTtl, expiresAt = tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7]

if idemKey then
  local seen = rcall('GET', idemKey)
  if seen then
    return {1, seen}
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
  'created_at', now, 'entry', entry, 'digest', digest, unpack(ARGV, 8))
if expiresAt ~= '' then
  rcall('HSET', jobKey, 'expires_at', expiresAt)
  rcall('ZADD', expiryKey, expiresAt, jobId)
end
rcall('HINCRBY', statsKey, 'unfinished', 1)
rcall('HINCRBY', statsKey, 'enqueued', 1)
if idemKey then
  rcall('SET', idemKey, jobId, 'EX', idemTtl)
end
return {0, jobId, entry}
