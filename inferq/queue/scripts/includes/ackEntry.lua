--[[
  Acknowledge a stream entry and delete it, so XLEN(stream) is always exactly lag + pending.
  Returns how many entries the XACK acknowledged: 0 when a resent call already did it.
]]
local function ackEntry(streamKey, entryId)
  local acked = rcall('XACK', streamKey, GROUP, entryId)
  rcall('XDEL', streamKey, entryId)
  return acked
end
