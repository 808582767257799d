--[[
  Take a queued job out of wherever its lane holds it, for a script that ends it there (cancel, expire; requires
  fairLane, fairCost and fairAdmit, and the lanes' keys as KEYS[1..9], three per lane in LANE_KEYS order).
  entry (the job's field entry): its stream entry, acknowledged and deleted; or w:<member> (fairPlace): its member
  of the lane's waiting jobs, removed, and its cost given back to its tenant (the tenant's finish tag moves back by it,
  never before the lane's virtual time: a tenant whose waiting jobs all end unserved starts again from there).
  Admitted already: the entry of the job among the stream's newest (entries are read oldest first, so one not read
  yet is there), acknowledged and deleted (one already read is acknowledged by its start, which finds the job
  ended). An entry no worker had read is replaced by the next waiting job's admission: a lane whose jobs wait keeps
  what its stream held (includes/fairPlace).
]]
local function fairRemove(jobKey, jobId, laneName, entry, cost)
  local at = 1
  for i, name in ipairs(LANE_KEYS) do
    if name == laneName then
      at = i
    end
  end
  local lane = fairLane(KEYS[3 * at - 2], 3 * at - 1)
  if entry and string.byte(entry) == 119 then  -- 'w': it waits for admission, or was admitted and not started
    local waiting = string.sub(entry, 3)
    rcall('HSET', jobKey, 'entry', '')
    if rcall('ZREM', lane.jobs, waiting) == 1 then
      local tenant = string.sub(waiting, 1, string.find(waiting, '|', 1, true) - 1)
      local tags = rcall('HMGET', lane.tags, ':clock', tenant)
      local finish = math.max(tonumber(tags[1]) or 0, (tonumber(tags[2]) or 0) - cost)
      rcall('HSET', lane.tags, tenant, finish)
      return
    end
    entry = nil
    for _, found in ipairs(rcall('XREVRANGE', lane.stream, '+', '-', 'COUNT', 64)) do
      if found[2][2] == jobId then
        entry = found[1]
      end
    end
  end
  if entry and entry ~= '' then
    local read = rcall('XACK', lane.stream, GROUP, entry)
    if rcall('XDEL', lane.stream, entry) == 1 and read == 0 then
      fairAdmit(lane, 1)
    end
  end
end
