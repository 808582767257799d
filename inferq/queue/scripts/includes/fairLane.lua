--[[
  Fair share inside a lane (G10, inferq/queue/fairshare.py): a lane as the fair-share includes take it: its stream
  and, from KEYS[first..first+1] (keys.fair_lane, after the stream), its waiting jobs (sorted set, members
  <tenant>|<attempt>|<job id>, scored by minus each job's virtual start tag: new jobs mostly have the highest tags,
  and a small sorted set, kept as one packed list, inserts at its head cheaply) and its tags (hash: tenant -> the
  virtual finish tag of its last job placed; :clock -> the lane's virtual time, the start tag of the last job
  admitted).
  What one script call learns about the lane is kept in the table, so a call that places many jobs reads it once
  and writes the tags once (fairFlush).
]]
local function fairLane(streamKey, first)
  return {stream = streamKey, jobs = KEYS[first], tags = KEYS[first + 1]}
end
