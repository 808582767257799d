--[[
  Move a job to a terminal status, once. Callers have checked that it is not terminal yet.
  Emits the terminal event (webhooks), wakes long-poll waiters, settles the counters, starts the result TTL.
  extra: flat list of more job fields to set (result, error, dead_lettered, ...).
]]
local function terminate(jobKey, doneKey, statsKey, eventsKey, jobId, status, now, resultTtl, eventsMaxlen, extra)
  local tenant, webhook = unpack(rcall('HMGET', jobKey, 'tenant', 'webhook_url'))
  rcall('HSET', jobKey, 'status', status, 'finished_at', now, 'entry', '', unpack(extra))
  rcall('HINCRBY', statsKey, 'unfinished', -1)
  rcall('HINCRBY', statsKey, status, 1)
  rcall('XADD', eventsKey, 'MAXLEN', '~', eventsMaxlen, '*', 'job', jobId, 'status', status,
    'tenant', tenant or '', 'webhook', (webhook and webhook ~= '') and '1' or '0')
  rcall('EXPIRE', jobKey, resultTtl)
  rcall('DEL', doneKey)
  rcall('RPUSH', doneKey, status)
  rcall('EXPIRE', doneKey, 300)
end
