--[[
  A job's cost in its lane's virtual time (G10): its work (field work, estimated tokens; DEFAULT_WORK on a record
  made before fair share) over its tenant's weight (field weight; 1 when absent).
]]
local function fairCost(work, weight)
  return (tonumber(work) or DEFAULT_WORK) / (tonumber(weight) or 1)
end
