--[[
  Give back the parts' charge of a tenant's uploads whose record has expired by `now` (ms) (inferq/queue/storage.py):
  the open set scores each upload by when its record expires. At most 100 a call, the first to expire first: one left
  over stays charged (the tenant refused a little early, never late) until a later call gives it back. Answers the
  bytes of the parts still charged. Deterministic in `now`: a resent copy finds the sweep done.
  STORAGE and OPEN (the tenant's storage hash and open set) are named by the script before its includes.
]]
local function storageSweep(now)
  local parts = tonumber(rcall('HGET', STORAGE, '#parts')) or 0
  local expired = rcall('ZRANGEBYSCORE', OPEN, '-inf', now, 'LIMIT', 0, 100)
  if #expired == 0 then
    return parts
  end
  for _, bytes in ipairs(rcall('HMGET', STORAGE, unpack(expired))) do
    parts = parts - (tonumber(bytes) or 0)
  end
  rcall('HDEL', STORAGE, unpack(expired))
  rcall('ZREM', OPEN, unpack(expired))
  rcall('HSET', STORAGE, '#parts', parts)
  return parts
end
