--[[
  Fail a job for good and record it in the dead-letter stream and in the tenant's part of the dead-letter index
  (member tenant|<9999999999999 - entry ms>|<9999999999 - entry seq>|job: the tenant's newest first by lex order; its members older than the
  result TTL are trimmed here, so the index holds what the stream holds) (requires terminate).
]]
local function deadLetter(jobKey, doneKey, statsKey, tenantsKey, eventsKey, dlqKey, dlqIndexKey, jobId, now,
                          resultTtl, eventsMaxlen, reason, errorJson)
  local tenant = rcall('HGET', jobKey, 'tenant') or ''
  local dlqEntry = rcall('XADD', dlqKey, 'MINID', '~', tostring(now - resultTtl * 1000), '*', 'job', jobId, 'tenant', tenant, 'reason', reason, 'at', now)
  if tenant ~= '' then
    -- ordered by the dead-letter entry's id (ms, then sequence): newest first even within one millisecond
    local ms, seq = string.match(dlqEntry, '^(%d+)-(%d+)$')
    rcall('ZADD', dlqIndexKey, 0, tenant .. '|' .. string.format('%013d', 9999999999999 - tonumber(ms)) .. '|' ..
      string.format('%010d', 9999999999 - tonumber(seq)) .. '|' .. jobId)
    local oldest = string.format('%013d', 9999999999999 - (now - tonumber(resultTtl) * 1000))
    rcall('ZREMRANGEBYLEX', dlqIndexKey, '(' .. tenant .. '|' .. oldest, '(' .. tenant .. '}')
  end
  rcall('HINCRBY', statsKey, 'dead_lettered', 1)
  terminate(jobKey, doneKey, statsKey, tenantsKey, eventsKey, jobId, 'failed', now, resultTtl, eventsMaxlen,
    {'error', errorJson, 'dead_lettered', '1', 'dlq_entry', dlqEntry})
end
