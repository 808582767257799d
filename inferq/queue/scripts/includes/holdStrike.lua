--[[
  An engine death against a tenant (G11, inferq/queue/holds.py): its job was dead-lettered because the model server
  died running it. The tenant's deaths within the last windowMs are kept (their times, ms, at most `strikes` of
  them); at `strikes` of them its cool-off starts: its submits to this queue are refused until now + cooloffMs
  (holdsAdmit), and its count starts again. strikes 0: no cool-off.
  HOLDS is the per-tenant bounds hash (keys.bounds), which the script names before its includes.
]]
local function holdStrike(tenant, now, strikes, windowMs, cooloffMs)
  if strikes <= 0 or tenant == '' then
    return
  end
  local field = tenant .. '|deaths'
  local recent = {}
  for at in string.gmatch(rcall('HGET', HOLDS, field) or '', '%d+') do
    if tonumber(at) > now - windowMs then
      recent[#recent + 1] = at
    end
  end
  recent[#recent + 1] = string.format('%d', now)
  if #recent >= strikes then
    rcall('HSET', HOLDS, tenant .. '|cool', string.format('%d', now + cooloffMs))
    rcall('HDEL', HOLDS, field)
    return
  end
  rcall('HSET', HOLDS, field, table.concat(recent, ' '))
end
