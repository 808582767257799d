--[[
  Charge an ended job's record to its tenant (G11, inferq/queue/holds.py): `bytes` in the hour the record expires
  (untilMs), given back by holdsAdmit once that hour is over. Added up in the terminal transition's tally
  (counts.holds: tenant -> hour -> bytes) and written by holdFlush, from settleTally: one HINCRBY per hour and two
  commands per tenant a script call ends jobs of, whatever the number of jobs.
  HOLDS is the per-tenant bounds hash (keys.bounds), which the script names before its includes.
]]
local function holdRecord(counts, tenant, bytes, untilMs)
  local hour = untilMs - untilMs % HOLD_BUCKET_MS  -- the hour's start (ms): a whole number, a table key as it is
  local holds = counts.holds
  if not holds then
    holds = {[tenant] = {[hour] = bytes}}
    counts.holds = holds
    return
  end
  local hours = holds[tenant]
  if not hours then
    holds[tenant] = {[hour] = bytes}
    return
  end
  hours[hour] = (hours[hour] or 0) + bytes
end

-- Write what holdRecord added up: each hour's bytes and the tenant's total; the tenant's first hour charged moves
-- back when one of these is earlier (holdsAdmit sweeps from it).
local function holdFlush(counts)
  for tenant, hours in pairs(counts.holds or {}) do
    local prefix, total, first = tenant .. '|', 0, nil
    for start, bytes in pairs(hours) do
      local hour = start / HOLD_BUCKET_MS
      rcall('HINCRBY', HOLDS, prefix .. string.format('%d', hour), bytes)
      total = total + bytes
      if not first or hour < first then
        first = hour
      end
    end
    rcall('HINCRBY', HOLDS, prefix .. 'kept', total)
    local from = tonumber(rcall('HGET', HOLDS, prefix .. 'from'))
    if not from or first < from then
      rcall('HSET', HOLDS, prefix .. 'from', string.format('%d', first))
    end
  end
end
