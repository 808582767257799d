--[[
  Re-enqueue a dead-lettered job for its tenant with its attempts and its engine-death strikes reset, in its own lane;
  it leaves the dead-letter stream and the tenant's part of the dead-letter index, and counts again among the queue's
  and the tenant's unfinished jobs, and its tokens in backlog_tokens.
  Safe to resend (G9): the answer is recorded against the call token (field redrive_call), so a resent copy
  answers as the first run did, never "not dead-lettered", and adds no second entry.
  It goes where its lane takes it from (includes/fairPlace, G10): its lane's stream, or behind its tenant's jobs
  waiting for admission when jobs wait.
  A job dead-lettered because the model server died running it (error type engine_died: a poison request) is
  redriven by an operator only (ARGV[6]): its tenant could otherwise reset its strikes and send the poison to the
  engine again and again. An operator named as such (ARGV[7]) may redrive any tenant's dead letter.

  KEYS[1..9] three per lane, in LANE_KEYS order (keys.fair_lanes): stream, waiting jobs, tags
  KEYS[10] stats
  KEYS[11] dlq
  KEYS[12] tenants (unfinished jobs per tenant)
  KEYS[13] job record
  KEYS[14] done (long-poll wakeup)
  KEYS[15] dlq index (per tenant: keys.dlq_index)
  KEYS[16] the job's output stream: a redriven job starts its output again (nothing an earlier run kept, or a closed
           stream's end entry, is left for its first write to follow; closeoutput.lua, appendoutput.lua)

  ARGV[1] tenant
  ARGV[2] now (ms)
  ARGV[3] call token (random, one per call)
  ARGV[4] the queue's depth limit (INFERQ_MAX_QUEUE_DEPTH; 0 = none)
  ARGV[5] the tenant's quota (INFERQ_TENANT_MAX_DEPTH; 0 = none)
  ARGV[6] (optional) "1" when the caller is an operator (INFERQ_ADMIN_TENANTS): engine_died dead letters too
  ARGV[7] (optional) "1" when the caller is an operator named in INFERQ_ADMIN_TENANTS: any tenant's dead letter
  ARGV[8] "1": fair share (else the job goes straight into its lane's stream)

  Returns
    {0, entry}              queued again (entry: its stream entry, or w:<its member of the lane's waiting jobs>)
    -1 NOT_FOUND            unknown, or another tenant's (unless ARGV[7])
    -14 OPERATOR_ONLY       {-14}: an engine_died dead letter, and the caller no operator; nothing changed
    -6 NOT_DEAD_LETTERED    {-6, status}
    -9 TENANT_FULL          {-9, the tenant's unfinished jobs}: refused as a submit would be, nothing changed
    -3 QUEUE_FULL           {-3, the queue's unfinished jobs}: likewise
]]
local rcall = redis.call
local statsKey, dlqKey, tenantsKey, jobKey, doneKey = KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local dlqIndexKey = KEYS[15]
local tenant, call, operator, anyTenant = ARGV[1], ARGV[3], ARGV[6] == '1', ARGV[7] == '1'

--- @include "replay"
--- @include "fairLane"
--- @include "undelivered"
--- @include "fairPlace"
--- @include "fairCost"

local job = rcall('HMGET', jobKey, 'id', 'status', 'tenant', 'dead_lettered', 'dlq_entry', 'redrive_call', 'lane',
  'tokens', 'work', 'weight', 'error')
local jobId, status, owner, dead, dlqEntry = job[1], job[2], job[3], job[4], job[5]
if not jobId or (owner ~= tenant and not anyTenant) then
  return {CODE_NOT_FOUND}
end
local again = replayed(jobKey, 'redrive_call', job[6], call)
if again then
  return again
end
if dead ~= '1' then
  return {CODE_NOT_DEAD_LETTERED, status}
end
if not operator and string.find(job[11] or '', '"type"%s*:%s*"engine_died"') then
  return {CODE_OPERATOR_ONLY}
end
-- the same limits as a submit (enqueue.lua), the tenant's quota first; a refusal changes nothing, so a resent copy
-- answers from the counts it finds, as a resent submit does
local maxDepth, tenantMaxDepth = tonumber(ARGV[4]) or 0, tonumber(ARGV[5]) or 0
if tenantMaxDepth > 0 then
  local mine = tonumber(rcall('HGET', tenantsKey, owner) or '0')
  if mine >= tenantMaxDepth then
    return {CODE_TENANT_FULL, mine}
  end
end
if maxDepth > 0 then
  local unfinished = tonumber(rcall('HGET', statsKey, 'unfinished') or '0')
  if unfinished >= maxDepth then
    return {CODE_QUEUE_FULL, unfinished}
  end
end
if dlqEntry and dlqEntry ~= '' then
  rcall('XDEL', dlqKey, dlqEntry)
  -- its member of the index, as the deadLetter include wrote it from the same entry id
  local ms, seq = string.match(dlqEntry, '^(%d+)-(%d+)$')
  if ms and dlqIndexKey then
    rcall('ZREM', dlqIndexKey, owner .. '|' .. string.format('%013d', 9999999999999 - tonumber(ms)) .. '|' ..
      string.format('%010d', 9999999999 - tonumber(seq)) .. '|' .. jobId)
  end
end
rcall('PERSIST', jobKey)
rcall('DEL', doneKey)
-- strikes: the engine deaths counted against it (retry.lua); the cause is fixed, so a redriven job starts clean.
-- run_ms, gpu_ms: its dead-lettering counted them in its usage (includes/meter); the next ending counts only its own
rcall('HDEL', jobKey, 'result', 'error', 'last_error', 'started_at', 'finished_at', 'dlq_entry', 'cancel', 'worker',
  'expires_at', 'lease', 'strikes', 'run_ms', 'gpu_ms', 'out')
rcall('DEL', KEYS[16])
local laneAt = 1
for i, name in ipairs(LANE_KEYS) do
  if name == job[7] then
    laneAt = i
  end
end
local lane = fairLane(KEYS[3 * laneAt - 2], 3 * laneAt - 1)
local entry = fairPlace(lane, jobId, owner, '1', fairCost(job[9], job[10]), false, ARGV[8] == '1')
fairFlush(lane)
rcall('HSET', jobKey, 'status', 'queued', 'attempts', '1', 'deliveries', '0', 'dead_lettered', '0', 'entry', entry,
  'redriven_at', ARGV[2])
rcall('HINCRBY', statsKey, 'unfinished', 1)
rcall('HINCRBY', statsKey, 'redriven', 1)
if tonumber(job[8] or '') then
  rcall('HINCRBY', statsKey, 'backlog_tokens', tonumber(job[8]))  -- its expected work counts again (enqueue.lua)
end
rcall('HINCRBY', tenantsKey, owner, 1)
return remember(jobKey, 'redrive_call', call, {0, entry})
