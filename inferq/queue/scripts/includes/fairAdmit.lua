--[[
  Admit up to n of a lane's waiting jobs into its stream, lowest virtual start tag first (requires fairLane; a job's
  tag is set when it is placed: fairPlace), and move the lane's virtual time to the last one's tag. An admitted
  entry is the job's live entry while the job's record still says waiting (admission cannot know a record's key in
  advance; a job that waits has no other entry): start.lua records it on the job.
  Returns the number of jobs admitted.
]]
local function fairAdmit(lane, n)
  if n <= 0 then
    return 0
  end
  local popped = rcall('ZPOPMAX', lane.jobs, n)
  if not popped[1] then
    return 0
  end
  for i = 1, #popped, 2 do
    local member = popped[i]
    local a = string.find(member, '|', 1, true)
    local b = string.find(member, '|', a + 1, true)
    rcall('XADD', lane.stream, '*', 'job', string.sub(member, b + 1), 'attempt', string.sub(member, a + 1, b - 1))
  end
  rcall('HSET', lane.tags, ':clock', -tonumber(popped[#popped]))
  return #popped / 2
end
