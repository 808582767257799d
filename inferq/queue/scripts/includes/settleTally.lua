--[[
  Write the counters terminate added up in a tally (the queue's and the tenants' unfinished jobs, the terminal
  status counts, latency_ms_total, webhook_events, backlog_tokens), the usage rows (meter) and the tenants' charges
  for the records the jobs leave behind (holdRecord): one increment per counter for all the jobs the tally holds.
  terminate calls it for a job of its own; a script ending several jobs calls it once for them all (terminate
  includes it, after the meter and holdRecord includes it needs).
]]
local function settleTally(statsKey, tenantsKey, tally)
  if tally.n == 0 then
    return
  end
  holdFlush(tally)
  meterFlush(tally.rows)
  rcall('HINCRBY', statsKey, 'unfinished', -tally.n)
  for status, count in pairs(tally.statuses) do
    rcall('HINCRBY', statsKey, status, count)
  end
  if tally.latency > 0 then
    rcall('HINCRBY', statsKey, 'latency_ms_total', string.format('%d', tally.latency))
  end
  if (tally.tokens or 0) > 0 then
    rcall('HINCRBY', statsKey, 'backlog_tokens', -tally.tokens)
  end
  if tally.webhooks > 0 then
    rcall('HINCRBY', statsKey, 'webhook_events', tally.webhooks)
  end
  for tenant, count in pairs(tally.tenants) do
    if rcall('HINCRBY', tenantsKey, tenant, -count) <= 0 then
      rcall('HDEL', tenantsKey, tenant)  -- only tenants with open jobs stay in the hash
    end
  end
end
