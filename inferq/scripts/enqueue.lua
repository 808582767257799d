--[[
  Accept a job: idempotency check, depth limits, job record, stream entry and counters in one atomic step,
  so two concurrent submits with one idempotency key can never make two jobs or two entries.
  The idempotency key holds the job id; the request digest is in the job record (field digest), which the
  client compares on a replay: a different request under the same key is a conflict.
  Safe to resend (G9): the client generates the job id, so a resent copy finds the record it made and answers
  what the first run answered (its first entry is kept in the record as first_entry), adding nothing; that
  check comes before the idempotency key, so a first submission never comes back as a replay of itself.

  KEYS[1] stream of the job's lane (its lane is recorded in the job field lane, passed with the fields)
  KEYS[2] stats
  KEYS[3] expiry (jobs with a ttl_s, scored by the time they expire unless started)
  KEYS[4] job record of the new id
  KEYS[5] tenants (unfinished jobs per tenant)
  KEYS[6] idempotency key (optional)

  ARGV[1] job id
  ARGV[2] tenant
  ARGV[3] request digest ("" without an idempotency key: nothing is checked against it)
  ARGV[4] max unfinished jobs (0 = no limit)
  ARGV[5] now (ms)
  ARGV[6] idempotency key TTL (s)
  ARGV[7] expires at (ms; "" when the job has no ttl_s)
  ARGV[8] max unfinished jobs of one tenant (0 = no limit)
  ARGV[9..] more job fields, as name/value pairs

  Returns
    {0, id, entry}     created (a resent copy: the same answer, nothing added)
    {1, id}            the idempotency key was seen: the caller compares the request digests
    -3 QUEUE_FULL      {-3, unfinished}
    -9 TENANT_FULL     {-9, unfinished of this tenant}
]]
local rcall = redis.call
local streamKey, statsKey, expiryKey, jobKey, tenantsKey, idemKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local jobId, tenant, digest = ARGV[1], ARGV[2], ARGV[3]
local maxDepth, now, idemTtl, expiresAt = tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7]
local tenantMaxDepth = tonumber(ARGV[8])

local firstEntry = rcall('HGET', jobKey, 'first_entry')
if firstEntry then
  -- a resent copy; the same-value write moves this connection's replication offset (see includes/replay)
  rcall('HSET', jobKey, 'first_entry', firstEntry)
  return {0, jobId, firstEntry}
end

if idemKey then
  local seen = rcall('GET', idemKey)
  if seen then
    return {1, seen}
  end
end

-- the counters are taken first and given back when a limit refuses the job: the check reads the count its own
-- increment returns, one command less than reading it and then incrementing it on the path every accepted job
-- takes (the script is atomic: nobody sees the taken count of a refused job)
local unfinished = rcall('HINCRBY', statsKey, 'unfinished', 1)
if maxDepth > 0 and unfinished > maxDepth then
  rcall('HINCRBY', statsKey, 'unfinished', -1)
  return {CODE_QUEUE_FULL, unfinished - 1}
end
local mine = rcall('HINCRBY', tenantsKey, tenant, 1)
if tenantMaxDepth > 0 and mine > tenantMaxDepth then
  rcall('HINCRBY', statsKey, 'unfinished', -1)
  rcall('HINCRBY', tenantsKey, tenant, -1)  -- still at least one (its limit is): the tenant stays in the hash
  return {CODE_TENANT_FULL, mine - 1}
end

local entry = rcall('XADD', streamKey, '*', 'job', jobId, 'attempt', '1')
rcall('HSET', jobKey, 'id', jobId, 'tenant', tenant, 'status', 'queued', 'attempts', '1', 'deliveries', '0',
  'created_at', now, 'entry', entry, 'first_entry', entry, 'digest', digest, unpack(ARGV, 9))
if expiresAt ~= '' then
  rcall('HSET', jobKey, 'expires_at', expiresAt)
  rcall('ZADD', expiryKey, expiresAt, jobId)
end
rcall('HINCRBY', statsKey, 'enqueued', 1)
if idemKey then
  rcall('SET', idemKey, jobId, 'EX', idemTtl)
end
return {0, jobId, entry}
