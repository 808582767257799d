--[[
  Charge an ended job's record to its tenant (G11, inferq/queue/holds.py): `bytes` in the hour the record expires
  (untilMs), given back by holdsAdmit once that hour is over; the tenant's first and last charged hours are kept for
  that sweep. HOLDS is the per-tenant bounds hash (keys.bounds), which the script names before its includes.
]]
local function holdRecord(tenant, bytes, untilMs)
  local prefix = tenant .. '|'
  local hour = math.floor(untilMs / HOLD_BUCKET_MS)
  rcall('HINCRBY', HOLDS, prefix .. hour, bytes)
  rcall('HINCRBY', HOLDS, prefix .. 'kept', bytes)
  local first, last = unpack(rcall('HMGET', HOLDS, prefix .. 'from', prefix .. 'to'))
  if not first or hour < tonumber(first) then
    rcall('HSET', HOLDS, prefix .. 'from', hour)
  end
  if not last or hour > tonumber(last) then
    rcall('HSET', HOLDS, prefix .. 'to', hour)
  end
end
