--[[
  Fail a job for good and record it in the dead-letter stream (requires terminate).
]]
local function deadLetter(jobKey, doneKey, statsKey, tenantsKey, eventsKey, dlqKey, jobId, now, resultTtl,
                          eventsMaxlen, reason, errorJson)
  local tenant = rcall('HGET', jobKey, 'tenant') or ''
  local dlqEntry = rcall('XADD', dlqKey, 'MINID', '~', tostring(now - resultTtl * 1000), '*', 'job', jobId, 'tenant', tenant, 'reason', reason, 'at', now)
  rcall('HINCRBY', statsKey, 'dead_lettered', 1)
  terminate(jobKey, doneKey, statsKey, tenantsKey, eventsKey, jobId, 'failed', now, resultTtl, eventsMaxlen,
    {'error', errorJson, 'dead_lettered', '1', 'dlq_entry', dlqEntry})
end
