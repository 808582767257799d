--[[
  Move a job to a terminal status, once. Callers have checked that it is not terminal yet.
  Emits the terminal event (webhooks), wakes long-poll waiters, settles the counters (the queue's and the
  tenant's unfinished jobs, latency_ms_total: the sum of finished_at - created_at over terminal jobs, which the
  console divides by the terminal counts; backlog_tokens: the expected tokens of the unfinished jobs, each job's
  tokens field, which the scaler sizes the fleet by), starts the result TTL (or keeps the record until its keep_until, a
  batch line's: its batch's end).
  extra: flat list of more job fields to set (result, error, dead_lettered, ...).
  known (optional): {tenant, webhook_url, created_at, tokens, hold} of the job, when the caller has read them already (one
  command less on the hot path).
  metered (optional): true when the caller has counted the job's usage itself (finish: the worker's figures, added
  up by its client); otherwise it is counted here from its record (fields lane, model, run_ms, gpu_ms: what its
  attempts spent; no tokens) into its tenant's usage of the hour (includes/meter), unless metering is off.
  tally (optional): a script ending several jobs passes one table for all of them, and the counters are added
  up in it, to be written once by settleTally before the script returns; without one they are written here, by
  the same settleTally.
  The wakeup list is new here: a job turns terminal once, and redrive (the one way back) deletes the list.
  The request body is dropped here (nothing reads it once the job has ended: the record lives on for its result
  only), except for a dead-lettered job (extra sets dead_lettered), which keeps it for a redrive.
  What the record keeps is charged to its tenant until it expires (includes/holdRecord: the script names HOLDS, the
  per-tenant bounds hash, before its includes): the fixed HOLD_RECORD_BYTES, the record's field hold (what the
  tenant chose at submit that the record keeps: metadata, webhook URL, the last attempt's error), what this writes
  (extra: result, error, ...) and a dead letter's body. known may carry hold as its fifth element.
]]
--- @include "meter"
--- @include "holdRecord"
--- @include "settleTally"

local function terminate(jobKey, doneKey, statsKey, tenantsKey, eventsKey, jobId, status, now, resultTtl,
                         eventsMaxlen, extra, known, tally, metered)
  local tenant, webhook, createdAt, tokens, hold = unpack(known or
    rcall('HMGET', jobKey, 'tenant', 'webhook_url', 'created_at', 'tokens', 'hold'))
  rcall('HSET', jobKey, 'status', status, 'finished_at', now, 'entry', '', unpack(extra))
  local keepBody = false
  for i = 1, #extra, 2 do
    keepBody = keepBody or extra[i] == 'dead_lettered'
  end
  if not keepBody then
    rcall('HDEL', jobKey, 'body')
  end
  local counts = tally or {n = 0, statuses = {}, latency = 0, tenants = {}, webhooks = 0, tokens = 0}
  if not metered and METER.hourUntil ~= '0' then
    meterJob(counts, status, meterRecord(jobKey, tenant))
  end
  local hooked = webhook and webhook ~= ''
  counts.n = counts.n + 1
  if hooked then
    counts.webhooks = counts.webhooks + 1
  end
  counts.statuses[status] = (counts.statuses[status] or 0) + 1
  if tokens then
    counts.tokens = counts.tokens + (tonumber(tokens) or 0)
  end
  if createdAt then
    counts.latency = counts.latency + math.max(0, tonumber(now) - tonumber(createdAt))
  end
  if tenant then
    counts.tenants[tenant] = (counts.tenants[tenant] or 0) + 1
  end
  rcall('XADD', eventsKey, 'MAXLEN', '~', eventsMaxlen, '*', 'job', jobId, 'status', status,
    'tenant', tenant or '', 'webhook', hooked and '1' or '0')
  rcall('EXPIRE', jobKey, resultTtl)
  -- a batch line's job is kept until its batch has written its output (the batch driver sets keep_until)
  local keepUntil = rcall('HGET', jobKey, 'keep_until')
  if keepUntil then
    rcall('EXPIREAT', jobKey, keepUntil, 'GT')
  end
  if tenant and tenant ~= '' then
    -- what the record keeps from now on is charged to its tenant until it expires (includes/holdRecord)
    local bytes = HOLD_RECORD_BYTES + (tonumber(hold) or 0)
    for i = 2, #extra, 2 do  -- every value a string
      bytes = bytes + #extra[i]
    end
    if keepBody then
      bytes = bytes + rcall('HSTRLEN', jobKey, 'body')
    end
    local untilMs = now + resultTtl * 1000
    if keepUntil then
      untilMs = math.max(untilMs, keepUntil * 1000)
    end
    holdRecord(counts, tenant, bytes, untilMs)
  end
  if not tally then
    settleTally(statsKey, tenantsKey, counts)
  end
  rcall('RPUSH', doneKey, status)
  rcall('EXPIRE', doneKey, 300)
end
