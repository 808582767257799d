--[[
  Accept jobs: idempotency check, depth limits, job record, stream entry and counters in one atomic step,
  so two concurrent submits with one idempotency key can never make two jobs or two entries.
  One call takes a batch of jobs (the submits a gateway received in one turn of its event loop, or a batch
  client's), each accepted or refused as if by a call of its own, in order; what they share is written once for
  the batch: the counters (stats, tenants).
  The idempotency key holds the job id; the request digest is in the job record (field digest), which the
  client compares on a replay: a different request under the same key is a conflict.
  Safe to resend (G9): the client generates the job ids, so a resent copy finds the records it made and answers
  what the first run answered (each job's first entry is kept in its record as first_entry), adding nothing;
  that check comes before the idempotency key, so a first submission never comes back as a replay of itself.
  The stats field backlog_tokens grows by the tokens field of each accepted job (its expected tokens: the scaler
  sizes the fleet by them; the job's first field, when it has one); terminate takes them back when the job ends.

  Each accepted job goes where its lane takes it from (includes/fairPlace, G10): its lane's stream, or the lane's
  waiting jobs, from where admission moves it in its tenant's turn; the job's field entry says which.

  KEYS[1] stats
  KEYS[2] expiry (jobs with a ttl_s, scored by the time they expire unless started)
  KEYS[3] tenants (unfinished jobs per tenant)
  KEYS[4] per-tenant bounds (keys.bounds): a tenant cooling off, or whose ended jobs' records hold its quota, is
          refused (includes/holdsAdmit)
  KEYS[5] the stream of the jobs' lane (one call takes the jobs of one lane; their field lane, passed with the
          fields, names it)
  KEYS[6..7] the lane's fair-share keys (keys.fair_lane after its stream): waiting jobs, tags
  KEYS[8..n] two per job, in the order of ARGV's jobs: the job record of the new id, the idempotency key (the job
             record again when the job has none: that is how the script tells)

  ARGV[1] max unfinished jobs (0 = no limit)
  ARGV[2] max unfinished jobs of one tenant (0 = no limit)
  ARGV[3] idempotency key TTL (s)
  ARGV[4] max bytes the ended jobs of one tenant may leave in records (0 = no limit)
  ARGV[5] "1": fair share (else every job goes straight into the stream, first come first served)
  ARGV[6..] per job: job id, tenant, request digest ("" without an idempotency key: nothing is checked against
            it), now (ms: its created_at), expires at (ms; "" when the job has no ttl_s), its cost (work over its
            tenant's weight), the number of more job fields, then those fields as name/value pairs

  Returns one reply per job, in order:
    {0, id, entry}     created (a resent copy: the same answer, nothing added); entry: its stream entry, or its
                       member of the lane's waiting jobs
    {1, id}            the idempotency key was seen: the caller compares the request digests
    -3 QUEUE_FULL      {-3, unfinished}
    -9 TENANT_FULL     {-9, unfinished of this tenant}
    -12 RETAINED_FULL  {-12, ms until some of the tenant's retained records' charge goes}
    -13 COOLING_OFF    {-13, ms until the tenant's cool-off ends}
]]
local rcall = redis.call
local statsKey, expiryKey, tenantsKey = KEYS[1], KEYS[2], KEYS[3]
local maxDepth, tenantMaxDepth, idemTtl = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local maxKept = tonumber(ARGV[4])
local HOLDS = KEYS[4]
local fair = ARGV[5] == '1'
local jobs = (#KEYS - 7) / 2

--- @include "holdsAdmit"
--- @include "fairLane"
--- @include "undelivered"
--- @include "fairPlace"

local lane = fairLane(KEYS[5], 6)

-- The counters are taken first for every job of the batch and what was not accepted is given back at the end:
-- the checks read the counts their own increments return, one command per counter and batch rather than a read
-- and an increment per job on the path every accepted job takes (the script is atomic: nobody sees the counts
-- of refused jobs).
local offered, a = {}, 6
for _ = 1, jobs do
  local tenant = ARGV[a + 1]
  offered[tenant] = (offered[tenant] or 0) + 1
  a = a + 7 + 2 * tonumber(ARGV[a + 6])
end
local unfinished = rcall('HINCRBY', statsKey, 'unfinished', jobs) - jobs
local mine, taken = {}, {}
for tenant, count in pairs(offered) do
  mine[tenant] = rcall('HINCRBY', tenantsKey, tenant, count) - count
  taken[tenant] = 0
end

local replies, accepted, acceptedTokens, held = {}, 0, 0, {}
a = 6
for i = 1, jobs do
  local jobKey, idemKey = KEYS[6 + 2 * i], KEYS[7 + 2 * i]
  local jobId, tenant, digest, now, expiresAt = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local cost, fieldsFrom, fieldsTo = ARGV[a + 5], a + 7, a + 6 + 2 * tonumber(ARGV[a + 6])
  local hasIdem = idemKey ~= jobKey
  a = fieldsTo + 1
  if held[tenant] == nil then
    held[tenant] = holdsAdmit(tenant, tonumber(now), maxKept) or false
  end
  local firstEntry = rcall('HGET', jobKey, 'first_entry')
  local seen = not firstEntry and hasIdem and rcall('GET', idemKey)
  if firstEntry then
    -- a resent copy; the same-value write moves this connection's replication offset (see includes/replay)
    rcall('HSET', jobKey, 'first_entry', firstEntry)
    replies[i] = {0, jobId, firstEntry}
  elseif seen then
    replies[i] = {1, seen}
  elseif held[tenant] then
    -- the tenant's own bounds before any depth (G11): cooling off, or its ended jobs' records at their quota
    replies[i] = held[tenant]
  elseif tenantMaxDepth > 0 and mine[tenant] + taken[tenant] >= tenantMaxDepth then
    -- the tenant's quota before the queue's depth: a resent batch, which finds the counts its first run left,
    -- then answers each refusal as that run did (a tenant refused before other tenants' jobs filled the queue is
    -- still refused for its quota)
    replies[i] = {CODE_TENANT_FULL, mine[tenant] + taken[tenant]}
  elseif maxDepth > 0 and unfinished + accepted >= maxDepth then
    replies[i] = {CODE_QUEUE_FULL, unfinished + accepted}
  else
    accepted = accepted + 1
    taken[tenant] = taken[tenant] + 1
    local entry = fairPlace(lane, jobId, tenant, '1', cost, false, fair)
    rcall('HSET', jobKey, 'id', jobId, 'tenant', tenant, 'status', 'queued', 'attempts', '1', 'deliveries', '0',
      'created_at', now, 'entry', entry, 'first_entry', entry, 'digest', digest, unpack(ARGV, fieldsFrom, fieldsTo))
    if expiresAt ~= '' then
      rcall('HSET', jobKey, 'expires_at', expiresAt)
      rcall('ZADD', expiryKey, expiresAt, jobId)
    end
    if hasIdem then
      rcall('SET', idemKey, jobId, 'EX', idemTtl)
    end
    if ARGV[fieldsFrom] == 'tokens' then  -- the producer passes it first: no search through the fields
      acceptedTokens = acceptedTokens + (tonumber(ARGV[fieldsFrom + 1]) or 0)
    end
    replies[i] = {0, jobId, entry}
  end
end

fairFlush(lane)
if accepted < jobs then
  rcall('HINCRBY', statsKey, 'unfinished', accepted - jobs)
end
for tenant, count in pairs(offered) do
  if taken[tenant] < count and rcall('HINCRBY', tenantsKey, tenant, taken[tenant] - count) <= 0 then
    rcall('HDEL', tenantsKey, tenant)  -- only tenants with open jobs stay in the hash
  end
end
if accepted > 0 then
  rcall('HINCRBY', statsKey, 'enqueued', accepted)
end
if acceptedTokens > 0 then
  rcall('HINCRBY', statsKey, 'backlog_tokens', acceptedTokens)
end
return replies
