--[[
  Move a job to a terminal status, once. Callers have checked that it is not terminal yet.
  Emits the terminal event (webhooks), wakes long-poll waiters, settles the counters (the queue's and the
  tenant's unfinished jobs, latency_ms_total: the sum of finished_at - created_at over terminal jobs, which the
  console divides by the terminal counts), starts the result TTL.
  extra: flat list of more job fields to set (result, error, dead_lettered, ...).
  known (optional): {tenant, webhook_url, created_at} of the job, when the caller has read them already (one
  command less on the hot path).
  The wakeup list is new here: a job turns terminal once, and redrive (the one way back) deletes the list.
]]
local function terminate(jobKey, doneKey, statsKey, tenantsKey, eventsKey, jobId, status, now, resultTtl,
                         eventsMaxlen, extra, known)
  local tenant, webhook, createdAt = unpack(known or rcall('HMGET', jobKey, 'tenant', 'webhook_url', 'created_at'))
  rcall('HSET', jobKey, 'status', status, 'finished_at', now, 'entry', '', unpack(extra))
  rcall('HINCRBY', statsKey, 'unfinished', -1)
  rcall('HINCRBY', statsKey, status, 1)
  if createdAt then
    rcall('HINCRBY', statsKey, 'latency_ms_total', string.format('%d', math.max(0, tonumber(now) - tonumber(createdAt))))
  end
  if tenant and rcall('HINCRBY', tenantsKey, tenant, -1) <= 0 then
    rcall('HDEL', tenantsKey, tenant)  -- only tenants with open jobs stay in the hash
  end
  rcall('XADD', eventsKey, 'MAXLEN', '~', eventsMaxlen, '*', 'job', jobId, 'status', status,
    'tenant', tenant or '', 'webhook', (webhook and webhook ~= '') and '1' or '0')
  rcall('EXPIRE', jobKey, resultTtl)
  rcall('RPUSH', doneKey, status)
  rcall('EXPIRE', doneKey, 300)
end
