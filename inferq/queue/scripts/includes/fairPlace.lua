--[[
  Put a queued job where its lane takes it from (requires fairLane and undelivered; the caller runs fairFlush,
  below, before it returns). Straight into the lane's stream when fair share is off, or when no job of the lane
  waits and the stream holds fewer than FAIR_BUFFER entries no worker has read (an idle or keeping-up queue pays
  little more than before, and a worker blocked on the stream wakes at once); else among the lane's waiting jobs,
  from where admission (fairAdmit) moves them into the stream lowest start tag first (start-time fair queuing): the
  job starts at the lane's virtual time or at its tenant's last finish tag, whichever is later, and the tenant's
  finish tag moves on by the job's cost (its work over the tenant's weight). So each tenant with jobs waiting is
  admitted in proportion to its weight, counted in work, and a tenant whose first job comes behind another's
  backlog starts at the virtual time, ahead of that backlog; sending one job at a time, or few big ones, gains
  nothing. A job given back that had its turn (front) starts at the virtual time and is not charged again.
  So a lane whose jobs wait always has FAIR_BUFFER entries in its stream (admission refills what the workers
  take), and a worker that finds its streams empty may block: nothing waits behind them.
  cost: the job's cost, a number or its string (converted only when needed).
  Returns what the job's field entry becomes: the new entry's id, or w:<member> (its member of the waiting set; no
  entry id starts with a letter).
]]
-- Write what fairPlace changed in the lane's tags (the caller runs it before it returns).
local function fairFlush(lane)
  if lane.tenant then
    rcall('HSET', lane.tags, lane.tenant, lane.finish)
    lane.tenant = nil
  end
end

local function fairPlace(lane, jobId, tenant, attempt, cost, front, fair)
  if fair and lane.waiting == nil then
    lane.waiting = rcall('EXISTS', lane.jobs) == 1
  end
  if not fair or (not lane.waiting and undelivered(lane) < FAIR_BUFFER) then
    local entry = rcall('XADD', lane.stream, '*', 'job', jobId, 'attempt', attempt)
    if lane.undelivered then
      lane.undelivered = lane.undelivered + 1
    end
    return entry
  end
  if lane.tenant ~= tenant then  -- a call places one tenant's jobs, mostly: its figures stay in the table
    fairFlush(lane)
    local tags = rcall('HMGET', lane.tags, ':clock', tenant)
    lane.tenant, lane.clock, lane.finish = tenant, tonumber(tags[1]) or 0, tonumber(tags[2]) or 0
  end
  local start = lane.clock
  if not front then
    start = math.max(start, lane.finish)
    lane.finish = start + tonumber(cost)
  end
  local member = tenant .. '|' .. attempt .. '|' .. jobId
  rcall('ZADD', lane.jobs, -start, member)
  lane.waiting = true
  return 'w:' .. member
end
