--[[
  Acknowledge a stream entry and delete it, so XLEN(stream) is always exactly lag + pending.
]]
local function ackEntry(streamKey, entryId)
  rcall('XACK', streamKey, 'workers', entryId)
  rcall('XDEL', streamKey, entryId)
end
