--[[
  Record the outcomes of attempts: each succeeded, failed (not retryable) or cancelled. One call takes a batch of jobs
  (a worker's finishes that are ready together, :class:`inferq.redis.batching.Batcher`), each settled as if by a call of
  its own, in order; what they share is written once for the batch: the counters (stats, tenants), and the
  acknowledgement and deletion of their entries, one XACK and one XDEL per stream (one script and six commands less
  per job on the hot path, callgrind). First writer wins (G2): if a job is already terminal its entry is acknowledged
  and the late result discarded and counted.
  Owner check: only the holder of the delivery (the job's live entry and its lease token, set by start) may
  write. A stale holder -- its entry was reclaimed by another consumer, or started again -- changes nothing:
  its entry is not acknowledged (it may be the new holder's), no result is written, even a success (the
  holder that now runs the job writes it); it is refused and counted (stale_writes).
  Safe to resend (G9): the written answer and a refusal are recorded against each job's call token (fields
  settled, refused); a resent copy answers the same and changes nothing (no second duplicate_results or
  stale_writes). The client derives the call token from the lease and what is written, so the worker's own retry
  of the same write is a resend too. A copy so late that another delivery has written since is refused
  (TERMINAL or STALE_OWNER) and changes nothing but those counters.

  KEYS[1] stats
  KEYS[2] events
  KEYS[3] tenants (unfinished jobs per tenant)
  KEYS[4] usage of the hour (keys.usage_hour of now; includes/meter)
  KEYS[5] per-tenant bounds (keys.bounds): a job ended here is charged to its tenant (includes/holdRecord)
  KEYS[6..n] three per job, in the order of ARGV's jobs: the stream of the delivery's entry (the job's lane),
             the job record, done (long-poll wakeup)

  ARGV[1] now (ms)
  ARGV[2] result TTL (s)
  ARGV[3] events max length
  ARGV[4] when the hour's usage expires (unix s; "0": metering off)
  ARGV[5] R, the number of usage rows that follow (0 with metering off)
  ARGV[6..5+2R] the jobs' usage added up by the client, two per row: row ("tenant|lane|model"), and its eight sums
            separated by spaces: jobs succeeded, failed, cancelled, expired, prompt tokens, completion tokens, run ms,
            GPU ms (each job's run and GPU ms of all its attempts: the record's run_ms and gpu_ms as its delivery read
            them -- only the delivery's own retry or release changes them -- plus this attempt's, the worker's share
            of its busy time for GPU ms); a job the script does not end (refused, resent) is taken back out of its
            row (includes/meter)
  ARGV[6+2R..] eight per job: entry id, status (succeeded | failed | cancelled), result JSON ("" for none), error
            JSON ("" for none), lease token of the delivery (from start), call token (the same for the same write of
            one delivery: queue.settle_token), its row's position among the rows (1..R; 0: not metered), what it
            added to the row ("run_ms gpu_ms prompt_tokens completion_tokens")

  Returns one reply per job, in order:
    0                  written (a resent copy answers it too)
    -1 NOT_FOUND       {-1}: entry acknowledged
    -4 TERMINAL        {-4, status}: duplicate result, discarded and counted (duplicate_results); acknowledged
    -8 STALE_OWNER     {-8}: the caller no longer holds the delivery: nothing changed, counted (stale_writes)
]]
local rcall = redis.call
local statsKey, eventsKey, tenantsKey = KEYS[1], KEYS[2], KEYS[3]
local now, resultTtl, eventsMaxlen = ARGV[1], ARGV[2], ARGV[3]
local METER = {hour = KEYS[4], hourUntil = ARGV[4]}
local HOLDS = KEYS[5]

--- @include "ackEntry"
--- @include "replay"
--- @include "terminate"
--- @include "settleGuard"

local tally = {n = 0, statuses = {}, latency = 0, tenants = {}, webhooks = 0, tokens = 0}
local rowCount = tonumber(ARGV[5])
local rows = meterRows(tally, 6, rowCount)
local first = 6 + 2 * rowCount
local replies, acks = {}, {}
for i = 0, (#KEYS - 5) / 3 - 1 do
  local streamKey, jobKey, doneKey = KEYS[6 + 3 * i], KEYS[7 + 3 * i], KEYS[8 + 3 * i]
  local a = first + 8 * i
  local entryId, newStatus, resultJson, errorJson, lease, call = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    ARGV[a + 4], ARGV[a + 5]
  local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'lease', 'settled', 'refused', 'tenant',
    'webhook_url', 'created_at', 'tokens', 'hold')
  local refusal = settleGuard(streamKey, statsKey, jobKey, entryId, lease, call, job, true)
  if refusal then
    replies[i + 1] = refusal
    local name = rows[tonumber(ARGV[a + 6])]
    if name then  -- not ended here: out of its row
      meterUnend(tally.rows, name, newStatus, ARGV[a + 7])
    end
  else
    -- acknowledged with the batch's other entries of its stream, in one XACK and one XDEL (which walks a stream's
    -- deleted head once per call, not once per entry)
    local ids = acks[streamKey]
    if not ids then
      ids = {}
      acks[streamKey] = ids
    end
    ids[#ids + 1] = entryId
    local extra = {}
    if resultJson ~= '' then
      extra[#extra + 1] = 'result'
      extra[#extra + 1] = resultJson
    end
    if errorJson ~= '' then
      extra[#extra + 1] = 'error'
      extra[#extra + 1] = errorJson
    end
    -- the answer is recorded by terminate's own HSET: one command less on the hot path
    extra[#extra + 1] = 'settled'
    extra[#extra + 1] = call .. '|0'  -- memo(call, 0) without encoding the constant answer
    -- counted in its row already (ARGV); a job the client did not meter is counted from its record
    terminate(jobKey, doneKey, statsKey, tenantsKey, eventsKey, job[1], newStatus, now, resultTtl, eventsMaxlen,
      extra, {job[7], job[8], job[9], job[10], job[11]}, tally, ARGV[a + 6] ~= '0')
    replies[i + 1] = 0
  end
end
for streamKey, ids in pairs(acks) do
  rcall('XACK', streamKey, GROUP, unpack(ids))
  rcall('XDEL', streamKey, unpack(ids))
end
settleTally(statsKey, tenantsKey, tally)  -- from terminate's include
return replies
