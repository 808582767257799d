--[[
  The stream of a job's lane, in a script that may touch any lane: such a script takes the three lane streams
  as KEYS[first..first+2], in LANE_KEYS order. A job's entries are always in its own lane's stream (field lane of
  the job record, which enqueue always writes).
]]
local function laneStream(first, lane)
  for i, name in ipairs(LANE_KEYS) do
    if name == lane then
      return KEYS[first + i - 1]
    end
  end
  return KEYS[first]
end
