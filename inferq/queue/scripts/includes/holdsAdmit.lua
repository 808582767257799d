--[[
  Whether a tenant may submit to this queue at `now` (ms; G11, inferq/queue/holds.py): not while its cool-off runs
  (its jobs killed the engine too often: holdStrike), nor while the records its ended jobs left behind hold
  maxKept bytes or more (0: no bound). The charge of the hours that are over is given back first: their records
  have expired. Answers nil, or the refusal {code, ms until it may be lifted}: CODE_COOLING_OFF until the cool-off
  ends; CODE_RETAINED_FULL until the end of the first hour still charged (some of the charge goes then).
  keepsOnly: the cool-off is not checked (what it refuses is submits; an upload is refused on what it keeps only).
  Deterministic in its arguments: a resent copy finds the sweep done and answers the same.
  HOLDS is the per-tenant bounds hash (keys.bounds), which the script names before its includes.
]]
local function holdsAdmit(tenant, now, maxKept, keepsOnly)
  local prefix = tenant .. '|'
  local kept, first, cool = unpack(rcall('HMGET', HOLDS, prefix .. 'kept', prefix .. 'from', prefix .. 'cool'))
  cool = tonumber(cool)
  if cool and not keepsOnly then
    if cool > now then
      return {CODE_COOLING_OFF, cool - now}
    end
    rcall('HDEL', HOLDS, prefix .. 'cool')
  end
  kept, first = tonumber(kept) or 0, tonumber(first)
  local hour = math.floor(now / HOLD_BUCKET_MS)
  if first and first < hour then
    local upto = hour - 1
    for from = first, upto, 500 do  -- HMGET and HDEL in slices: a tenant idle for long has many hours to give back
      local fields = {}
      for h = from, math.min(upto, from + 499) do
        fields[#fields + 1] = prefix .. h
      end
      for _, bytes in ipairs(rcall('HMGET', HOLDS, unpack(fields))) do
        kept = kept - (tonumber(bytes) or 0)
      end
      rcall('HDEL', HOLDS, unpack(fields))
    end
    if kept <= 0 then  -- every hour charged is over
      rcall('HDEL', HOLDS, prefix .. 'kept', prefix .. 'from')
      kept, first = 0, nil
    else
      rcall('HSET', HOLDS, prefix .. 'kept', kept, prefix .. 'from', hour)
      first = hour
    end
  end
  if maxKept > 0 and kept >= maxKept then
    return {CODE_RETAINED_FULL, ((first or hour) + 1) * HOLD_BUCKET_MS - now}
  end
  return nil
end
