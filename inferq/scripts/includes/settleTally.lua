--[[
  Write the counters terminate added up in a tally: what its calls without one would have written, one increment
  per counter instead of one per job.
]]
local function settleTally(statsKey, tenantsKey, tally)
  if tally.n == 0 then
    return
  end
  rcall('HINCRBY', statsKey, 'unfinished', -tally.n)
  for status, count in pairs(tally.statuses) do
    rcall('HINCRBY', statsKey, status, count)
  end
  if tally.latency > 0 then
    rcall('HINCRBY', statsKey, 'latency_ms_total', string.format('%d', tally.latency))
  end
  for tenant, count in pairs(tally.tenants) do
    if rcall('HINCRBY', tenantsKey, tenant, -count) <= 0 then
      rcall('HDEL', tenantsKey, tenant)  -- only tenants with open jobs stay in the hash
    end
  end
end
